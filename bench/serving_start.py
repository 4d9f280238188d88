"""A replica's cold start with the resident serving index, on the synthetic world of ``make bench``.

What it measures: building the artifact (``ragwarden optimize``'s step), a new process's load of it
and its first governed answer, the memory the loaded index takes (resident set before and after),
and the governed p50 (freshness check, compiled filter, search, post-check; no receipt, no query
embedding) at each selectivity, with recall@10 against exact search over the visible rows.

    python -m ragwarden.bench.serving_start --rows 1000000 --out bench/results
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

K = 10


def build(rows: int, folder: Path) -> dict[str, Any]:
    """Write the world's warehouse and store its serving index's artifact."""
    from ragwarden.bench.world import generate, write_warehouse
    from ragwarden.retrieval.serving import store_artifact

    world = generate(rows, seed=7)
    started = time.perf_counter()
    store = write_warehouse(world, folder)
    written = time.perf_counter() - started
    started = time.perf_counter()
    stored = store_artifact(store.read_doors())
    assert stored is not None
    return {"rows": rows, "write_seconds": written, "artifact_build_seconds": time.perf_counter() - started,
            "artifact_bytes": sum(p.stat().st_size for p in (folder / "resident_index").iterdir())}  # fmt: skip


def serve(rows: int, folder: Path, queries: int) -> dict[str, Any]:
    """In a fresh process: open the warehouse, load the artifact, answer, then measure each selectivity."""
    import psutil

    from ragwarden.bench.peer_data import visible_mask
    from ragwarden.bench.world import TENANT, caller_of, generate
    from ragwarden.bench.world import queries as world_queries
    from ragwarden.config import Settings
    from ragwarden.governance.caller import Caller
    from ragwarden.warehouse import Warehouse

    world = generate(rows, seed=7)  # the same world, for its subjects, queries and the exact answers
    process = psutil.Process()
    started = time.perf_counter()
    warehouse = Warehouse(Settings(warehouse=str(folder)), embedder=None)  # type: ignore[arg-type]
    searcher = warehouse._searcher
    before = process.memory_info().rss
    index = searcher.serving.build_now()
    loaded = time.perf_counter() - started
    rss = process.memory_info().rss - before
    policy = warehouse.policy
    assert policy is not None
    subject = world.subjects[max(world.subjects)]
    first_query = world_queries(world, subject, policy, "none", 1, seed=1)[0]
    with warehouse.store.pinned():
        searcher.search("q", policy=policy, caller=Caller(subject=subject, tenant=TENANT), k=K, vector=first_query)
    first_answer = time.perf_counter() - started
    cells = []
    for share, subject in sorted(world.subjects.items(), reverse=True):
        caller = Caller(subject=subject, tenant=TENANT)
        mask = visible_mask(world.rows, caller_of(world, subject, policy))
        positions = np.flatnonzero(mask)
        qs = world_queries(world, subject, policy, "none", queries, seed=int(share * 1e4) + 1)
        latencies, found = [], 0
        for q in qs:
            t0 = time.perf_counter()
            with warehouse.store.pinned():
                hits = searcher.search("q", policy=policy, caller=caller, k=K, vector=q).hits
            latencies.append((time.perf_counter() - t0) * 1000)
            exact = {world.rows.ids[i] for i in positions[np.argsort(-(world.rows.vectors[positions] @ q))[:K]]}
            found += len(exact & {hit.chunk_id for hit in hits})
        cells.append({"visible": share, "visible_rows": int(mask.sum()), "p50_ms": float(np.median(latencies[1:])),
                      "first_ms": latencies[0], "recall_at_10": found / (K * len(qs))})  # fmt: skip
    return {"load_seconds": loaded, "first_answer_seconds": first_answer, "index_rows": index.rows,
            "index_bytes": index.nbytes, "rss_added_bytes": rss, "cells": cells,
            "status": searcher.serving.status().state}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--keep", type=Path, help="build the warehouse and artifact in this folder once, and reuse them")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # the fresh process's part
    args = parser.parse_args()
    if args.serve:
        print(json.dumps(serve(args.rows, args.serve, args.queries)))
        return
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="ragwarden-serving-"))
    try:
        folder = workdir / f"warehouse-{args.rows}"
        built = folder / "built.json"
        if not built.exists():
            shutil.rmtree(folder, ignore_errors=True)
            report_built = build(args.rows, folder)
            built.write_text(json.dumps(report_built))
        report: dict[str, Any] = {"built": json.loads(built.read_text())}
        print(json.dumps(report["built"]), flush=True)
        fresh = subprocess.run([sys.executable, "-m", "ragwarden.bench.serving_start", "--rows", str(args.rows),
                                "--queries", str(args.queries), "--serve", str(folder)],
                               check=True, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
        report["replica"] = json.loads(fresh.stdout.strip().splitlines()[-1])
        args.out.mkdir(parents=True, exist_ok=True)
        target = args.out / f"serving-start-{args.rows}.json"
        target.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report["replica"], indent=2))
        print(f"written to {target}")
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
