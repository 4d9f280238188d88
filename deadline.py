"""A request's deadline, and its turns: the work of a search checks its deadline between steps and
stops once it has passed or the request was called off (its HTTP client went away), and at each
check gives the requests beside it their turn, so no request holds a place at work, or the
interpreter, past its budget or its share.

The check is cooperative: it runs between steps (each condition of a filter as it is compiled and
as it is evaluated, each ranking, each block of the post-check), never inside a call into Lance or
numpy, so a request stops within one step of its deadline. Each check is also where a request lets
the others run: it gives up the interpreter lock (one lock per process: threads take turns at it),
so a request of many steps (a filter of 256 conditions) takes turns with the requests beside it at
every step rather than once per switch interval, and while a request of a caller whose requests
cost less than half as much is at work (``Deadline.behind``, from admission's running costs), it
waits ``PAUSE_SECONDS`` at each check instead (what that buys another caller beside the most
expensive searches: ``bench/stall.py``, figures in ``docs/performance.md``). Outside a bounded
request, a check costs one context lookup.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import TypeVar

from .errors import DeadlineExceededError

_CURRENT: ContextVar[Deadline | None] = ContextVar("ragwarden_deadline", default=None)
T = TypeVar("T")
PAUSE_SECONDS = 0.001
"""How long a request of a costlier caller waits at each check while a cheaper caller's is at work."""


class Deadline:
    """When one request's work must stop (``seconds`` from now), and whether it was called off;
    ``behind()``: whether a cheaper caller's request is at work (this one then pauses at each check)."""

    def __init__(self, seconds: float, behind: Callable[[], bool] | None = None) -> None:
        self.seconds = seconds
        self.behind = behind
        self.ends = time.monotonic() + seconds
        self._called_off = threading.Event()
        self._why = ""

    def call_off(self, why: str) -> None:
        """Stop the work at its next check (from any thread: the event loop that saw the client go)."""
        self._why = why
        self._called_off.set()

    @property
    def called_off(self) -> bool:
        return self._called_off.is_set()

    def check(self) -> None:
        """Raise ``DeadlineExceededError`` if the work must stop."""
        if self._called_off.is_set():
            raise DeadlineExceededError(f"the request was stopped: {self._why}")
        if time.monotonic() > self.ends:
            raise DeadlineExceededError(
                f"the search worked past its deadline of {self.seconds:g} s and was stopped (setting "
                "search_deadline_seconds); narrow it (a smaller filter or k) or retry later"
            )


@contextlib.contextmanager
def bounded(seconds: float, deadline: Deadline | None = None) -> Iterator[Deadline]:
    """Run the block under ``deadline`` (a new one of ``seconds`` when not given), unless one is
    already in force (a request's, set by the HTTP layer): the outer one stands."""
    held = _CURRENT.get()
    if held is not None:
        yield held
        return
    current = deadline or Deadline(seconds)
    token = _CURRENT.set(current)
    try:
        yield current
    finally:
        _CURRENT.reset(token)


def remaining_seconds() -> float | None:
    """How long the current request may still work (None outside a bounded request): for a wait."""
    current = _CURRENT.get()
    return None if current is None else max(0.0, current.ends - time.monotonic())


def check_deadline() -> None:
    """Raise ``DeadlineExceededError`` if the current request's work must stop (else nothing)."""
    current = _CURRENT.get()
    if current is not None:
        current.check()
        _turn(current)


def _turn(current: Deadline) -> None:
    """The interpreter lock, given up: the requests beside it take their turn (a longer one while a
    cheaper caller's request is at work)."""
    time.sleep(PAUSE_SECONDS if current.behind is not None and current.behind() else 0)


def in_turns(items: Iterable[T], every: int = 16) -> Iterator[T]:
    """``items``, giving the requests beside it a turn every ``every`` of them (never stopping: for
    a loop that builds an answer whose receipt is written already)."""
    current = _CURRENT.get()
    for index, item in enumerate(items):
        if current is not None and index % every == 0:
            _turn(current)
        yield item
