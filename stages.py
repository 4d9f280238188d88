"""Where a request's time and work went: named stages timed within one request, and counts of the
rows its work touched. Both are for operators (the access log, ``work_done``), never for callers:
a caller's answer carries neither, since either could tell it something of rows it cannot read.

A request opens ``measuring()``; code anywhere below it wraps a stage in ``stage(name)`` (the
query's embedding, the ranking, the post-check, the receipt) and counts its work with
``work(name, rows)``. Outside a measured request, ``stage`` costs two clock reads and records
nothing; ``work`` records into the operation's own record when the face opened one
(``counting()``), else nowhere.

The counts name what a search did, row by row, so a test can assert what the rule of DESIGN §4
asks ("a search does no work over rows its caller cannot read") without a clock:

- ``rows_read``: rows a read brought back from the warehouse (the visible set, matches read by id,
  winners read back);
- ``filter_rows`` and ``filter_matched``: rows a narrowing filter was evaluated over, and matched;
- ``rows_scored``: rows a vector scan scored;
- ``rows_analysed`` and ``postings_scored``: rows analysed for BM25, and postings a query's terms scored;
- ``rows_checked``: rows the post-check decided.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

WORK_NAMES = ("rows_read", "filter_rows", "filter_matched", "rows_scored", "rows_analysed", "postings_scored",
              "rows_checked")  # fmt: skip


@dataclass
class Measurement:
    """One request's stage milliseconds and work counts."""

    stages: dict[str, float] = field(default_factory=dict)
    work: Counter[str] = field(default_factory=Counter)


_STAGES: ContextVar[dict[str, float] | None] = ContextVar("ragwarden_stages", default=None)
_WORK: ContextVar[Counter[str] | None] = ContextVar("ragwarden_work", default=None)
_TOTALS: Counter[str] = Counter()
_TOTALS_LOCK = threading.Lock()


@contextlib.contextmanager
def measuring() -> Iterator[Measurement]:
    """A fresh record of stage milliseconds and work for the code run within (threads it starts
    through ``contextvars.copy_context``, as Starlette's thread pool does, share it); its work is
    added to the process's totals when it ends."""
    measurement = Measurement()
    stages_token = _STAGES.set(measurement.stages)
    work_token = _WORK.set(measurement.work)
    try:
        yield measurement
    finally:
        _STAGES.reset(stages_token)
        _WORK.reset(work_token)
        _add_to_totals(measurement.work)


@contextlib.contextmanager
def counting() -> Iterator[Counter[str]]:
    """The work record of the code run within: the enclosing request's when one is measured, else
    a record of its own, added to the process's totals when it ends (an operation of the face
    called from Python)."""
    held = _WORK.get()
    if held is not None:
        yield held
        return
    record: Counter[str] = Counter()
    token = _WORK.set(record)
    try:
        yield record
    finally:
        _WORK.reset(token)
        _add_to_totals(record)


def work(name: str, rows: int) -> None:
    """Count ``rows`` of work named ``name`` (one of ``WORK_NAMES``) in the current record, if any."""
    record = _WORK.get()
    if record is not None and rows:
        record[name] += int(rows)


def work_done() -> dict[str, int]:
    """The work of every finished request and operation of this process so far, by name."""
    with _TOTALS_LOCK:
        return {name: _TOTALS.get(name, 0) for name in WORK_NAMES}


def _add_to_totals(record: Counter[str]) -> None:
    if record:
        with _TOTALS_LOCK:
            _TOTALS.update(record)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Add the block's milliseconds to stage ``name`` of the request being measured, if any."""
    started = time.perf_counter()
    try:
        yield
    finally:
        stages = _STAGES.get()
        if stages is not None:
            stages[name] = stages.get(name, 0.0) + (time.perf_counter() - started) * 1000
