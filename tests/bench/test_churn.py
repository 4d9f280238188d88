"""A small run of the churn benchmark: many callers, each seen for the first time, and a writer
committing every second; every search answered, every hit within the caller's groups (the full run
is `python -m ragwarden.bench.churn`, in `make bench`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragwarden.bench.churn import MODES, ChurnWorld, build, run


def test_the_oracle_reads_a_row_by_its_group_and_the_writers_rows_by_the_group_their_id_names(tmp_path: Path) -> None:
    world = build(tmp_path / "warehouse", 300, 12)
    user, groups = next(iter(world.memberships.items()))
    mine = next(doc for doc, g in world.row_group.items() if g in groups)
    other = next(doc for doc, g in world.row_group.items() if g not in groups)
    assert world.readable(user, mine) and not world.readable(user, other)
    inside, outside = min(groups), next(g for g in range(40) if g not in groups)
    assert world.readable(user, f"w000001-g{inside:02d}") and not world.readable(user, f"w000002-g{outside:02d}")
    assert isinstance(world, ChurnWorld) and len(world.memberships) == 12 and all(len(g) == 3 for g in world.memberships.values())


@pytest.mark.slow  # a server process and a writer process, each loading the model: about a minute
def test_a_small_churn_run_answers_every_search_with_no_leak_while_the_writer_commits(tmp_path: Path) -> None:
    record = run(rows=2_000, users=40, first=5, seconds=3.0, batch=2, folder=tmp_path)
    assert set(record["modes"]) == set(MODES)
    for mode, cells in record["modes"].items():
        assert cells["first"]["searches"] == 5 and cells["warm"]["searches"] == 30, mode
        assert cells["churn"]["searches"] > 0 and cells["churn"]["commits"] > 0, f"{mode}: the writer committed nothing"
        assert all(cells[k]["errors"] == 0 and cells[k]["leaks"] == 0 for k in ("warm", "first", "churn")), cells
    assert set(record["targets"]) == {*MODES, "reader"} and record["machine"]["cpus"]
    work = record["reader_work"]
    assert work["rows"] >= 2_000 and set(work["bytes"]) == {"index", "tags", "terms"}
    assert set(work["move_ms"]) == {"append", "retag"} and all(cell["max"] > 0 for cell in work["move_ms"].values())
