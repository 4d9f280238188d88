"""Processes started with ``spawn`` (never forked after LanceDB's runtime started) and released
together, each writing its outcome as JSON."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def run_together(target: Callable[..., None], arguments: Sequence[tuple[Any, ...]], folder: Path,
                 *, timeout: float = 600) -> list[Any]:  # fmt: skip
    """Run ``target(*args, start, result)`` in one spawned process per ``args``, all released at
    once by ``start``; each writes its outcome as JSON to ``result``. Returns the outcomes in order."""
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    results = [folder / f"{getattr(target, '__name__', 'process')}-{n}.json" for n in range(len(arguments))]
    processes = [context.Process(target=target, args=(*args, start, str(result)))
                 for args, result in zip(arguments, results, strict=True)]  # fmt: skip
    for process in processes:
        process.start()
    start.set()
    for process in processes:
        process.join(timeout)
        assert process.exitcode == 0, f"a spawned {target.__name__} exited with {process.exitcode}"
    return [json.loads(result.read_text()) for result in results]
