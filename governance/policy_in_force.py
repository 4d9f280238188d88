"""The policy a process serves under, kept at its last good version.

The policy's source (a file, or the warehouse's installed policy) is re-read whenever its stamp
changes (file size and time, or table version). Text that does not load never replaces a policy in
force: the last good one stays, the problem is logged and reported, and nothing falls open. Only
when there has never been a good policy in this process does the error reach the caller, which
refuses to serve.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Hashable
from pathlib import Path

from ..errors import InvalidPolicyError, PolicyError
from .policy import Policy

log = logging.getLogger(__name__)


class PolicyInForce:
    """``current()``: the policy to decide with; ``problem``: why a newer one was not taken, if so;
    ``public_problem``: the same without the policy's content (the bad line's principals, groups
    or labels), for readiness probes anyone may call."""

    def __init__(self, *, load: Callable[[], Policy | None], stamp: Callable[[], Hashable]) -> None:
        self._load = load
        self._stamp = stamp
        self._lock = threading.Lock()
        self._seen: Hashable = object()
        self._good: tuple[Policy | None] | None = None  # None until a policy (or its absence) loaded
        self.problem: str | None = None
        self.public_problem: str | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> PolicyInForce:
        """A policy file, re-read when it is replaced or edited."""
        file = Path(path)

        def stamp() -> Hashable:
            try:
                status = file.stat()
            except OSError:
                return None
            return (status.st_ino, status.st_size, status.st_mtime_ns)

        return cls(load=lambda: Policy.from_file(file), stamp=stamp)

    def current(self) -> Policy | None:
        """The policy in force; raises ``PolicyError`` only if none ever loaded."""
        stamp = self._stamp()
        with self._lock:
            if stamp == self._seen and self._good is not None:
                return self._good[0]
            try:
                policy = self._load()
            except PolicyError as exc:
                if self._good is None:
                    raise
                serving = f"still serving policy {self._good[0].version if self._good[0] else '(none)'}"
                problem = f"{exc}; {serving}"
                if problem != self.problem:
                    log.error("the policy did not load, the last good one stays in force: %s", problem)
                where = f"{exc.path}:{exc.line} is not a valid rule" if isinstance(exc, InvalidPolicyError) else str(exc)
                self.public_problem = f"the policy did not load ({where}; the log has the reason); {serving}"
                self.problem, self._seen = problem, stamp
                return self._good[0]
            self._good, self._seen, self.problem, self.public_problem = (policy,), stamp, None, None
            return policy
