"""A small run of the service benchmark: real replicas answer every search, the oracle finds no
leak, and the audit's growth is reported (the full run is `make bench-serve`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragwarden.bench.serve import run


@pytest.mark.slow  # starts a server process (model load): about twenty seconds
def test_a_small_service_benchmark_answers_every_search_with_no_leak_while_an_ingest_runs(tmp_path: Path) -> None:
    result = run("demo", [2], 1.0, 1, tmp_path, tmp_path / "no-data", ingest=True)
    cells = {cell["caller"]: cell for cell in result["cells"]}
    assert set(cells) == {"broad", "selective"}
    for cell in cells.values():
        assert cell["searches"] > 0 and cell["errors"] == 0 and cell["leaks"] == 0
        assert cell["p50_ms"] > 0 and cell["app_ms"] > 0 and cell["stages_ms"]["receipt"] > 0
        assert cell["ingested_docs_per_s"] > 0 and cell["chunk_commits"] > 0, "the ingest beside the load wrote nothing"
    assert 0 < cells["selective"]["readable"] < cells["broad"]["readable"], "the oracle tells the callers apart"
    assert result["receipts"] >= sum(cell["searches"] for cell in cells.values())
    assert result["audit_verified"]["ok"] and result["audit_verified"]["chains"] >= 2  # the replica's and the ingest's
    assert result["audit_bytes_per_receipt"]["after_optimize"] >= result["audit_bytes_per_receipt"]["latest_version"] > 0
