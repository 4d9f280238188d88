"""The warehouse's format: which tables and columns it holds, recorded in the warehouse itself.

Replicas of two releases share one warehouse during a rolling upgrade, so a release never
changes the format as a side effect of opening it. Each release says which formats it reads
(``READS``) and which it writes (``WRITES``); a warehouse of any other format is refused with
what to do (``WarehouseFormatError``), never served. ``ragwarden migrate`` brings a warehouse to
``WRITES``, explicitly and receipted; its steps are additive (a column added, a value recorded),
so the replicas of the release before keep serving the warehouse while it runs and after.

The format is recorded on the ``policies`` table's schema metadata (``ragwarden:format``), a
commit of its own: every release reads that table first, and a backup carries it. A warehouse
that records none was written before formats were recorded: format 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import WarehouseFormatError
from .commit_retry import retrying_conflicts

FORMAT_KEY = "ragwarden:format"
UNRECORDED = 1
"""The format of a warehouse written before formats were recorded."""
WRITES = 2
"""The format this release writes, and the one ``ragwarden migrate`` brings a warehouse to."""
READS = frozenset({2})
"""The formats this release serves."""


@dataclass(frozen=True, kw_only=True)
class Migration:
    """What ``ragwarden migrate`` did: the format found, the format left, and each step taken
    (none when the warehouse was at ``WRITES`` already)."""

    found: int
    now: int
    steps: tuple[str, ...]

    def summary(self) -> str:
        if not self.steps and self.found == self.now:
            return f"the warehouse is at format {self.now} already: nothing to do"
        return f"migrated the warehouse from format {self.found} to {self.now}: {'; '.join(self.steps)}"


def recorded_format(policies: Any) -> int:
    """The format recorded on the ``policies`` table (``UNRECORDED`` when none is)."""
    value = (policies.schema.metadata or {}).get(FORMAT_KEY.encode())
    if value is None:
        return UNRECORDED
    try:
        return int(value)
    except ValueError:
        raise WarehouseFormatError(f"the warehouse records format {value!r}, which is not a format number") from None


def record_format(policies: Any, version: int) -> None:
    """Record ``version`` on the ``policies`` table (one commit; the other metadata kept)."""
    retrying_conflicts(lambda: policies.to_lance().update_schema_metadata({FORMAT_KEY: str(version)}),
                       what="recording the warehouse format")  # fmt: skip
    policies.checkout_latest()


def refusal(uri: str, found: int) -> WarehouseFormatError | None:
    """Why this release does not serve a warehouse of format ``found``, with what to do; None if it does."""
    if found in READS:
        return None
    reads = ", ".join(str(v) for v in sorted(READS))
    if found < WRITES:
        return WarehouseFormatError(
            f"warehouse {uri!r} is at format {found}; this release serves format {reads}. Run `ragwarden migrate` "
            "once (safe while replicas of the release before serve it), then start this release"
        )
    return WarehouseFormatError(
        f"warehouse {uri!r} is at format {found}, written by a newer release; this release serves format {reads}. "
        f"Serve it with a release that reads format {found}"
    )
