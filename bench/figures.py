"""The figures the README and the operating docs quote, rendered from recorded runs, dated.

A figure in prose goes stale the day a benchmark moves. Here each quoted figure is rendered from
the run that measured it (a JSON file of ``bench/results/``, which records its date and machine)
into a block of the document between two markers::

    <!-- figures:NAME -->
    ...generated text...
    <!-- /figures:NAME -->

``python -m ragwarden.bench.figures`` rewrites every block from the records; ``--check`` exits 1
naming each block that differs (a test runs it, so a hand-edited figure or a new record left
unrendered fails the suite). Record a run, then render:

- ``make test`` records the suite (``build/suite.json``): ``make figures`` copies it in;
- ``python -m ragwarden.bench.cli_start`` records how long commands that never embed take;
- ``make bench`` and ``make bench-serve`` record search and service figures.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
BLOCK = re.compile(r"(<!-- figures:(?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- /figures:(?P=name) -->)", re.DOTALL)


def _record(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def _date(record: Mapping[str, Any]) -> str:
    """The day a record was measured (its ``machine.date`` or ``date``)."""
    when = (record.get("machine") or {}).get("date") or record.get("date")
    if not when:
        raise KeyError("the record says no date: record it again with a current benchmark")
    return str(when)[:10]


def _cell(record: Mapping[str, Any], caller: str, clients: int) -> dict[str, Any]:
    (cell,) = [c for c in record["cells"] if c["caller"] == caller and c["clients"] == clients]
    return cell


def performance() -> str:
    """The README's service paragraph: one replica, two, and one beside an ingest (SciFact)."""
    one, two, busy = _record("serve-scifact-x1.json"), _record("serve-scifact-x2.json"), _record("serve-scifact-x1-ingest.json")
    single, many, most = (_cell(one, "broad", n) for n in (1, 16, 64))
    clean = all(c["errors"] == 0 and c["leaks"] == 0 for r in (one, two, busy) for c in r["cells"])
    ratio = {n: _cell(two, "broad", n)["per_second"] / _cell(one, "broad", n)["per_second"] for n in (16, 64)}
    return (
        f"SciFact ({single['readable']:,} chunks), one replica, {one['machine']['cpus']} cores, a caller who may read "
        f"everything ({_date(one)}): {single['per_second']:.0f} searches/s at one client with p50 "
        f"{single['p50_ms']:.1f} ms, {many['per_second']:.0f}/s at 16 clients with p99 {many['p99_ms']:.0f} ms (the "
        f"receipt {many['stages_ms']['receipt']} ms of it), {most['per_second']:.0f}/s at 64 with p99 "
        f"{most['p99_ms']:.0f} ms, {'0 errors and 0 leaks in every cell' if clean else 'ERRORS OR LEAKS: see the record'}; "
        f"with an ingest writing beside them on the same cores, p99 {_cell(busy, 'broad', 64)['p99_ms']:.0f} ms at 64 "
        f"clients; two replicas on one warehouse give {ratio[16]:.2f}x one replica's throughput at 16 clients and "
        f"{ratio[64]:.2f}x at 64, into one verifiable log.\n"
    )


def suite() -> str:
    """The README's test-suite figures: how many tests, and how long ``make test`` took."""
    run = _record("suite.json")
    minutes, seconds = divmod(round(run["seconds"]), 60)
    return (
        f"The last recorded run ({_date(run)}, {run['cpus']} cores"
        + (f", {run['workers']} test processes" if run.get("workers") else "")
        + f"): {run['passed']:,} tests passed, "
        f"{run['skipped']} skipped (each with its reason), {run['failed']} failed, in {minutes} min {seconds} s of "
        f"tests, plus the install on a fresh clone.\n"
    )


