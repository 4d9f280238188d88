"""The policy a process serves under: kept at its last good version, with the memberships the
identity provider provisioned laid over it. Per-process caches of what the warehouse (or a file)
holds, each rebuilt when its source's stamp moves; the rules they apply are ``governance``'s.

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
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path

from .errors import InvalidPolicyError, PolicyError
from .governance.policy import Policy
from .governance.provisioned import Provisioned, ProvisionedRow
from .governance.provisioned import combined as combined_policy

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


COMBINED_KEPT = 4
"""Combined policies kept, by (base version, provisioned digest): a few, for a policy being replaced."""


class ProvisionedPolicy:
    """``over(base)``: the policy ``base`` with the directory's memberships and deactivations, as
    of the directory version ``version()`` gives (the request's freshness check)."""

    def __init__(self, *, version: Callable[[], int], rows_at: Callable[[int], Iterable[ProvisionedRow]]) -> None:
        self._version = version
        self._rows_at = rows_at
        self._lock = threading.Lock()
        self._provisioned: tuple[int, Provisioned] | None = None
        self._combined: dict[tuple[str, str], Policy] = {}

    def provisioned(self) -> Provisioned:
        """What the directory provisions at its version for this request."""
        version = self._version()
        with self._lock:
            if self._provisioned is None or self._provisioned[0] != version:
                self._provisioned = (version, Provisioned.from_rows(self._rows_at(version)))
            return self._provisioned[1]

    def check(self, base: Policy | None, tenant: str, rows: Iterable[ProvisionedRow]) -> None:
        """Raise ``PolicyError`` if ``tenant``'s directory, were it ``rows``, would not combine
        with ``base`` (what a write checks before it commits, so no write can make every later
        request fail)."""
        if base is None:
            return
        others = [row for row in self._rows_at(self._version()) if row.tenant != tenant]
        candidate = Provisioned.from_rows([*others, *rows])
        candidate.over(base)

    def require_combining(self, base: Policy) -> None:
        """Raise ``PolicyError`` if ``base`` cannot combine with every tenant's provisioned
        memberships (what an install checks: it would refuse a tenant)."""
        provisioned = self.provisioned()
        provisioned.over(base)

    def over(self, base: Policy | None) -> Policy | None:
        """``base`` with what was provisioned; ``base`` itself when nothing was (or there is no
        policy: provisioned memberships grant nothing a policy does not). A tenant whose
        memberships cannot combine with ``base`` (a chain too deep: writes and installs check for
        it, but the two can race) is refused, in that tenant alone (``Policy.refused_tenants``)."""
        if base is None:
            return None
        provisioned = self.provisioned()
        if provisioned.empty:
            return base
        key = (base.version, provisioned.digest)
        with self._lock:  # built once: requests arriving meanwhile wait for it rather than build it too
            combined = self._combined.get(key)
            if combined is None:
                combined = combined_policy(base, provisioned)
                if len(self._combined) >= COMBINED_KEPT:
                    self._combined.pop(next(iter(self._combined)))
                self._combined[key] = combined
            return combined
