"""Audit views are the tenant's own and say what happened: lineage and receipts hold no other
tenant's receipt, "returned" means returned, refused probes read as refused; operator runs leave a
receipt in every tenant they touched; an erasure leaves a tombstone, never the erased content."""

from __future__ import annotations

import json

import pytest

from ragwarden.errors import NotFoundError
from ragwarden.warehouse import OPERATOR, Warehouse

SENTINEL = "call Ruiz on +1-555-0137-wombat"


@pytest.fixture
def probed_warehouse(small_warehouse: Warehouse) -> Warehouse:
    """The small corpus; alice's search returns the acme budget; dave (acme) and hank (globex) probe
    it by id with get and explain, and are refused."""
    wh = small_warehouse
    (budget,) = wh.store.chunks.chunk_ids_of("acme-budget")
    assert {h.chunk_id for h in wh.search("quarterly budget", subject="user:alice", tenant="acme", k=3)} >= {budget}
    for subject, tenant in (("user:dave", "acme"), ("user:hank", "globex")):
        with pytest.raises(NotFoundError):
            wh.get_chunk(budget, subject=subject, tenant=tenant)
        assert not wh.explain(budget, subject=subject, tenant=tenant).allowed
    return wh


def test_lineage_holds_no_receipt_of_another_tenant(probed_warehouse: Warehouse):
    lineage = probed_warehouse.lineage("acme-budget", caller="user:carol", tenant="acme")
    subjects = {r["subject"] for r in lineage["receipts"]}
    assert "user:hank" not in subjects and {"user:alice", "user:dave"} <= subjects
    for view in (probed_warehouse.receipts(caller="user:carol", tenant="acme"), probed_warehouse.audit.query(tenant="acme")):
        assert {r.tenant for r in view} == {"acme"}
    operator_view = probed_warehouse.lineage("acme-budget")  # the operator's view is the item's tenant's too
    assert "user:hank" not in {r["subject"] for r in operator_view["receipts"]}


def test_lineage_says_returned_only_of_rows_returned_and_lists_refused_probes_as_refused(probed_warehouse: Warehouse):
    (budget,) = probed_warehouse.store.chunks.chunk_ids_of("acme-budget")
    receipts = probed_warehouse.lineage("acme-budget", caller="user:carol", tenant="acme")["receipts"]
    outcomes = {(r["subject"], r["operation"]): (r["outcome"], r["returned"], r["rows"]) for r in receipts}
    assert outcomes[("user:alice", "search")] == ("returned", [budget], [budget])
    assert outcomes[("user:dave", "get")] == ("refused", [], [budget])
    assert outcomes[("user:dave", "explain")] == ("explained: not visible", [], [budget])
    assert outcomes[(OPERATOR, "ingest")] == ("ingested", [], [])
    assert all(r["returned"] == [] for r in receipts if r["outcome"] != "returned")


def test_an_operators_run_leaves_a_receipt_in_each_tenant_it_touched_naming_only_its_documents(small_warehouse: Warehouse):
    ingests = small_warehouse.audit.query(operation="ingest")
    assert sorted((r.tenant, r.doc_ids) for r in ingests) == [("acme", ("acme-memo", "acme-budget")), ("globex", ("globex-plan",))]
    assert all(r.subject == OPERATOR for r in ingests)
    small_warehouse.sync([{"id": "globex-plan", "tenant": "globex", "acl": {"allow": ["group:hr"]}, "labels": [],
                           "classification": "internal"}])  # fmt: skip
    (sync,) = small_warehouse.audit.query(operation="sync")
    assert (sync.tenant, sync.doc_ids) == ("globex", ("globex-plan",))
    assert [r.operation for r in small_warehouse.receipts(caller="user:carol", tenant="acme", operation="sync")] == []


def test_a_forgotten_document_leaves_a_tombstone_in_its_tenants_lineage_and_no_content(small_warehouse: Warehouse):
    wh = small_warehouse
    assert wh.ingest_records([{"id": "acme-call", "text": f"Please {SENTINEL} before Friday.", "tenant": "acme",
                               "acl": {"allow": ["everyone"]}, "classification": "public"}]).ok  # fmt: skip
    (chunk,) = wh.store.chunks.chunk_ids_of("acme-call")
    note = wh.derive(f"Reminder: {SENTINEL}.", parents=[chunk], subject="user:alice", tenant="acme", kind="memory")
    wh.search("call Ruiz", subject="user:dave", tenant="acme", k=3)
    report = wh.forget("acme-call", reason="erasure request 7")
    lineage = wh.lineage("acme-call", caller="user:carol", tenant="acme")
    (tombstone,) = lineage["tombstones"]
    assert tombstone["erased"] == {"chunks": [chunk], "derived": [note.chunk_id]} and tombstone["reason"] == "erasure request 7"
    assert tombstone["subject"] == OPERATOR and tombstone["versions_left"] == {"chunks": 1, "sources": 1}
    assert tombstone["table_version"] == report.table_version
    assert {"returned", "erased", "ingested", "derived"} <= {r["outcome"] for r in lineage["receipts"]}
    (receipt,) = wh.receipts(caller="user:carol", tenant="acme", operation="forget")
    assert "wombat" not in json.dumps(receipt.details, default=dict) + json.dumps(lineage, default=dict)
    with pytest.raises(NotFoundError):
        wh.lineage("acme-call", tenant="globex")  # in another tenant its tombstone reads as missing


def test_a_derived_row_is_forgotten_by_its_own_id_with_everything_derived_from_it(small_warehouse: Warehouse):
    wh = small_warehouse
    (memo,) = wh.store.chunks.chunk_ids_of("acme-memo")
    memory = wh.derive(f"The user asked us to {SENTINEL}.", parents=[memo], subject="user:dave", tenant="acme", kind="memory")
    summary = wh.derive("Summary of a memory.", parents=[memory.chunk_id], subject="user:dave", tenant="acme")
    folder = wh.store.local_path
    assert folder is not None
    on_disk = lambda: [p for p in folder.rglob("*") if p.is_file() and SENTINEL.encode() in p.read_bytes()]  # noqa: E731
    assert on_disk(), "positive control: the memory's text is on disk before the erasure"

    with pytest.raises(NotFoundError):  # another tenant's administrator meets it as missing
        wh.forget(memory.chunk_id, reason="wrong tenant", subject="user:admin", tenant="globex")
    report = wh.forget(memory.chunk_id, reason="the user asked", subject="user:admin", tenant="acme")
    assert (report.erased_chunks, report.erased_derived) == ((), (memory.chunk_id, summary.chunk_id))
    assert wh.store.chunks.rows([memory.chunk_id, summary.chunk_id]) == {} and wh.store.chunks.chunk_ids_of("acme-memo") == [memo]
    assert on_disk() == []
    (tombstone,) = wh.lineage(memory.chunk_id, caller="user:carol", tenant="acme")["tombstones"]
    assert tombstone["item"] == memory.chunk_id and tombstone["subject"] == "user:admin"
    with pytest.raises(NotFoundError):  # a source chunk goes only with its document
        wh.forget(memo, reason="one chunk alone")
