"""Admission control and the access log: a bounded number of requests at work and in line, shared
fairly among callers; past that, 503 at once; one JSON line per request.

Why: under more load than the process can serve, an unbounded line makes every answer slow (20-second
tails at 16 clients) and clients time out on work already done. Here at most ``max_in_flight``
requests run at once and at most ``max_queued`` wait; one more answers 503 ``overloaded`` with
``Retry-After``, costing the server nothing, so a load balancer or client can go elsewhere.

Fair per caller (``FairSlots``): a caller holds at most its share of the places at work and of the
line, and the line is served caller by caller, so one caller sending many expensive requests at
once waits behind its own requests, never in front of anyone else's. Shares are of time at work:
beside the other callers active in the last ``ACTIVE_SECONDS``, a caller's part of the places is in
proportion to how little its requests have been costing (the work a search did, ``COST``, else its
time at work), so a caller of 300 ms requests holds one place beside a caller of 6 ms ones, and two
callers alike hold half each (with one interpreter lock per process, what a request at work takes
from the others is time, not a place). Places beyond a caller's share are lent while no one else
waits, keeping one free for each other active caller, so none sits idle while requests wait. Who
a caller is comes from its credential, without I/O (``callers``).

Health probes are never refused. The time a request waited and worked, its stages and its work
(``stages``) go to the ``ragwarden.access`` logger, one JSON line per request: method, path
(never the query string or a body), status, timings, counts. Who asked is in the audit receipt, not
here. Answers carry ``Server-Timing`` only where the operator turned it on (``server_timing``):
stage times are for operators, and a caller could read in them the work its request did.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import logging
import math
import time
from collections.abc import Callable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import OverloadedError, RagwardenError
from ..stages import Measurement, measuring
from .balance import WorkerLoads
from .limits import CLIENT_CLOSED_STATUS, CLIENT_GONE

RETRY_AFTER_SECONDS = 1
BEHIND = "ragwarden.behind"  # a request's state: whether a cheaper caller's request is at work
COST = "ragwarden.cost"  # a request's state: the seconds of work it did (else its time at work counts)
ACTIVE_SECONDS = 1.0
"""A caller counts among those sharing the places at work while it has a request at work or in
line, and for this long after its last one arrived or finished."""
COST_MEMORY = 0.3
"""The weight of a request's time at work in its caller's running cost (the rest: the requests before)."""
CHEAPEST_COST = 0.001
"""Seconds a request is taken to cost at the least (a caller's part of the places stays finite)."""
access = logging.getLogger("ragwarden.access")


class _Refused(Exception):
    """A request's place in line was given to another caller's (its caller held more than its share)."""


class FairSlots:
    """Places at work and in line, shared among callers (one event loop's; not thread-safe).

    ``admit(caller)`` answers None (work now), a future that resolves when a place is the
    caller's, or raises ``_Refused`` (the line is full and the caller holds its share of it);
    ``release(caller, seconds)`` frees a place, counting the seconds its request worked into the
    caller's running cost. A caller never holds more than ``share(caller)`` places at work; when a
    place frees, the callers with requests in line are served in turn, the one served least
    recently first. A newcomer to a
    full line takes the last place of the caller holding the most beyond its share, if one does
    (that request is refused instead)."""

    def __init__(self, slots: int, queued: int) -> None:
        self.slots = slots
        self.queued = queued
        self.busy = 0
        self.waiting = 0
        self._working: collections.Counter[str] = collections.Counter()
        self._lines: dict[str, collections.deque[asyncio.Future[None]]] = {}
        self._seen: dict[str, float] = {}
        self._served: dict[str, int] = {}  # when each caller last took a place (a count of places taken)
        self._cost: dict[str, float] = {}  # each caller's running cost: seconds at work per request
        self._taken = 0

    def active(self) -> int:
        """Callers sharing the places now (at least one)."""
        now = time.monotonic()
        for caller, seen in list(self._seen.items()):
            if now - seen > ACTIVE_SECONDS and not self._working[caller] and not self._lines.get(caller):
                del self._seen[caller]
                self._working.pop(caller, None)
                self._served.pop(caller, None)
                self._cost.pop(caller, None)
        return max(1, len(self._seen))

    def share(self, caller: str) -> int:
        """Places at work ``caller`` may hold: every one alone; beside others, its part of them in
        proportion to how little its requests cost (a caller not yet measured counts as the
        costliest), one at the least."""
        if self.active() == 1:
            return self.slots
        known = [self._cost[name] for name in self._seen if name in self._cost]
        unmeasured = max(known, default=CHEAPEST_COST)
        weights = {name: 1.0 / self._cost.get(name, unmeasured) for name in self._seen}
        return max(1, math.floor(self.slots * weights.get(caller, 1.0 / unmeasured) / sum(weights.values())))

    def may_start(self, caller: str) -> bool:
        """Whether a request of ``caller`` may start now: within its share; or beyond it, when no
        active caller's requests cost less than half what its own do (a costlier caller keeps to its
        share: the time it would take is the others'), into a place no other caller waits for,
        leaving one free for each other active caller with nothing at work (a caller coming back
        starts at once)."""
        if self.busy >= self.slots:
            return False
        if self._working[caller] < self.share(caller):
            return True
        if self._cheaper(caller, list(self._seen)) or any(line for other, line in self._lines.items() if other != caller):
            return False
        idle = sum(1 for other in self._seen if other != caller and not self._working[other])
        return self.busy < self.slots - idle

    def admit(self, caller: str) -> asyncio.Future[None] | None:
        self._seen[caller] = time.monotonic()
        if not self._lines.get(caller) and self.may_start(caller):
            self._take(caller)
            return None
        line = self._lines.get(caller)
        if self.waiting >= self.queued:
            if line or not self._give_up_a_place(caller):
                raise _Refused
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lines.setdefault(caller, collections.deque()).append(future)
        self.waiting += 1
        return future

    def leave(self, caller: str, future: asyncio.Future[None]) -> None:
        """A request that stopped waiting (its client went, or it was cancelled): its place in line
        is freed, or, if a place at work was already its, that place."""
        if future.done() and not future.cancelled() and future.exception() is None:
            self.release(caller, None)
            return
        line = self._lines.get(caller)
        if line is not None and future in line:
            line.remove(future)
            self.waiting -= 1
            self._forget_line(caller)

    def release(self, caller: str, seconds: float | None) -> None:
        """Free ``caller``'s place; ``seconds``: how long its request worked (None: it never ran)."""
        self.busy -= 1
        self._working[caller] -= 1
        self._seen[caller] = time.monotonic()
        if seconds is not None:
            cost = max(CHEAPEST_COST, seconds)
            held = self._cost.get(caller)
            self._cost[caller] = cost if held is None else (1 - COST_MEMORY) * held + COST_MEMORY * cost
        self._dispatch()

    def cheaper_at_work(self, caller: str) -> bool:
        """Whether a caller whose requests cost less than half what ``caller``'s do has one at work
        (read from a request's own thread: a stale answer only shifts a pause)."""
        return self._cheaper(caller, [other for other, n in list(self._working.items()) if n])

    def _cheaper(self, caller: str, others: list[str]) -> bool:
        """Whether one of ``others`` costs less than half what ``caller`` does."""
        cost = self._cost.get(caller)
        return cost is not None and any(other != caller and self._cost.get(other, cost) < cost / 2 for other in others)

    def _take(self, caller: str) -> None:
        self.busy += 1
        self._working[caller] += 1
        self._taken += 1
        self._served[caller] = self._taken

    def _dispatch(self) -> None:
        while self.busy < self.slots:
            eligible = [caller for caller in self._lines if self._working[caller] < self.share(caller)]
            eligible = eligible or [caller for caller in self._lines if self.may_start(caller)]
            if not eligible:
                return
            caller = min(eligible, key=lambda name: self._served.get(name, 0))
            future = self._lines[caller].popleft()
            self.waiting -= 1
            self._forget_line(caller)
            if not future.done():  # else cancelled while it waited: ``leave`` finds it gone
                self._take(caller)
                future.set_result(None)

    def _give_up_a_place(self, newcomer: str) -> bool:
        """Refuse the last request in line of the caller holding the most places beyond its share
        of the line, so that ``newcomer`` (who holds none) may wait; False if no caller does."""
        share = max(1, math.ceil(self.queued / self.active()))
        caller, line = max(self._lines.items(), key=lambda item: len(item[1]), default=(None, None))
        if caller is None or line is None or caller == newcomer or len(line) <= share:
            return False
        future = line.pop()
        self.waiting -= 1
        self._forget_line(caller)
        if not future.done():
            future.set_exception(_Refused())
        return True

    def _forget_line(self, caller: str) -> None:
        if not self._lines.get(caller):
            self._lines.pop(caller, None)


class Admission:
    """ASGI middleware over the HTTP routes (``exempt`` path prefixes pass straight through).

    ``caller_of(scope)`` names the caller a request is admitted as (``FairSlots``).
    ``streams``: path prefixes of sessions held in this process (MCP). A GET there opens a stream
    that waits for messages for as long as the client likes: it passes unadmitted, or a few open
    streams would hold every place at work. And no answer there closes its connection to even the
    workers' loads: the session would not follow the client to another worker.
    ``server_timing``: answers carry ``Server-Timing`` (an operator's switch, off by default).
    ``on_stages``: told each admitted request's stage times, in milliseconds by stage (``queue``,
    ``app`` and those measured within: embed, rank, check, receipt), as its answer starts (metrics)."""

    def __init__(
        self, app: ASGIApp, *, max_in_flight: int, max_queued: int, exempt: tuple[str, ...] = (),
        streams: tuple[str, ...] = (), peers: WorkerLoads | None = None,
        caller_of: Callable[[Scope], str] = lambda scope: "", server_timing: bool = False,
        on_stages: Callable[[Mapping[str, float]], None] | None = None,
    ) -> None:  # fmt: skip
        self.app = app
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self.exempt = exempt
        self.streams = streams
        self.peers = peers  # the other workers of ``serve --workers N``, whose loads this one evens out
        self.caller_of = caller_of
        self.server_timing = server_timing
        self.on_stages = on_stages
        self.slots = FairSlots(max_in_flight, max_queued)
        self.refused = 0  # for monitoring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.exempt) or self._listening(scope):
            await self.app(scope, receive, send)
            return
        arrived = time.perf_counter()
        try:
            caller = self.caller_of(scope)
        except RagwardenError as exc:  # a request admission cannot name (two credentials): refused at once
            await _refuse(send, exc.status, exc.code, str(exc), [])
            _log(scope, {"status": exc.status, "rebalanced": False}, arrived, arrived, Measurement())
            return
        try:
            waiting = self.slots.admit(caller)
            if waiting is not None:
                try:
                    await waiting
                except asyncio.CancelledError:
                    self.slots.leave(caller, waiting)
                    raise
        except _Refused:
            self.refused += 1
            closing = self._closing(scope)
            await _overloaded(send, self.max_in_flight, self.max_queued, closing)
            refusal = {"status": OverloadedError.status, "rebalanced": bool(closing)}
            _log(scope, refusal, arrived, arrived, Measurement())
            return
        started = time.perf_counter()
        scope.setdefault("state", {})[BEHIND] = functools.partial(self.slots.cheaper_at_work, caller)
        answer: dict[str, object] = {"status": None, "rebalanced": False}  # None until the app starts one
        measurement = Measurement()
        try:
            with measuring() as measurement:
                closing = functools.partial(self._closing, scope)  # asked once the answer starts
                timed = _timed(send, arrived, started, measurement, answer, closing, self.server_timing, self.on_stages)
                await self.app(scope, receive, timed)
        finally:
            worked = scope.get("state", {}).get(COST, time.perf_counter() - started)
            self.slots.release(caller, worked)
            _log(scope, answer, arrived, started, measurement)

    def _listening(self, scope: Scope) -> bool:
        return scope.get("method") == "GET" and scope["path"].startswith(self.streams)

    def _closing(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        """``Connection: close`` when this worker serves more connections than its peers
        (``balance``), else nothing."""
        client = scope.get("client")
        if self.peers is None or client is None or scope["path"].startswith(self.streams):
            return []
        return [(b"connection", b"close")] if self.peers.answering(tuple(client)) else []


def _log(scope: Scope, answer: dict[str, object], arrived: float, started: float, measurement: Measurement) -> None:
    status = answer["status"]
    if scope.get("state", {}).get(CLIENT_GONE):  # the client hung up: in line, or while its request ran
        status = CLIENT_CLOSED_STATUS
    elif status is None:  # no answer started: the app failed
        status = 500
    line = {
        "method": scope.get("method"),
        "path": scope.get("path"),
        "status": status,
        **({"rebalanced": True} if answer["rebalanced"] else {}),  # closed to even the workers' loads
        "queue_ms": round((started - arrived) * 1000, 1),
        "app_ms": round((time.perf_counter() - started) * 1000, 1),
        **{f"{name}_ms": round(ms, 1) for name, ms in measurement.stages.items()},
        **({"work": dict(measurement.work)} if measurement.work else {}),
    }
    access.info(json.dumps(line, separators=(",", ":")))


def _timed(
    send: Send, arrived: float, started: float, measurement: Measurement, answer: dict[str, object],
    closing: Callable[[], list[tuple[bytes, bytes]]], server_timing: bool,
    on_stages: Callable[[Mapping[str, float]], None] | None = None,
) -> Send:  # fmt: skip
    """``send`` noting in ``answer`` its status and whether it closes the connection, adding
    ``closing()``'s headers and, where the operator asked for it, ``Server-Timing`` (milliseconds
    in line, at work, and in each stage measured: embed, rank, check, receipt); ``on_stages`` is
    told the same times."""

    async def timed(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = int(message["status"])
            headers = [*message.get("headers", [])]
            if server_timing or on_stages is not None:
                now = time.perf_counter()
                stages = {"queue": (started - arrived) * 1000, "app": (now - started) * 1000, **measurement.stages}
                if on_stages is not None:
                    on_stages(stages)
                if server_timing:
                    value = ", ".join(f"{name};dur={ms:.1f}" for name, ms in stages.items())
                    headers.append((b"server-timing", value.encode()))
            closes = closing()
            answer["rebalanced"] = bool(closes)
            message = {**message, "headers": [*headers, *closes]}
        await send(message)

    return timed


async def _overloaded(send: Send, in_flight: int, queued: int, extra: list[tuple[bytes, bytes]]) -> None:
    message = (f"the service is at capacity ({in_flight} requests at work, {queued} waiting, shared among "
               f"callers); retry in {RETRY_AFTER_SECONDS} s or on another replica")  # fmt: skip
    retry = [(b"retry-after", str(RETRY_AFTER_SECONDS).encode())]
    await _refuse(send, OverloadedError.status, OverloadedError.code, message, [*retry, *extra])


async def _refuse(send: Send, status: int, code: str, message: str, extra: list[tuple[bytes, bytes]]) -> None:
    """Answer at once, in the shape of every error answer (``http_errors``)."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
