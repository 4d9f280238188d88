"""Even load across the processes of ``serve --workers N``.

Why: the workers share one listening socket, and a client keeps its connection for request after
request. Whichever worker wakes first accepts a burst of new connections, so 64 clients arriving
at once split 42 to 22 (seen with two workers): the busy worker answers at half the other's pace
while the other idles, and its queue sets the service's tail. Here each worker publishes how many
connections brought it a request in the last second, in a small file every worker maps, at each
answer and a few times a second besides. A worker that serves more than the least loaded of the
others, by a margin, answers with ``Connection: close``; the client dials again, and the idle
worker, blocked in ``accept`` while the busy one works, is the likelier to take it. The split
converges in a few answers and stays within the margin, and a client sees no error, only a new
connection (a tenth of a millisecond on a local network).

The file holds one slot per worker: its process id, its load and when it last published (the
system-wide monotonic clock), each written only by its owner (aligned 8-byte stores, so a reader
sees one value or the other, never half of each). A slot not published for ``STALE_WINDOWS``
windows belongs to a worker that is gone (killed, or its pid since reused by another process): it
is no peer, and the next worker to start claims it, under a lock on the file.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import mmap
import os
import tempfile
import time
from collections.abc import Callable, Hashable
from pathlib import Path

import numpy as np

SLOTS = 64  # the most workers ``serve`` starts
STALE_WINDOWS = 3  # a slot not published for this many windows is a worker that is gone
_FIELDS = 3  # process id, connections served in the window, when published (microseconds)
log = logging.getLogger(__name__)


def create_loads_file(folder: str | None = None) -> Path:
    """A zeroed file of slots for the workers of one ``serve`` (the caller removes it when done)."""
    descriptor, name = tempfile.mkstemp(prefix="ragwarden-workers-", suffix=".loads", dir=folder)
    with os.fdopen(descriptor, "wb") as file:
        file.write(bytes(SLOTS * _FIELDS * 8))
    return Path(name)


def worker_loads(path: str | None) -> WorkerLoads | None:
    """This worker's view of the loads file at ``path``; None, with a warning, where there is none
    to be had (the worker then serves unbalanced rather than not at all)."""
    if not path:
        return None
    try:
        return WorkerLoads(Path(path))
    except (OSError, ValueError) as exc:
        log.warning("serving without balancing the workers' loads: the loads file %s cannot be mapped (%s)", path, exc)
        return None


class WorkerLoads:
    """This worker's slot in a loads file, and the others' loads beside it. A worker's load is the
    number of its connections that brought a request in the last ``window`` seconds (an idle
    kept-alive connection costs nothing, and a connection's requests come one at a time)."""

    def __init__(
        self, path: Path, *, margin: int = 2, window: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.margin = margin
        self.window = window
        self.clock = clock  # seconds; the same in every process (the default, CLOCK_MONOTONIC, is)
        self.slot: int | None = None
        self.closed = 0  # connections closed to even the load, for monitoring
        self._warned = False
        self._active: dict[Hashable, float] = {}  # connection -> when it last brought a request, oldest first
        self._fd = os.open(path, os.O_RDWR)  # held for the claim's lock: the path may be removed meanwhile
        self._slots = np.frombuffer(mmap.mmap(self._fd, SLOTS * _FIELDS * 8), dtype=np.int64).reshape(SLOTS, _FIELDS)

    def claim(self) -> None:
        """Take a free slot (never used, given back, or gone stale) for this process, once it serves."""
        if self.slot is not None:
            return
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            now = self._stamp()
            for slot, (pid, _, stamp) in enumerate(self._slots.tolist()):
                if pid == 0 or self._stale(stamp, now):
                    self._slots[slot] = (os.getpid(), 0, now)
                    self.slot = slot
                    return
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        if not self._warned:
            self._warned = True
            log.warning("all %d worker slots of %s are taken: this worker serves unbalanced until one frees", SLOTS, self.path)

    def release(self) -> None:
        """Give the slot back (on shutdown), so the others stop counting this worker."""
        if self.slot is not None:
            self._slots[self.slot] = (0, 0, 0)
            self.slot = None

    def answering(self, connection: Hashable) -> bool:
        """Note an answer on ``connection`` (the client's address and port), and whether it should
        close the connection: this worker serves more connections than the least loaded other by
        more than the margin (an eighth of its own, at least ``margin``)."""
        if self.slot is None:
            return False
        self._active.pop(connection, None)
        self._active[connection] = self.clock()
        mine = self.publish()
        now = self._stamp()
        others = [load for slot, (pid, load, stamp) in enumerate(self._slots.tolist())
                  if pid and slot != self.slot and not self._stale(stamp, now)]  # fmt: skip
        if not others or mine - min(others) <= max(self.margin, mine // 8):
            return False
        del self._active[connection]
        self.closed += 1
        self.publish()
        return True

    def publish(self) -> int:
        """Drop connections quiet for the window, and publish how many are left, and when."""
        if self.slot is None:
            return 0
        horizon = self.clock() - self.window
        while self._active and next(iter(self._active.values())) < horizon:
            del self._active[next(iter(self._active))]
        self._slots[self.slot, 1] = len(self._active)
        self._slots[self.slot, 2] = self._stamp()
        return len(self._active)

    async def keep_published(self) -> None:
        """Publish a few times a window until cancelled, so that an idle worker's load reads as
        current (and low) rather than as what it was at its last answer."""
        while True:
            if self.slot is None:
                self.claim()
            self.publish()
            await asyncio.sleep(self.window / 4)

    def _stamp(self) -> int:
        return int(self.clock() * 1_000_000)

    def _stale(self, stamp: int, now: int) -> bool:
        return now - stamp > STALE_WINDOWS * self.window * 1_000_000
