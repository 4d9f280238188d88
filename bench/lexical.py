"""Full-text and hybrid search beside vector search: what a caller pays for BM25 over its own rows.

The world is the benchmark's synthetic permission world (``world.py``: 50 Zipf-sized groups, 20
labels, two tenants, 1% denies; one subject per share of rows visible, 50/10/1/0.1%) with real text
on every row: a window of five consecutive SciFact sentences, about 730 characters, the size of a
chunk. Row vectors stay the world's synthetic ones (what vector ranking costs does not depend on
what the vectors mean); queries are SciFact's real test queries. For each subject and mode:

- ``e2e``: ``Warehouse.search`` as a user calls it, the query's embedding (vector, hybrid) and the
  audit receipt included (each cell starts on an empty audit log);
- ``inner``: ``Searcher.search`` with the query's vector given: plan, rank, post-check and hits;
- ``cold``: the first search of a freshly opened warehouse, whose caches are empty (what the first
  search after any commit pays: the caller's rows read, and for full text analysed);
- ``held``: what the search cache holds for the caller afterwards.

Only the public search path is used, so the same module measures any version of ragwarden: "before"
is this file run with the older code first on ``PYTHONPATH``.

    python -m ragwarden.bench.lexical [--size 100000] [--queries 20] [--workdir DIR] --label after --out FILE
    python -m ragwarden.bench.lexical --before OLD.json... --after NEW.json... --out TABLE.md
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..config import Settings
from ..embedder import Embedder
from ..governance.caller import Caller
from ..warehouse import Warehouse
from . import scifact
from .peer_data import row_index
from .world import TENANT, World, caller_of, generate, write_warehouse

MODES = ("vector", "fts", "hybrid")
K = 10
SENTENCES_PER_ROW = 5


def chunk_texts(folder: Path, count: int) -> list[str]:
    """``count`` chunk-sized texts: windows of consecutive SciFact sentences, starting 7 sentences
    apart, so neighbouring rows overlap as a chunker's windows do."""
    sentences: list[str] = []
    for record in scifact.records(folder):
        sentences += re.split(r"(?<=[.!?])\s+", record["text"].strip())
    return [" ".join(sentences[(7 * i) % len(sentences) :][:SENTENCES_PER_ROW]) for i in range(count)]


def text_world(size: int, folder: Path, data: Path) -> World:
    """The world of ``size`` rows written with texts and every index into ``folder`` (reused when a
    finished one is there: the world is deterministic)."""
    world = generate(size)
    ready = folder / "READY"
    if not ready.exists():
        store = write_warehouse(world, folder)
        schema = pa.schema([store.chunks.schema.field(name) for name in ("chunk_id", "text")])
        store.chunks.replace_columns(pa.table({"chunk_id": world.rows.ids, "text": chunk_texts(data, size)}, schema=schema))
        store.maintenance.optimize()
        ready.write_text("built\n", encoding="utf-8")
    return world


def _ms(action: Callable[..., object], *args: Any) -> float:
    started = time.perf_counter()
    action(*args)
    return (time.perf_counter() - started) * 1000


def measure_cell(
    settings: Settings, embedder: Embedder, subject: str, mode: str, queries: Sequence[str], vectors: np.ndarray
) -> dict[str, Any]:
    """One subject in one mode, on a freshly opened warehouse (empty caches) with an empty audit
    log: a receipt's append grows with the receipts before it (about 25 ms on a new log, 90 ms after
    some thousands), which would charge each cell for the cells measured before it."""
    shutil.rmtree(Path(settings.warehouse) / "audit.lance", ignore_errors=True)
    warehouse = Warehouse(settings, embedder=embedder)
    policy = warehouse.policy
    searcher = warehouse._searcher
    found: list[int] = []

    def user(query: str) -> None:
        found.append(len(warehouse.search(query, subject=subject, tenant=TENANT, k=K, mode=mode)))

    cold = _ms(user, queries[0])
    e2e = [_ms(user, query) for query in queries]

    caller = Caller(subject=subject, tenant=TENANT)

    def inner_search(query: str, vector: np.ndarray) -> None:
        searcher.search(query, policy=policy, caller=caller, k=K, mode=mode, vector=vector)

    inner = [_ms(inner_search, query, vector) for query, vector in zip(queries, vectors, strict=True)]
    return {
        "subject": subject,
        "mode": mode,
        "cold_ms": cold,
        "e2e_p50_ms": float(np.percentile(e2e, 50)),
        "e2e_p95_ms": float(np.percentile(e2e, 95)),
        "inner_p50_ms": float(np.percentile(inner, 50)),
        "inner_p95_ms": float(np.percentile(inner, 95)),
        "hits_mean": float(np.mean(found)),
        "held_mb": searcher.visible.nbytes / 2**20,
    }


