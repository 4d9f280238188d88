"""Where a request's time went: named stages timed within one request, for ``Server-Timing``.

A request opens ``measuring()``; code anywhere below it wraps a stage in ``stage(name)`` (the
query's embedding, the ranking, the post-check, the receipt). Outside a measured request,
``stage`` costs two clock reads and records nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

_STAGES: ContextVar[dict[str, float] | None] = ContextVar("ragwarden_stages", default=None)


@contextlib.contextmanager
def measuring() -> Iterator[dict[str, float]]:
    """A fresh record of stage milliseconds for the code run within (threads it starts through
    ``contextvars.copy_context``, as Starlette's thread pool does, share it)."""
    stages: dict[str, float] = {}
    token = _STAGES.set(stages)
    try:
        yield stages
    finally:
        _STAGES.reset(token)


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


def measured() -> dict[str, float]:
    """The stages measured so far in this request, rounded to 0.1 ms (empty outside one)."""
    return {name: round(ms, 1) for name, ms in (_STAGES.get() or {}).items()}