def cli_start() -> str:
    """How long a command that never embeds takes, end to end, as a shell runs it."""
    run = _record("cli_start.json")
    parts = ", ".join(f"`ragwarden {command}` {seconds:.1f} s" for command, seconds in run["median_seconds"].items())
    return f"Measured {_date(run)} on {run['cpus']} cores, median of {run['runs']} runs each: {parts}.\n"


def capacity() -> str:
    """The deployment guide's capacity table, from the search and service benchmarks."""
    search, one, soak = _record("results.json"), _record("serve-scifact-x1.json"), _record("soak.json")
    worlds = {w["n"]: w for w in search["worlds"] if w["data"] == "synthetic"}
    largest = max(worlds)

    def p50(world: Mapping[str, Any], selective: bool) -> list[float]:
        return [c["p50_ms"] for c in world["cells"] if c["system"] == "ragwarden" and (c["visible_share"] <= 0.02) == selective]

    selective = p50(worlds[largest], True)
    broad = [ms for world in worlds.values() for ms in p50(world, False)]
    busy = _cell(one, "broad", 16)
    ingest = search["ingest"]["backends"]
    fastest = max(ingest, key=lambda name: ingest[name]["ingest_docs_per_s"])
    rows = [
        ("selective searches (2% or less visible)", "API replica: exact scan of the caller's rows held in memory",
         f"p50 {min(selective):.1f}-{max(selective):.1f} ms at {largest:,} rows", "more replicas; `RAGWARDEN_FLAT_CACHE_MB` for many distinct callers"),
        ("broad searches", "Lance's vector index over the object store",
         f"p50 {min(broad):.1f}-{max(broad):.1f} ms at {min(worlds):,}-{largest:,} rows", "more replicas; object-store throughput"),
        ("every search", "the audit receipt, journaled before the answer",
         f"{busy['stages_ms']['receipt']} ms at 16 clients", "the journal's disk; the fold's commit rate"),
        ("query embedding", "API replica CPU", f"{busy['stages_ms']['embed']} ms per query at 16 clients",
         "more replicas, or a GPU"),
        ("ingest", "embedding", f"SciFact {ingest[fastest]['ingest_docs_per_s']:.1f} documents/s ({fastest})",
         "Ray actors, GPUs"),
        ("load test", f"{soak['clients']} clients for {soak['seconds'] / 60:.0f} min on a replica that is also ingesting",
         f"{soak['requests_per_second']:.1f} searches/s, p50 {soak['p50_ms'] / 1000:.1f} s, {soak['errors']} errors, "
         f"{soak['leaks']} leaks", "more cores per replica"),
    ]  # fmt: skip
    head = (f"Measured on {search['machine']['cpus']} CPU cores: search {_date(search)} (`make bench`), service "
            f"{_date(one)} (`make bench-serve`).\n\n| load | part that works | figure | scale by |\n| --- | --- | --- | --- |\n")  # fmt: skip
    return head + "".join(f"| {' | '.join(row)} |\n" for row in rows)


def churn() -> str:
    """The README's shared-use figures: many callers never seen and a writer committing (1M rows)."""
    run = _record("churn-1000000.json")
    cells = run["modes"]
    parts = "; ".join(
        f"{mode} first p99 {c['first']['p99_ms']:.1f} ms, under commits p99 {c['churn']['p99_ms']:.1f} ms "
        f"(warm p50 {c['warm']['p50_ms']:.1f} ms)"
        for mode, c in cells.items()
    )
    leaks = sum(c[k]["leaks"] for c in cells.values() for k in ("warm", "first", "churn"))
    work = run["reader_work"]
    held = sum(work["bytes_per_million_rows"].values()) / 2**20
    moves = ", ".join(f"{kind} {cell['max']:.1f} ms" for kind, cell in work["move_ms"].items())
    first = ", ".join(f"{kind} {took:.1f} ms" for kind, took in work.get("first_move_ms", {}).items())
    return (
        f"{run['rows']:,} rows, {run['users']:,} users in {run['groups']} groups, one replica over HTTP, "
        f"{run['machine']['cpus']} cores ({_date(run)}): {parts}; {leaks} leaks against the oracle. A replica "
        f"holds {held:,.0f} MiB per 1M rows (index with its 8-bit codes, tags and terms); a commit of "
        f"{work['commit_rows']} rows costs each reader at most {moves}"
        + (f" (the first of each after a load, which also pays the process's one-time costs: {first})" if first else "")
        + ".\n"
    )


