"""Even load across the processes of ``serve --workers N``.

Why: the workers share one listening socket, and a client keeps its connection for request after
request. Whichever worker wakes first accepts a burst of new connections, so 64 clients arriving
at once split 42 to 22 (seen with two workers): the busy worker answers at half the other's pace
while the other idles, and its queue sets the service's tail. Here each worker publishes how many
connections brought it a request in the last second, in a small file every worker maps. A worker
that serves more than the least loaded of the others, by a margin, answers with
``Connection: close``; the client dials again, and the idle worker, blocked in ``accept`` while
the busy one works, is the likelier to take it. The split converges in a few answers and stays within the margin, and a
client sees no error, only a new connection (a tenth of a millisecond on a local network).

The file holds one slot per worker: its process id and its load, each written only by its owner
(an aligned 8-byte store, so a reader sees one value or the other, never half of each). A worker
claims a free slot, or the slot of a process that is gone, under a file lock, once it serves.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import tempfile
import time
from collections.abc import Callable, Hashable
from pathlib import Path

import numpy as np

SLOTS = 64  # the most workers ``serve`` starts
_FIELDS = 2  # process id, requests held


def create_loads_file(folder: str | None = None) -> Path:
    """A zeroed file of slots for the workers of one ``serve`` (the caller removes it when done)."""
    descriptor, name = tempfile.mkstemp(prefix="ragwarden-workers-", suffix=".loads", dir=folder)
    with os.fdopen(descriptor, "wb") as file:
        file.write(bytes(SLOTS * _FIELDS * 8))
    return Path(name)


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
        self.clock = clock
        self.slot: int | None = None
        self.closed = 0  # connections closed to even the load, for monitoring
        self._active: dict[Hashable, float] = {}  # connection -> when it last brought a request, oldest first
        with path.open("r+b") as file:
            self._map = mmap.mmap(file.fileno(), SLOTS * _FIELDS * 8)
        self._slots = np.frombuffer(self._map, dtype=np.int64).reshape(SLOTS, _FIELDS)

    def claim(self) -> None:
        """Take a free slot (or one whose process is gone) for this process, once it serves."""
        if self.slot is not None:
            return
        with self.path.open("r+b") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            try:
                for slot, pid in enumerate(self._slots[:, 0].tolist()):
                    if pid == 0 or not _alive(pid):
                        self._slots[slot] = (os.getpid(), 0)
                        self.slot = slot
                        return
            finally:
                fcntl.flock(file, fcntl.LOCK_UN)

    def release(self) -> None:
        """Give the slot back (on shutdown), so the others stop counting this worker."""
        if self.slot is not None:
            self._slots[self.slot] = (0, 0)
            self.slot = None

    def answering(self, connection: Hashable) -> bool:
        """Note an answer on ``connection`` (the client's address and port), and whether it should
        close the connection: this worker serves more connections than the least loaded other by
        more than the margin (an eighth of its own, at least ``margin``)."""
        if self.slot is None:
            return False
        now = self.clock()
        self._active.pop(connection, None)
        self._active[connection] = now
        while (oldest := next(iter(self._active.items())))[1] < now - self.window:
            del self._active[oldest[0]]
        mine = len(self._active)
        others = [int(load) for slot, (pid, load) in enumerate(self._slots.tolist())
                  if pid and slot != self.slot and _alive(pid)]  # fmt: skip
        closing = bool(others) and mine - min(others) > max(self.margin, mine // 8)
        if closing:
            del self._active[connection]
            self.closed += 1
        self._slots[self.slot, 1] = len(self._active)
        return closing


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's: not one of ours, but not free either
        return True
    return True
