"""Two ingest processes and two searching processes on one warehouse at once: no errors, no torn
reads (an answer never holds chunks of two versions of one document), nothing lost."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
from support import warehouse_workers
from support.raw_tables import raw_table

from ragwarden.warehouse import Warehouse

DOCUMENTS, ROUNDS = 6, 3


@pytest.mark.slow
@pytest.mark.usefixtures("onnx_workers")
def test_two_writers_and_two_readers_share_a_warehouse_without_errors_or_torn_reads(
    demo_policy_warehouse: Warehouse, tmp_path: Path
):
    uri = demo_policy_warehouse.uri
    first = demo_policy_warehouse.ingest_records([warehouse_workers.document(f"w{w}-{i}", 0) for w in (1, 2)
                                                  for i in range(DOCUMENTS)])  # fmt: skip
    assert first.ok and first.chunks >= 2 * len(first.written), "each document needs several chunks for a torn read to show"
    context = multiprocessing.get_context("spawn")
    start, stop = context.Event(), tmp_path / "stop"
    writers = [tmp_path / f"writer-{w}.json" for w in (1, 2)]
    readers = [tmp_path / f"reader-{r}.json" for r in (1, 2)]
    processes = [
        context.Process(target=warehouse_workers.writer, args=(uri, f"w{w}", DOCUMENTS, ROUNDS, start, str(out)))
        for w, out in zip((1, 2), writers, strict=True)
    ] + [
        context.Process(target=warehouse_workers.reader, args=(uri, subject, str(stop), start, str(out)))
        for subject, out in zip(("user:alice", "user:dave"), readers, strict=True)
    ]
    for process in processes:
        process.start()
    start.set()
    for process in processes[:2]:
        process.join(600)
    stop.touch()
    for process in processes[2:]:
        process.join(120)
    assert all(process.exitcode == 0 for process in processes)

    for out in writers:
        outcome = json.loads(out.read_text())
        assert outcome == {"errors": [], "rounds": ROUNDS}, outcome
    searched = 0
    for out in readers:
        outcome = json.loads(out.read_text())
        assert outcome["errors"] == [] and outcome["torn"] == [], outcome
        searched += outcome["searches"]
        assert outcome["hits"] > 0
    assert searched >= 4

    final = demo_policy_warehouse.search("ledger budget forecast round", subject="user:alice", tenant="acme", k=100)
    assert {hit.doc_id for hit in final} == {f"w{w}-{i}" for w in (1, 2) for i in range(DOCUMENTS)}
    assert all(f"Round {ROUNDS - 1} of " in hit.text for hit in final)
    ids = [row["chunk_id"] for row in raw_table(demo_policy_warehouse.store).search().select(["chunk_id"]).limit(None).to_list()]
    assert len(ids) == len(set(ids))
