"""Lifecycle writes from several processes are serializable with respect to tags.

Three spawned processes run random ingests, syncs, derives, forgets and policy installs on one
warehouse, in rounds. At every quiescent point (between rounds) an independent check
(``support.lifecycle_workers``) finds every derived row exactly the propagation of its parents'
current tags and every document's chunks agreeing with its source record; and every table version
committed during the round whose files are still on disk (a forget's purge removes those of older
ones) is checked the same way, so no read at any version could have returned a derived row wider than its parents.

``RAGWARDEN_LIFECYCLE_ROUNDS`` sets the number of rounds (``make soak`` runs many).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import lifecycle_workers as lw
from support.raw_tables import raw_table

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.state.commit_retry import is_missing_file
from ragwarden.warehouse import Warehouse

ROUNDS = int(os.environ.get("RAGWARDEN_LIFECYCLE_ROUNDS", "6"))
WORKERS, OPERATIONS = 3, 5
COLUMNS = ["chunk_id", "doc_id", "kind", "tenant", "acl_allow", "acl_deny", "acl_clauses", "labels",
           "classification", "parents", "doc_version"]  # fmt: skip


def _rows_at(warehouse: Warehouse, version: int | None = None) -> list[dict[str, Any]]:
    table = raw_table(warehouse.store, "chunks")
    if version is not None:
        table.checkout(version)
    return table.to_lance().to_table(columns=COLUMNS).to_pylist()


def _sources(warehouse: Warehouse) -> list[dict[str, Any]]:
    return raw_table(warehouse.store, "sources").to_arrow().to_pylist()


@pytest.fixture
def shared_lineage_warehouse(tmp_path: Path, onnx_embedder: Embedder) -> Warehouse:
    """Four documents under random tags, notes over pairs of them and a note over notes: every
    document's tags reach derived rows that other documents' tags reach too."""
    warehouse = Warehouse(Settings(warehouse=str(tmp_path / "wh")), embedder=onnx_embedder)
    policy = tmp_path / "policy.csv"
    policy.write_text(lw.policy_text(0), encoding="utf-8")
    warehouse.install_policy(policy)
    rng = random.Random(7)
    records = [lw.random_record(rng, doc, text_variant=0) for doc in lw.DOCUMENTS]
    for record in records:  # root, who derives, reads every document at the start
        record["acl"] = {"allow": sorted({*record["acl"]["allow"], lw.ACTOR}), "deny": []}
    assert warehouse.ingest_records(records).ok
    first = {doc: warehouse.store.chunks.chunk_ids_of(doc, lw.TENANT)[0] for doc in lw.DOCUMENTS}

    def derive(text: str, parents: list[str]) -> str:
        return warehouse.derive(text, parents=parents, subject=lw.ACTOR, tenant=lw.TENANT, kind="note").chunk_id

    notes = [derive(f"note over {a} and {b}", [first[a], first[b]]) for a, b in (("d0", "d1"), ("d1", "d2"), ("d2", "d3"))]
    derive("note over notes", notes[:2])
    return warehouse


@pytest.mark.slow
@pytest.mark.usefixtures("onnx_workers")
def test_concurrent_lifecycle_writes_leave_every_derived_row_exactly_its_parents_propagation(
    shared_lineage_warehouse: Warehouse, tmp_path: Path
):
    warehouse = shared_lineage_warehouse
    assert not lw.lineage_violations(_rows_at(warehouse), warehouse.store.registries.clauses())
    context = multiprocessing.get_context("spawn")
    start, barrier = context.Event(), context.Barrier(WORKERS + 1)
    results = [tmp_path / f"worker-{n}.json" for n in range(WORKERS)]
    processes = [
        context.Process(
            target=lw.worker,
            args=(warehouse.uri, f"w{n}", 1000 + n, ROUNDS, OPERATIONS, barrier, start, str(results[n])),
        )
        for n in range(WORKERS)
    ]
    for process in processes:
        process.start()
    start.set()
    checked_version = warehouse.store.chunks.version
    versions_checked = 0
    problems: list[str] = []
    try:
        for round_ in range(ROUNDS):
            barrier.wait(300)  # every worker is between rounds: nothing is being written
            registry = warehouse.store.registries.clauses()
            latest = warehouse.store.chunks.version
            problems += [f"round {round_}: {p}" for p in lw.lineage_violations(_rows_at(warehouse), registry)]
            problems += [f"round {round_}: {p}" for p in lw.document_violations(_rows_at(warehouse), _sources(warehouse))]
            kept = {v["version"] for v in raw_table(warehouse.store).list_versions()}
            for version in sorted(v for v in kept if checked_version < v <= latest):
                try:
                    rows = _rows_at(warehouse, version)
                except Exception as exc:  # a forget's purge removed the files of this version
                    if not is_missing_file(exc):
                        raise
                    continue
                found = lw.lineage_violations(rows, registry)
                problems += [f"round {round_}, version {version}: {p}" for p in found]
                versions_checked += 1
            checked_version = latest
            barrier.wait(300)
    finally:
        for process in processes:
            process.join(600)
    outcomes = [json.loads(result.read_text()) for result in results]
    assert problems == [], "\n".join(problems)
    errors = [error for outcome in outcomes for error in outcome["errors"]]
    assert errors == [], "\n".join(errors)
    done = Counter(operation for o in outcomes for operation in o["done"])
    assert done["sync"] and done["derive"] and done["ingest"], done
    assert versions_checked > ROUNDS, "the versions written during the rounds were checked one by one"
