"""One freshness check per request: the versions of every table a read depends on, read together.

A search depends on five tables (``chunks``, ``policies``, ``acl_clauses``, ``labels``, and the
``directory`` of provisioned memberships); reading each one's latest version when it is first
needed cost a round trip each.
``Store.versions()`` reads all five at once (in parallel, so about one round trip on object storage)
and ``Store.pinned()`` holds them for the rest of one request.

Concurrent requests share a check (``SingleFlight``), but only one that *started after they
arrived*: a request never uses versions read before it began, so a revocation committed before a
request arrives is seen by that request, on every replica.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Versions:
    """The latest committed version of each table a read depends on, read at one moment."""

    chunks: int
    policies: int
    clauses: int
    labels: int
    directory: int


class SingleFlight(Generic[T]):
    """``get()`` returns the result of a ``read`` that began after the call did; callers arriving
    while a read is in flight wait for the next one, which serves all of them at once."""

    def __init__(self, read: Callable[[], T]) -> None:
        self._read = read
        self._cond = threading.Condition()
        self._arrivals = 0  # callers so far, numbered in arrival order
        self._served = 0  # the callers up to this number have a result
        self._running = False
        self._value: T | None = None
        self.reads = 0  # reads begun (for monitoring: calls per read)

    def get(self) -> T:
        with self._cond:
            self._arrivals += 1
            ticket = self._arrivals
            while True:
                if self._served >= ticket:
                    return self._value  # type: ignore[return-value]
                if not self._running:
                    self._running = True
                    covers = self._arrivals  # everyone who arrived before this read begins
                    self.reads += 1
                    break
                self._cond.wait()
        try:
            value = self._read()
        except BaseException:
            with self._cond:  # the waiters try again themselves: a failure is never shared
                self._running = False
                self._cond.notify_all()
            raise
        with self._cond:
            self._running = False
            self._value, self._served = value, covers
            self._cond.notify_all()
        return value
