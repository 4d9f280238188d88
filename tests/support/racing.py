"""Two replicas' writes interleaved at the one point that matters: between a write's plan and its
commit. Replaying the interleaving deterministically shows what a stress finds only by chance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def racing(first: Any, monkeypatch: pytest.MonkeyPatch, rival: Callable[[], object]) -> list[int]:
    """Make ``first``'s next write run ``rival()`` (another replica's write) right after planning its
    first attempt: the rival commits while ``first`` holds a plan made from the version before.
    Returns the versions each attempt planned from."""
    planned: list[int] = []
    write_chunks = first.store.chunks.write

    def interleaved(plan, *, what):  # type: ignore[no-untyped-def]
        def plan_then_race(snapshot):  # type: ignore[no-untyped-def]
            result = plan(snapshot)
            planned.append(snapshot.version)
            if len(planned) == 1:
                rival()
            return result

        return write_chunks(plan_then_race, what=what)

    monkeypatch.setattr(first.store.chunks, "write", interleaved)
    return planned


def between_commit_and_record(first: Any, monkeypatch: pytest.MonkeyPatch, rival: Callable[[], object]) -> None:
    """Make ``first``'s next source-record write run ``rival()`` (another replica's write) just
    before it: ``first``'s chunks are committed, the record saying so not yet written."""
    record = first.store.sources.record
    raced: list[bool] = []

    def late(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not raced:
            raced.append(True)
            rival()
        return record(*args, **kwargs)

    monkeypatch.setattr(first.store.sources, "record", late)
