"""Admission control and the access log: a bounded number of requests at work and in line; past
that, 503 at once; one JSON line per request.

Why: under more load than the process can serve, an unbounded line makes every answer slow (20-second
tails at 16 clients) and clients time out on work already done. Here at most ``max_in_flight``
requests run at once and at most ``max_queued`` wait; one more answers 503 ``overloaded`` with
``Retry-After``, costing the server nothing, so a load balancer or client can go elsewhere.
Health probes are never refused. Each answer carries ``Server-Timing`` (the time it waited in
line, the time it took), so a client sees where its latency went, and leaves one JSON line on the
``ragwarden.access`` logger: method, path (never the query string or a body), status, the same
timings. Who asked is in the audit receipt, not here.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import OverloadedError
from ..stages import measuring
from .balance import WorkerLoads
from .limits import CLIENT_CLOSED_STATUS, CLIENT_GONE

RETRY_AFTER_SECONDS = 1
access = logging.getLogger("ragwarden.access")


class Admission:
    """ASGI middleware over the HTTP routes (``exempt`` path prefixes pass straight through).

    ``streams``: path prefixes of sessions held in this process (MCP). A GET there opens a stream
    that waits for messages for as long as the client likes: it passes unadmitted, or a few open
    streams would hold every place at work. And no answer there closes its connection to even the
    workers' loads: the session would not follow the client to another worker."""

    def __init__(
        self, app: ASGIApp, *, max_in_flight: int, max_queued: int, exempt: tuple[str, ...] = (),
        streams: tuple[str, ...] = (), peers: WorkerLoads | None = None,
    ) -> None:  # fmt: skip
        self.app = app
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self.exempt = exempt
        self.streams = streams
        self.peers = peers  # the other workers of ``serve --workers N``, whose loads this one evens out
        self._slots: asyncio.Semaphore | None = None
        self._waiting = 0
        self.refused = 0  # for monitoring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.exempt) or self._listening(scope):
            await self.app(scope, receive, send)
            return
        if self._slots is None:  # made on the server's own event loop
            self._slots = asyncio.Semaphore(self.max_in_flight)
        arrived = time.perf_counter()
        if self._slots.locked() and self._waiting >= self.max_queued:
            self.refused += 1
            closing = self._closing(scope)
            await _overloaded(send, self.max_in_flight, self.max_queued, closing)
            _log(scope, {"status": OverloadedError.status, "rebalanced": bool(closing)}, arrived, arrived, {})
            return
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        started = time.perf_counter()
        answer: dict[str, object] = {"status": None, "rebalanced": False}  # None until the app starts one
        try:
            with measuring() as stages:
                closing = functools.partial(self._closing, scope)  # asked once the answer starts
                await self.app(scope, receive, _timed(send, arrived, started, stages, answer, closing))
        finally:
            self._slots.release()
            _log(scope, answer, arrived, started, stages)

    def _listening(self, scope: Scope) -> bool:
        return scope.get("method") == "GET" and scope["path"].startswith(self.streams)

    def _closing(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        """``Connection: close`` when this worker serves more connections than its peers
        (``balance``), else nothing."""
        client = scope.get("client")
        if self.peers is None or client is None or scope["path"].startswith(self.streams):
            return []
        return [(b"connection", b"close")] if self.peers.answering(tuple(client)) else []


def _log(scope: Scope, answer: dict[str, object], arrived: float, started: float, stages: dict[str, float]) -> None:
    status = answer["status"]
    if status is None:  # no answer started: the client hung up before its request ran, or the app failed
        status = CLIENT_CLOSED_STATUS if scope.get("state", {}).get(CLIENT_GONE) else 500
    line = {
        "method": scope.get("method"),
        "path": scope.get("path"),
        "status": status,
        **({"rebalanced": True} if answer["rebalanced"] else {}),  # closed to even the workers' loads
        "queue_ms": round((started - arrived) * 1000, 1),
        "app_ms": round((time.perf_counter() - started) * 1000, 1),
        **{f"{name}_ms": round(ms, 1) for name, ms in stages.items()},
    }
    access.info(json.dumps(line, separators=(",", ":")))


def _timed(
    send: Send, arrived: float, started: float, stages: dict[str, float], answer: dict[str, object],
    closing: Callable[[], list[tuple[bytes, bytes]]],
) -> Send:  # fmt: skip
    """``send`` adding ``Server-Timing`` to the response's headers (milliseconds in line, at work,
    and in each stage measured: embed, rank, check, receipt), and ``closing()``'s headers, and
    noting in ``answer`` its status and whether it closes the connection."""

    async def timed(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = int(message["status"])
            now = time.perf_counter()
            parts = [f"queue;dur={(started - arrived) * 1000:.1f}", f"app;dur={(now - started) * 1000:.1f}"]
            value = ", ".join([*parts, *(f"{name};dur={ms:.1f}" for name, ms in stages.items())])
            closes = closing()
            answer["rebalanced"] = bool(closes)
            message = {**message, "headers": [*message.get("headers", []), (b"server-timing", value.encode()), *closes]}
        await send(message)

    return timed


async def _overloaded(send: Send, in_flight: int, queued: int, extra: list[tuple[bytes, bytes]]) -> None:
    message = (f"the service is at capacity ({in_flight} requests at work, {queued} waiting); "
               f"retry in {RETRY_AFTER_SECONDS} s or on another replica")  # fmt: skip
    body = json.dumps({"error": {"code": OverloadedError.code, "message": message}}).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"retry-after", str(RETRY_AFTER_SECONDS).encode()), *extra]  # fmt: skip
    await send({"type": "http.response.start", "status": OverloadedError.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
