"""A small run of the benchmark harness: every system answers, ragwarden leaks nothing and finds
the exact permitted top-k, and the report renders its targets (the full run is `make bench`)."""

from __future__ import annotations

from pathlib import Path

from ragwarden.bench.report import targets, to_markdown
from ragwarden.bench.retrieval import run_world
from ragwarden.bench.world import generate


def test_a_small_benchmark_run_scores_every_system_and_reports_its_targets(tmp_path: Path) -> None:
    world = run_world(generate(3_000), data="synthetic", queries_per_cell=2, workdir=tmp_path, peers=set(), log=lambda line: None)
    systems = {cell["system"] for cell in world["cells"]}
    assert {"ragwarden", "unfiltered", "numpy exact", "k-then-drop k'=k"} <= systems
    ours = [cell for cell in world["cells"] if cell["system"] == "ragwarden"]
    assert len(ours) == 12  # four selectivities by three correlations
    assert all(cell["leaks"] == 0 and cell["recall"] == 1.0 and cell["k_fill"] == 1.0 for cell in ours)
    assert all(cell["extra"]["cold_ms"] > 0 for cell in ours)
    assert sum(cell["leaks"] for cell in world["cells"] if cell["system"] == "unfiltered") > 0  # the oracle sees leaks
    assert world["appended_rows"]["found_first"] == world["appended_rows"]["appended"]
    assert world["appended_rows"]["leaked"] == 0
    results = {"machine": {"date": "today", "cpus": 2, "processor": "x", "platform": "y", "python": "3"},
               "worlds": [world], "compile": {}}  # fmt: skip
    lines = targets(results)
    assert any(line["target"] == "0 leaks" and line["met"] for line in lines)
    assert "| ragwarden |" in to_markdown({**results, "targets": lines})
