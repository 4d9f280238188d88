"""Server replicas as real processes (`ragwarden serve`) on 127.0.0.1, started and stopped by tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

CLI = Path(sys.executable).parent / "ragwarden"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Replica:
    """One `ragwarden serve` process on a fixed loopback port, restartable."""

    warehouse: str
    env: dict[str, str]
    log_dir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    args: tuple[str, ...] = ()  # more `ragwarden serve` options, e.g. ("--workers", "2")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> None:
        self.starts += 1
        log = self.log_dir / f"replica-{self.port}-{self.starts}.log"
        command = [str(CLI), "serve", "--host", "127.0.0.1", "--port", str(self.port), "--warehouse", self.warehouse,
                   *self.args]  # fmt: skip
        with log.open("wb") as output:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(command, env={**os.environ, **self.env}, stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"replica on port {self.port} exited with {self.process.returncode}; see {log.name}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"replica on port {self.port} did not become ready in {timeout} s")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (graceful: in-flight requests finish), then wait for the exit."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
