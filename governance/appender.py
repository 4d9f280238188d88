"""Group commit: many threads hand items to one appender, which commits them in batches and
answers each caller once its item is durable.

Why: an audit receipt per search, each its own commit, makes concurrent searches race for the
chain's next ``seq`` (only one wins a round; each loser still commits a version). One appender per
process turns N concurrent receipts into one commit: the batch is whatever arrived while the last
commit was in flight (at most ``max_batch``), so a lone caller pays one commit and a busy process
pays one commit per batch. ``submit`` returns only when the commit holding the item is done, so no
caller goes on (no search answers) before its receipt is written.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741 - an item
R = TypeVar("R")


class GroupCommit(Generic[I, R]):
    """``submit(item)`` blocks until ``commit`` (called on the appender thread with a batch of items,
    in arrival order) has returned, and gives back that item's result, or raises its exception."""

    def __init__(self, commit: Callable[[Sequence[I]], Sequence[R]], *, max_batch: int = 256, name: str = "appender") -> None:
        self._commit = commit
        self._max_batch = max_batch
        self._name = name
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._queue: queue.SimpleQueue[tuple[I, Future[R]]] = queue.SimpleQueue()
        self.batches = 0  # commits made (for monitoring: items per commit)
        self.items = 0

    def submit(self, item: I) -> R:
        future: Future[R] = Future()
        self._started().put((item, future))
        return future.result()

    def _started(self) -> queue.SimpleQueue[tuple[I, Future[R]]]:
        """The queue of this process's appender, started on first use (a forked child starts its own)."""
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._queue = queue.SimpleQueue()
                threading.Thread(target=self._run, args=(self._queue,), name=self._name, daemon=True).start()
            return self._queue

    def _run(self, pending: queue.SimpleQueue[tuple[I, Future[R]]]) -> None:
        while True:
            batch = [pending.get()]
            while len(batch) < self._max_batch:
                try:
                    batch.append(pending.get_nowait())
                except queue.Empty:
                    break
            try:
                results = self._commit([item for item, _ in batch])
            except BaseException as exc:  # every caller of the batch gets the failure, none a result
                for _, future in batch:
                    future.set_exception(exc)
                continue
            self.batches += 1
            self.items += len(batch)
            for (_, future), result in zip(batch, results, strict=True):
                future.set_result(result)