def run(
    size: int, queries_count: int, workdir: Path, label: str, flat_cache_mb: int | None,
    shares: Sequence[float] | None = None, modes: Sequence[str] = MODES,
) -> dict[str, Any]:  # fmt: skip
    """Every (subject, mode) cell of the world of ``size`` rows, or those of ``shares`` and ``modes``."""
    data = Settings.from_env().data_dir / "scifact"
    folder = workdir / f"lexical-{size}"
    started = time.perf_counter()
    world = text_world(size, folder, data)
    built = time.perf_counter() - started
    queries = list(scifact.judged_queries(data)[0].values())[:queries_count]
    settings = Settings(warehouse=str(folder), **({} if flat_cache_mb is None else {"flat_cache_mb": flat_cache_mb}))
    embedder = Embedder.from_settings(settings)
    vectors = embedder.encode(queries)
    embed = [_ms(embedder.encode, [query]) for query in queries]
    policy = Warehouse(settings, embedder=embedder).policy
    assert policy is not None
    index = row_index(world.rows)
    cells = []
    for share, subject in world.subjects.items():
        if shares is not None and share not in shares:
            continue
        visible = int(index.visible(caller_of(world, subject, policy)).sum())  # the benchmark's own oracle
        for mode in modes:
            cell = measure_cell(settings, embedder, subject, mode, queries, vectors)
            cells.append({"share": share, "visible_rows": visible, **cell})
            print(json.dumps(cells[-1]), flush=True)
    return {
        "label": label,
        "size": size,
        "queries": queries_count,
        "flat_cache_mb": settings.flat_cache_mb,
        "build_s": built,
        "embed_p50_ms": float(np.percentile(embed, 50)),
        "cells": cells,
    }


FIGURES = ("e2e_p50_ms", "inner_p50_ms", "cold_ms")


def best_of(runs: Sequence[dict[str, Any]]) -> dict[tuple[float, str], dict[str, Any]]:
    """Each cell's figures, the lowest over ``runs`` of the same code (on a shared machine, other
    work only ever adds time), with the visible rows and held bytes of the last run."""
    cells: dict[tuple[float, str], dict[str, Any]] = {}
    for run_ in runs:
        for cell in run_["cells"]:
            key = (cell["share"], cell["mode"])
            held = cells.setdefault(key, {**cell, "runs": 0})
            held.update({name: min(held[name], cell[name]) for name in FIGURES}, held_mb=cell["held_mb"])
            held["runs"] += 1
    return dict(sorted(cells.items(), key=lambda item: (-item[0][0], MODES.index(item[0][1]))))


def compare(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> str:
    """Runs of the old and the new code side by side, as markdown: one row per (share visible, mode)."""
    old, new = best_of(before), best_of(after)
    last = after[-1]
    embeds = [run_["embed_p50_ms"] for run_ in [*before, *after]]
    embed = f"{min(embeds):.0f} to {max(embeds):.0f}"
    heading = (
        f"N = {last['size']:,} rows, k = {K}, {last['queries']} SciFact queries per cell, flat cache "
        f"{last['flat_cache_mb']} MB; ms, p50 (cold: the first search), the lowest of "
        f"{max(cell['runs'] for cell in old.values())} runs of each cell before and "
        f"{max(cell['runs'] for cell in new.values())} after. Query embedding alone: {embed} ms p50 across runs."
    )
    columns = ["visible", "rows", "mode", "e2e before", "e2e after", "inner before", "inner after", "cold before",
               "cold after", "held after MB"]  # fmt: skip
    lines = [heading, "", "| " + " | ".join(columns) + " |", "| ---: | ---: | --- |" + " ---: |" * 7]
    for key, cell in new.items():
        prior = old.get(key, {})
        figures = [f"{source[name]:.1f}" if name in source else "-" for name in FIGURES for source in (prior, cell)]
        lines.append(
            f"| {cell['share']:.1%} | {cell['visible_rows']:,} | {cell['mode']} | " + " | ".join(figures)
            + f" | {cell['held_mb']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragwarden.bench.lexical", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--size", type=int, default=100_000, help="rows in the world")
    parser.add_argument("--queries", type=int, default=20, help="queries per cell")
    parser.add_argument("--workdir", type=Path, default=None, help="where the warehouse is built (reused if built)")
    parser.add_argument("--label", default="after", help="names the code measured (before, after)")
    parser.add_argument("--flat-cache-mb", type=int, default=None, help="search cache budget (default: the setting)")
    parser.add_argument("--shares", default=None, help="comma-separated shares visible to run (default: all)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes to run")
    parser.add_argument("--out", type=Path, required=True, help="JSON results, or with --before/--after markdown")
    parser.add_argument("--before", type=Path, nargs="+", help="JSON runs of the old code, to render beside --after")
    parser.add_argument("--after", type=Path, nargs="+", help="JSON runs of the new code")
    args = parser.parse_args(argv)
    if args.before or args.after:
        runs = [[json.loads(path.read_text(encoding="utf-8")) for path in paths] for paths in (args.before, args.after)]
        args.out.write_text(compare(*runs), encoding="utf-8")
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ragwarden-lexical-"))
    shares = None if args.shares is None else [float(share) for share in args.shares.split(",")]
    modes = [mode for mode in args.modes.split(",") if mode in MODES]
    results = run(args.size, args.queries, workdir, args.label, args.flat_cache_mb, shares, modes)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
