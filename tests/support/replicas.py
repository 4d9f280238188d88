"""Server replicas as real processes (`ragwarden serve`) on 127.0.0.1, started and stopped by tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from support.identity_provider import AUDIENCE, ISSUER, JWT_SECRET

from ragwarden.bench.serve import wait_until_serving

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
    cli: Path = CLI  # another release's `ragwarden`, for a mixed-version test

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0, *, ready: bool = True) -> None:
        """Start it and wait until ``/readyz`` answers 200 (``ready``), or only ``/healthz``."""
        self.starts += 1
        log = self.log_dir / f"replica-{self.port}-{self.starts}.log"
        command = [str(self.cli), "serve", "--host", "127.0.0.1", "--port", str(self.port), "--warehouse", self.warehouse,
                   *self.args]  # fmt: skip
        with log.open("wb") as output:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(command, env={**os.environ, **self.env}, stdout=output, stderr=subprocess.STDOUT)
        wait_until_serving(self.process, f"{self.url}/{'readyz' if ready else 'healthz'}", log=log, timeout=timeout, every=0.2)

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


def replica_env(onnx_worker_env: dict[str, str]) -> dict[str, str]:
    """What a replica of the tests runs with: the test identity provider's settings, no policy file."""
    return onnx_worker_env | {
        "HF_HUB_OFFLINE": "1",
        "RAGWARDEN_JWT_SECRET": JWT_SECRET.decode(),
        "RAGWARDEN_JWT_ISSUER": ISSUER,
        "RAGWARDEN_JWT_AUDIENCE": AUDIENCE,
        "RAGWARDEN_POLICY": "",
    }


def ready_within(url: str, seconds: float) -> httpx.Response:
    """``/readyz`` of the service at ``url``, asked until it answers 200 or ``seconds`` pass: the last answer."""
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=10) as client:
        while True:
            answer = client.get(f"{url}/readyz")
            if answer.status_code == 200 or time.monotonic() > deadline:
                return answer
            time.sleep(0.1)


class Balancer:
    """Requests sent as a load balancer sends them: to each replica of an order in turn until one
    answers. A connection that fails on a replica being stopped or drained (its port in
    ``stopping`` when the request went out or when it failed) moves on to the next replica; any
    other failure, an answer other than 200, or a request no replica took is one of ``failures``.

    A client loop sends ``while balancer.going()``: a request every ``PAUSE_S`` or so (up to 20 a
    second), until ``done`` is set. Requests keep arriving through every stop and start (a replica
    takes about 3 s to start), and the cores stay free for the replicas' starts and the rest of the
    suite: with no pause, one loop kept two cores busy."""

    PAUSE_S = 0.05

    def __init__(self) -> None:
        self.stopping: set[int] = set()
        self.failures: list[str] = []
        self.attempts = 0  # requests sent, the ones a stopping replica dropped included
        self.retried = 0  # requests a stopping replica dropped, sent on to the next
        self.done = threading.Event()

    def going(self) -> bool:
        """Whether a client loop sends its next request: after the pause, unless ``done``."""
        return not self.done.wait(self.PAUSE_S)

    def send(self, order: Iterable[Replica], request: Callable[[Replica], httpx.Response],
             what: str) -> tuple[Replica, httpx.Response] | None:  # fmt: skip
        """The replica that answered ``request`` with 200, and its answer; None once a failure
        (named by ``what``) is recorded."""
        for replica in order:
            was_stopping = replica.port in self.stopping
            self.attempts += 1
            try:
                response = request(replica)
            except httpx.TransportError as exc:
                if was_stopping or replica.port in self.stopping:
                    self.retried += 1
                    continue
                self.failures.append(f"{what} to live replica {replica.port}: {exc!r}")
                return None
            if response.status_code != 200:
                self.failures.append(f"{what} to {replica.port}: {response.status_code} {response.text[:200]}")
                return None
            return replica, response
        self.failures.append(f"{what}: every replica refused it")
        return None
