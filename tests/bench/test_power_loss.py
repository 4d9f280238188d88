"""A small run of the power-loss benchmark: a replica and a writer SIGKILLed at random points,
the replica started again each time; every answer after a restart correct, nothing acknowledged
lost, every answered search receipted, the audit chain intact (the full run is
`python -m ragwarden.bench.power_loss`, 1M rows, in `make bench`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragwarden.bench.power_loss import run


@pytest.mark.slow  # a replica and a writer process started and killed twice: about half a minute
def test_a_small_power_loss_run_loses_nothing_acknowledged_and_answers_correctly_after_each_restart(tmp_path: Path) -> None:
    record = run(rows=3_000, trials=2, folder=tmp_path)
    assert record["all_correct"] and all(record["first_correct_answer_s"]), record
    assert record["acknowledged_documents"] > 0 and record["acknowledged_lost"] == 0, record
    assert record["answered_searches"] > 0 and record["receipts_lost"] == 0, record
    assert record["audit_ok"], record["audit_problems"]
