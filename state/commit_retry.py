"""Commits that lose a race to another writer are tried again.

Lance detects a conflicting concurrent commit and refuses it; every write of the warehouse is
idempotent (rows are merged on their ids, compaction and index builds converge), so trying again
after a short random pause is safe. A conflict that outlasts every attempt is a ``WarehouseError``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import WarehouseError

log = logging.getLogger(__name__)
T = TypeVar("T")
ATTEMPTS = 10
FIRST_PAUSE_SECONDS = 0.02


class PlanAgain(RuntimeError):
    """A write planned from a table version it can no longer safely commit on: plan it again."""


class SnapshotPurged(PlanAgain):
    """A write planned from a table version that a concurrent purge removed."""

    def __init__(self, what: str, version: int) -> None:
        super().__init__(f"{what}: version {version} was purged by a concurrent writer while being read")


class PlanOutlived(PlanAgain):
    """A write planned longer ago than the records of the commits since are sure to be kept
    (``tables.PLAN_LIFETIME``): committing it could miss a conflict."""

    def __init__(self, what: str, version: int, seconds: float) -> None:
        super().__init__(f"{what}: planned on version {version} {seconds:.0f} s ago, too long to commit safely")


def is_missing_file(exc: BaseException) -> bool:
    """Whether ``exc`` is Lance failing to find a file a table version names (on a folder, or on
    object storage, whose answer is NO_SUCH_KEY)."""
    text = str(exc).lower()
    return "not found" in text or "no_such_key" in text or "nosuchkey" in text


def is_commit_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is Lance refusing a commit because another writer committed first (or a
    plan that must be made again)."""
    if isinstance(exc, PlanAgain):
        return True
    text = str(exc).lower()
    return "conflict" in text or "concurrent" in text or "preempted" in text


def retrying_conflicts(action: Callable[[], T], *, what: str, attempts: int = ATTEMPTS) -> T:
    """``action()``, run again (after a random pause that doubles each time) while it loses commit races."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:
            if not is_commit_conflict(exc):
                raise
            if attempt == attempts:
                raise WarehouseError(
                    f"{what} lost {attempts} commit races in a row to concurrent writers; try again later"
                ) from exc
            log.info("%s lost a commit race (attempt %d), trying again: %s", what, attempt, str(exc).splitlines()[0])
            time.sleep(random.uniform(0, FIRST_PAUSE_SECONDS * 2 ** (attempt - 1)))
    raise AssertionError("unreachable")
