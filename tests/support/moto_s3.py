"""moto's S3 server (``moto_server``, from the package index) as a real process on 127.0.0.1: the
object store of the tests of warehouses on object storage. Its buckets are made, and its objects
read back, with boto3 over HTTP, as any S3 client would."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
from support.replicas import free_port

MOTO_SERVER = Path(sys.executable).with_name("moto_server")


@dataclass
class MotoS3:
    """One ``moto_server`` process; ``stop()`` ends it (and every object with it)."""

    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> MotoS3:
        command = [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(self.port)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self.process.returncode}")
            try:
                httpx.get(f"{self.endpoint}/moto-api/", timeout=1)
                return self
            except httpx.HTTPError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("moto_server did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def _client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip

    def create_bucket(self, name: str) -> None:
        self._client().create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key under ``prefix``."""
        pages = self._client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))

    def body(self, bucket: str, key: str) -> bytes:
        """The object's bytes; none (b"") for a key deleted since it was listed (a purge at work)."""
        client = self._client()
        try:
            return bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        except client.exceptions.NoSuchKey:
            return b""


@contextmanager
def s3_holding(bucket: str) -> Iterator[MotoS3]:
    """moto's S3 server on 127.0.0.1 holding ``bucket``, stopped when the block ends."""
    server = MotoS3().start()
    try:
        server.create_bucket(bucket)
        yield server
    finally:
        server.stop()
