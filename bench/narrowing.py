"""What a narrowing filter costs the first time a process meets it, beside a repeated one.

    python -m ragwarden.bench.narrowing [--keep DIR] [--searches 60] [--out bench/results]

On the 100,000-row world of ``make bench`` (rows carry ``{"bucket": row % 100}``), in process,
one client, the query embedded and the receipt written: the p50 and p95 of searches with no
filter, the same filter each time, and a filter never seen before at each search (2% and 10% of
the rows by metadata, five ``doc_id``s), for a broad (50%) and a selective (1%) caller. The HTTP
figures for a repeated filter come from ``python -m ragwarden.bench.serve --filter``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import Settings
from ..warehouse import Warehouse
from . import world
from .serve import CALLERS, QUERIES, WORLD_ROWS, _warehouse

Filter = Callable[[int], dict[str, Any] | None]
SHAPES: dict[str, Filter] = {
    "no filter": lambda i: None,
    "same filter, 10%": lambda i: {"bucket": {"$lt": 10}},
    # a value no row holds makes each search's filter one the process has not met
    "new filter, 2%": lambda i: {"bucket": {"$in": [i % 100, (i * 7 + 3) % 100, 10_000 + i]}},
    "new filter, 10%": lambda i: {"bucket": {"$in": [(i * 3 + j * 10) % 100 for j in range(10)] + [10_000 + i]}},
    "new filter, 5 doc_ids": lambda i: {"doc_id": {"$in": [f"r{(i * 97 + j * 1013) % WORLD_ROWS:07d}" for j in range(5)]}},
}


def measure(warehouse: Warehouse, subject: str, tenant: str, shape: Filter, searches: int, offset: int) -> dict[str, float]:
    took = []
    for i in range(offset, offset + searches):
        began = time.perf_counter()
        warehouse.search(QUERIES[i % len(QUERIES)], subject=subject, tenant=tenant, k=10, filter=shape(i))
        took.append((time.perf_counter() - began) * 1000)
    ordered = sorted(took)
    return {"p50_ms": round(statistics.median(ordered), 1), "p95_ms": round(ordered[int(0.95 * len(ordered))], 1)}


def run(folder: Path, data: Path, searches: int) -> dict[str, Any]:
    warehouse = _warehouse("world100k", folder, data)
    results: dict[str, Any] = {}
    for offset, (caller, (sub, tenant)) in enumerate(CALLERS["world100k"].items()):
        subject = f"user:{sub}"
        measure(warehouse, subject, tenant, SHAPES["no filter"], 20, 0)  # warm: the caller's held rows
        # each caller meets its own new filters (``offset``), so none was met by the other first
        results[caller] = {name: measure(warehouse, subject, tenant, shape, searches, 1_000_000 * offset)
                           for name, shape in SHAPES.items()}  # fmt: skip
        print(caller, json.dumps(results[caller]), flush=True)
    return {"world_rows": WORLD_ROWS, "tenant": world.TENANT, "callers": results,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragwarden.bench.narrowing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--keep", type=Path, help="build the world's warehouse in this folder once, and reuse it")
    parser.add_argument("--searches", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--data", type=Path, default=Settings.from_env().data_dir)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ragwarden-narrowing-") as workdir:
        result = run((args.keep or Path(workdir)) / "world100k-warehouse", args.data, args.searches)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / "narrowing-world100k.json"
    target.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"written to {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
