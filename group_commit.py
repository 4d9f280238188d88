"""Group commit: many threads hand items to one commit at a time, which takes them in batches and
answers each caller once its item is durable.

Why: an audit receipt per search, each its own commit, makes concurrent searches race for the
chain's next ``seq`` (only one wins a round; each loser still commits a version). Group commit
turns N concurrent receipts into one commit: the batch is whatever arrived while the last commit
was in flight (at most ``max_batch``), so a lone caller pays one commit and a busy process pays
one commit per batch. ``submit`` returns only when the commit holding the item is done, so no
caller goes on (no search answers) before its receipt is written.

The commit runs on a caller's own thread (the leader: the one that found no commit in flight, or
was handed the lead by the one before), not on a thread of its own: under load every hand-off
between threads waits for the interpreter lock, and a leader already holds it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

I = TypeVar("I")  # noqa: E741 - an item
R = TypeVar("R")


@dataclass(kw_only=True)
class _Slot(Generic[I]):
    """One caller's item, and what became of it."""

    item: I
    lead: bool = False
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    woken: threading.Event = field(default_factory=threading.Event)


class GroupCommit(Generic[I, R]):
    """``submit(item)`` blocks until ``commit`` (called with a batch of items, in arrival order, one
    batch at a time) has returned, and gives back that item's result, or raises its exception."""

    def __init__(
        self, commit: Callable[[Sequence[I]], Sequence[R]], *, max_batch: int = 256, name: str = "appender"
    ) -> None:
        self._commit = commit
        self._max_batch = max_batch
        self._name = name
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._pending: list[_Slot[I]] = []
        self._committing = False
        self.batches = 0  # commits made (for monitoring: items per commit)
        self.items = 0

    def submit(self, item: I) -> R:
        slot: _Slot[I] = _Slot(item=item)
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's commit in flight is not its own
                self._pid, self._pending, self._committing = os.getpid(), [], False
            self._pending.append(slot)
            if not self._committing:
                self._committing = slot.lead = True
        if not slot.lead:
            slot.woken.wait()
        if slot.lead:
            self._lead()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[no-any-return]

    def _lead(self) -> None:
        """Commit the oldest waiting items (this caller's among them), answer them, and hand the
        lead to the oldest item still waiting, if any."""
        with self._lock:
            batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
        try:
            results = self._commit([slot.item for slot in batch])
        except BaseException as exc:  # every caller of the batch gets the failure, none a result
            for slot in batch:
                slot.error = exc
        else:
            self.batches += 1
            self.items += len(batch)
            for slot, result in zip(batch, results, strict=True):
                slot.result = result
        with self._lock:
            successor = self._pending[0] if self._pending else None
            if successor is not None:
                successor.lead = True
            else:
                self._committing = False
        for slot in batch:
            slot.done = True
            slot.lead = False
            slot.woken.set()
        if successor is not None:
            successor.woken.set()