def brought() -> str:
    """The README's figure for records that bring their vectors and for an import (``bench/brought.py``)."""
    run = _record("brought-100000.json")
    search = run["search"]
    line = (
        f"{run['rows']:,} records on {run['machine']['cpus']} cores ({_date(run)}): {run['rows_per_second']:,} rows/s "
        f"end to end ({run['seconds']} s, one commit per {run['commits_of']:,}), where a bare LanceDB add of the same "
        f"rows ran at {run['bare_rows_per_second']:,} rows/s; `ragwarden import lancedb` of that table, "
        f"{run['import_lancedb_rows_per_second']:,} rows/s; recall@10 {search['recall_at_10']:.3f} for "
        f"{search['callers']} callers against the oracle, {search['leaks']} leaks.\n"
    )
    big = _record("brought-1000000.json")
    if "import_search" not in big:
        return line
    found = big["import_search"]
    return line + (
        f"\n{big['rows']:,} rows imported from a LanceDB table ({_date(big)}, {big['machine']['cpus']} cores): "
        f"{big['import_lancedb_rows_per_second']:,} rows/s end to end ({big['import_lancedb_seconds']} s, one commit per "
        f"{big['import_commits_of']:,} rows), {big['import_ratio_to_bare']}x a bare LanceDB add of the same rows "
        f"({big['bare_rows_per_second']:,} rows/s); recall@10 {found['recall_at_10']:.3f} for {found['callers']} callers "
        f"against the oracle, {found['leaks']} leaks.\n"
    )


@dataclass(frozen=True, kw_only=True)
class Block:
    """One generated block: the document that holds it and what renders it."""

    document: str
    render: Callable[[], str]


BLOCKS: dict[str, Block] = {
    "performance": Block(document="README.md", render=performance),
    "churn": Block(document="README.md", render=churn),
    "brought": Block(document="README.md", render=brought),
    "suite": Block(document="README.md", render=suite),
    "cli-start": Block(document="README.md", render=cli_start),
    "capacity": Block(document="docs/deployment.md", render=capacity),
}


def rendered(document: str, root: Path = REPO) -> tuple[str, list[str]]:
    """``document``'s text with each of its blocks rendered afresh, and the names of those that
    changed. A marker naming no known block, or a known block missing, is an error."""
    text = (root / document).read_text(encoding="utf-8")
    changed: list[str] = []
    seen: set[str] = set()

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in BLOCKS or BLOCKS[name].document != document:
            raise KeyError(f"{document}: no figures block named {name!r} belongs here")
        seen.add(name)
        body = BLOCKS[name].render()
        if body != match["body"]:
            changed.append(name)
        return match.group(1) + body + match.group(4)

    text = BLOCK.sub(fill, text)
    missing = sorted(name for name, block in BLOCKS.items() if block.document == document and name not in seen)
    if missing:
        raise KeyError(f"{document}: figures blocks {missing} are missing their markers")
    return text, changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a block differs from its records")
    args = parser.parse_args(argv)
    stale: list[str] = []
    for document in sorted({block.document for block in BLOCKS.values()}):
        text, changed = rendered(document)
        stale += [f"{document}: {name}" for name in changed]
        if changed and not args.check:
            (REPO / document).write_text(text, encoding="utf-8")
    if args.check and stale:
        print("figures out of date (run python -m ragwarden.bench.figures):", *stale, sep="\n  ", file=sys.stderr)
        return 1
    print("\n".join(f"rendered {entry}" for entry in stale) or "every figure is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
