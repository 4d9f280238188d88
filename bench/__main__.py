"""``make bench``: run the benchmark, write ``results.json``, ``results.md`` and a plot, print targets.

    python -m ragwarden.bench [--sizes 100000,1000000,scifact] [--queries 20] [--out bench/results]
                              [--peers faiss-hnsw,faiss-ivf | --no-peers] [--no-ingest]
    python -m ragwarden.bench --report bench/results/results.json   # re-render tables and targets only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ragwarden.config import Settings

from .report import plot, targets, to_markdown
from .retrieval import compile_times, run_world
from .scifact_world import scifact_world
from .world import generate


def _machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--sizes", default="100000,1000000,scifact",
                        help="comma-separated worlds: synthetic row counts, and 'scifact' for SciFact's embeddings")
    parser.add_argument("--queries", type=int, default=20, help="queries per cell")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--workdir", type=Path, default=None, help="where the warehouses are written (temp)")
    parser.add_argument("--peers", default=None, help="comma-separated peers to run (default: every one installed)")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--no-ingest", action="store_true", help="skip the SciFact ingest benchmark")
    parser.add_argument("--ingest-limit", type=int, default=None, help="SciFact documents (all by default)")
    parser.add_argument("--peers-only", action="store_true",
                        help="run the peers alone (same callers, queries and exact answers) into peers-SIZES.json")
    parser.add_argument("--report", type=Path, default=None, help="re-render an earlier results.json")
    parser.add_argument("--merge", type=Path, nargs="*", default=[], help="results.json files whose worlds join the report")
    args = parser.parse_args(argv)
    if args.report:
        results = json.loads(args.report.read_text(encoding="utf-8"))
        for other in args.merge:
            results["worlds"] += json.loads(other.read_text(encoding="utf-8"))["worlds"]
        return _finish(results, args.report.parent)

    args.out.mkdir(parents=True, exist_ok=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ragwarden-bench-"))
    results: dict[str, Any] = {"machine": _machine(), "worlds": [], "compile": compile_times()}
    peers = set() if args.no_peers else ({p for p in args.peers.split(",") if p} if args.peers else None)
    settings = Settings.from_env()
    for size in (s for s in args.sizes.split(",") if s):
        if size == "scifact":
            folder = settings.data_dir / "scifact"
            if not (folder / "corpus.jsonl").exists():
                results["skipped_worlds"] = {"scifact": f"no SciFact data at {folder} (set RAGWARDEN_DATA)"}
                continue
            world, data = scifact_world(folder, workdir), "scifact"
        else:
            world, data = generate(int(size)), "synthetic"
        results["worlds"].append(run_world(world, data=data, queries_per_cell=args.queries, workdir=workdir, peers=peers,
                                           ours=not args.peers_only))  # fmt: skip
        if args.peers_only:  # not a report of ragwarden: kept beside results.json, never in place of it
            name = f"peers-{args.sizes.replace(',', '-')}.json"
            (args.out / name).write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
        else:
            _write(results, args.out)
    if args.peers_only:
        return 0
    if not args.no_ingest:
        from .ingest_bench import run_ingest_bench

        results["ingest"] = run_ingest_bench(limit=args.ingest_limit)
    return _finish(results, args.out)


def _finish(results: dict[str, Any], out: Path) -> int:
    results["targets"] = targets(results)
    _write(results, out)
    for line in results["targets"]:
        print(f"{'PASS' if line['met'] else 'MISS'}  {line['target']}: {line['result']}")
    return 0


def _write(results: dict[str, Any], out: Path) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "results.md").write_text(to_markdown(results), encoding="utf-8")
    plot(results, out / "latency_recall.png")


if __name__ == "__main__":
    sys.exit(main())
