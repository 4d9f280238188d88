"""A real OpenLineage HTTP endpoint for the lineage tests, on 127.0.0.1.

``mode`` says how it answers a POST: ``up`` records the event and answers 201, ``503`` answers
Service Unavailable, ``400`` refuses the event's content, ``slow`` holds the request open for
``delay`` seconds (or until stopped) and records nothing. It runs in a thread until ``stop()``.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from support.loopback_http import LoopbackHTTPServer


def closed_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago and now has nobody listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Receiver:
    def __init__(self, port: int = 0, *, mode: str = "up", delay: float = 10.0) -> None:
        self.mode = mode
        self.delay = delay
        self.events: list[dict[str, Any]] = []
        self.posts = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._http = LoopbackHTTPServer(self._handler(), port)

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def url(self) -> str:
        return self._http.url

    def stop(self) -> None:
        self._stopping.set()
        self._http.stop()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.posts += 1
                if receiver.mode == "slow":
                    receiver._stopping.wait(receiver.delay)
                    self._answer(504)
                elif receiver.mode in ("503", "400"):
                    self._answer(int(receiver.mode))
                else:
                    with receiver._lock:
                        receiver.events.append(json.loads(body))
                    self._answer(201)

            def _answer(self, status: int) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:  # the client gave up waiting: nothing to answer
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
