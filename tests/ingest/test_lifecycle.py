"""derive, sync and forget: tags follow lineage, changes reach every derived row, erasure is physical."""

from __future__ import annotations

import numpy as np
import pytest
from support.racing import between_commit_and_record, racing
from support.raw_tables import raw_table

from ragwarden.errors import InvalidRequestError, NotFoundError, WarehouseError
from ragwarden.warehouse import Warehouse

SENTINEL = "Zqxv-SENTINEL-7731-wombat"


def doc(doc_id: str, text: str, allow: list[str], labels: list[str] = (), level: str = "internal", deny=()) -> dict:
    return {
        "id": doc_id,
        "text": text,
        "tenant": "acme",
        "acl": {"allow": list(allow), "deny": list(deny)},
        "labels": list(labels),
        "classification": level,
    }


@pytest.fixture
def lifecycle_warehouse(demo_policy_warehouse: Warehouse) -> Warehouse:
    """Demo policy; a finance report (alice), a staff note (alice, bob, dave), a legal memo (carol)."""
    demo_policy_warehouse.ingest_records(
        [
            doc("fin", "Q3 revenue grew eleven percent on hardware sales.", ["group:finance"], ["finance"], "confidential"),
            doc("staff", "The office closes early on Friday for the summer party.", ["group:staff"]),
            doc("legal", "The litigation hold on the Ruiz matter stays in force.", ["group:legal"], ["legal"], "confidential"),
        ]
    )
    return demo_policy_warehouse


def chunk_of(warehouse: Warehouse, doc_id: str) -> str:
    (chunk_id,) = warehouse.store.chunks.chunk_ids_of(doc_id)
    return chunk_id


def visible_ids(warehouse: Warehouse, subject: str, query: str = "summary of revenue and the office") -> set[str]:
    return {h.chunk_id for h in warehouse.search(query, subject=subject, tenant="acme", k=50)}


def test_a_derived_row_is_visible_only_to_who_could_read_every_parent(lifecycle_warehouse):
    wh = lifecycle_warehouse
    parents = [chunk_of(wh, "fin"), chunk_of(wh, "staff")]
    row = wh.derive("Revenue up; office closes early Friday.", parents=parents, subject="user:alice", tenant="acme")
    assert row.tags.labels == frozenset({"finance"})
    assert int(row.tags.classification) == 2 and len(row.tags.acl_clauses) == 2
    assert row.chunk_id in visible_ids(wh, "user:alice")
    assert row.chunk_id not in visible_ids(wh, "user:dave")  # sees the staff note, not the finance report
    assert row.chunk_id not in visible_ids(wh, "user:carol")
    stored = wh.store.chunks.rows([row.chunk_id])[row.chunk_id]
    assert (stored["kind"], stored["parents"]) == ("summary", sorted(parents))


def test_deriving_from_an_invisible_parent_is_refused_like_a_missing_one(lifecycle_warehouse):
    wh = lifecycle_warehouse
    with pytest.raises(NotFoundError) as invisible:
        wh.derive("note", parents=[chunk_of(wh, "staff"), chunk_of(wh, "legal")], subject="user:dave", tenant="acme")
    with pytest.raises(NotFoundError) as missing:
        wh.derive("note", parents=[chunk_of(wh, "staff"), "no-such-chunk"], subject="user:dave", tenant="acme")
    assert str(invisible.value).replace(chunk_of(wh, "legal"), "X") == str(missing.value).replace("no-such-chunk", "X")
    with pytest.raises(NotFoundError):
        wh.derive("note", parents=[chunk_of(wh, "staff")], subject="user:erin", tenant="globex")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"text": " "}, "text is empty"), ({"kind": "essay"}, "kind 'essay'"), ({"parents": []}, "parents must be")],
)
def test_bad_derive_arguments_are_refused(lifecycle_warehouse, kwargs, message):
    args = {"text": "note", "parents": [chunk_of(lifecycle_warehouse, "staff")], "subject": "user:dave", "tenant": "acme"}
    with pytest.raises(InvalidRequestError, match=message):
        lifecycle_warehouse.derive(**(args | kwargs))


def test_sync_retags_chunks_and_derived_rows_transitively_without_reembedding(lifecycle_warehouse):
    wh = lifecycle_warehouse
    summary = wh.derive("Staff summary: early Friday.", parents=[chunk_of(wh, "staff")], subject="user:dave", tenant="acme")
    memory = wh.derive("Dave remembers: Friday.", parents=[summary.chunk_id], subject="user:dave", tenant="acme", kind="memory")
    ids = [chunk_of(wh, "staff"), summary.chunk_id, memory.chunk_id]
    vectors = {r["chunk_id"]: np.asarray(r["vector"], dtype=np.float32).tobytes() for r in raw_table(wh.store).search().limit(None).to_list()}
    assert set(ids) <= visible_ids(wh, "user:dave", "Friday")

    report = wh.sync([doc("staff", "", ["group:finance"], ["finance"], "confidential")])
    assert (report.chunks, report.derived) == (1, 2)
    assert list(report.tags) == wh.store.sources.tags(report.keys)  # the report says the tags it wrote
    assert not set(ids) & visible_ids(wh, "user:dave", "Friday")
    assert set(ids) <= visible_ids(wh, "user:alice", "Friday")
    rows = wh.store.chunks.rows(ids)
    assert all(rows[i]["labels"] == ["finance"] and rows[i]["classification"] == 2 for i in ids)
    after = {r["chunk_id"]: np.asarray(r["vector"], dtype=np.float32).tobytes() for r in raw_table(wh.store).search().limit(None).to_list()}
    assert after == vectors


def test_sync_of_an_unknown_or_other_tenant_document_changes_nothing(lifecycle_warehouse):
    version = lifecycle_warehouse.store.chunks.version
    with pytest.raises(NotFoundError, match="'nope' not found"):
        lifecycle_warehouse.sync([doc("staff", "", ["everyone"]), doc("nope", "", ["everyone"])])
    assert lifecycle_warehouse.store.chunks.version == version


def test_forget_erases_the_source_and_its_derived_rows_from_every_file(lifecycle_warehouse, tmp_path):
    wh = lifecycle_warehouse
    wh.ingest_records([doc("secret", f"The code word is {SENTINEL} and must not survive.", ["group:staff"])])
    summary = wh.derive(f"Summary: the code word is {SENTINEL}.", parents=[chunk_of(wh, "secret")], subject="user:dave", tenant="acme")
    assert wh.search(SENTINEL, subject="user:dave", tenant="acme", k=5, mode="fts")
    warehouse_dir = tmp_path / "warehouse"

    def files_holding_sentinel() -> list[str]:
        needle = SENTINEL.encode()
        return [str(p.relative_to(warehouse_dir)) for p in warehouse_dir.rglob("*") if p.is_file() and needle in p.read_bytes()]

    assert files_holding_sentinel(), "positive control: the sentinel must be on disk before forget"
    report = wh.forget("secret", reason="erasure request #42")
    assert (report.chunks, report.derived) == (1, 1)
    assert files_holding_sentinel() == []
    assert wh.search(SENTINEL, subject="user:dave", tenant="acme", k=5, mode="fts") == []
    assert summary.chunk_id not in wh.store.chunks.rows([summary.chunk_id])
    assert wh.store.sources.states([("acme", "secret")]) == {}
    assert wh.store.maintenance.versions_left() == {"chunks": 1, "sources": 1}
    assert {h.doc_id for h in wh.search("office Friday", subject="user:dave", tenant="acme", k=5)} == {"staff"}


def test_forget_needs_a_reason_and_an_existing_document(lifecycle_warehouse):
    with pytest.raises(InvalidRequestError, match="reason is required"):
        lifecycle_warehouse.forget("staff", reason=" ")
    with pytest.raises(NotFoundError):
        lifecycle_warehouse.forget("never-ingested", reason="test")


def test_hits_carry_versions_and_min_version_is_honoured(lifecycle_warehouse):
    wh = lifecycle_warehouse
    (hit,) = wh.search("office", subject="user:dave", tenant="acme", k=1)
    assert hit.table_version == wh.store.chunks.version and hit.policy_version == wh.policy.version
    assert wh.search("office", subject="user:dave", tenant="acme", k=1, min_version=hit.table_version)
    with pytest.raises(WarehouseError, match="older than"):
        wh.search("office", subject="user:dave", tenant="acme", k=1, min_version=hit.table_version + 100)


def test_reingesting_with_narrower_tags_retags_the_derived_rows(lifecycle_warehouse):
    wh = lifecycle_warehouse
    staff = doc("staff", "The office closes early on Friday for the summer party.", ["group:staff"])
    summary = wh.derive("Early Friday.", parents=[chunk_of(wh, "staff")], subject="user:dave", tenant="acme")
    assert summary.chunk_id in visible_ids(wh, "user:dave", "Friday")
    wh.ingest_records([{**staff, "acl": {"allow": ["group:finance"]}}])  # same text, narrower ACL
    assert summary.chunk_id not in visible_ids(wh, "user:dave", "Friday")
    assert summary.chunk_id in visible_ids(wh, "user:alice", "Friday")


def test_reingesting_changed_text_removes_rows_derived_from_the_old_chunks(lifecycle_warehouse):
    wh = lifecycle_warehouse
    summary = wh.derive("Early Friday.", parents=[chunk_of(wh, "staff")], subject="user:dave", tenant="acme")
    wh.ingest_records([doc("staff", "The office now closes at the usual time.", ["group:staff"])])
    assert wh.store.chunks.rows([summary.chunk_id]) == {}
    assert summary.chunk_id not in visible_ids(wh, "user:dave", "Friday")


def test_explain_reads_another_tenants_row_as_missing(lifecycle_warehouse):
    row = chunk_of(lifecycle_warehouse, "staff")
    other = lifecycle_warehouse.explain(row, subject="user:erin", tenant="globex", caller="user:erin")
    missing = lifecycle_warehouse.explain("no-such-row", subject="user:erin", tenant="globex", caller="user:erin")
    assert (other.allowed, other.reason, other.steps) == (missing.allowed, missing.reason, missing.steps)


def test_a_tenant_admin_syncing_another_tenants_document_meets_not_found_like_an_unknown_id(lifecycle_warehouse):
    wh = lifecycle_warehouse
    wh.ingest_records([{**doc("globex-only", "Globex board minutes.", ["group:staff"]), "tenant": "globex"}])
    version, before = wh.store.chunks.version, wh.store.sources.tags([("globex", "globex-only")])
    errors = []
    for doc_id in ("globex-only", "never-ingested"):
        with pytest.raises(NotFoundError) as caught:
            wh.sync([doc(doc_id, "", ["everyone"])], subject="user:admin", tenant="acme")
        errors.append(str(caught.value).replace(doc_id, "ID"))
    assert errors[0] == errors[1]  # the other tenant's document reads exactly as a missing one
    assert wh.store.chunks.version == version and wh.store.sources.tags([("globex", "globex-only")]) == before


def test_forget_leaves_another_tenants_document_named_like_one_of_its_chunks(lifecycle_warehouse):
    """A source chunk names its document as parent: a globex document whose id is one of acme's
    chunk ids must not read as derived from that chunk when acme's document is forgotten."""
    wh = lifecycle_warehouse
    (staff_chunk,) = wh.store.chunks.chunk_ids_of("staff", "acme")
    wh.ingest_records([{**doc(staff_chunk, "Globex canteen menu for June.", ["group:staff"]), "tenant": "globex"}])
    globex_chunks = wh.store.chunks.chunk_ids_of(staff_chunk, "globex")
    assert globex_chunks

    report = wh.forget("staff", tenant="acme", reason="test")
    assert (report.chunks, report.derived) == (1, 0)
    assert wh.store.chunks.chunk_ids_of(staff_chunk, "globex") == globex_chunks
    assert wh.store.sources.document_tenants(staff_chunk) == ["globex"]


def test_a_sync_that_loses_a_commit_race_derives_again_from_the_winners_tags(lifecycle_warehouse, monkeypatch):
    wh = lifecycle_warehouse
    note = wh.derive("Revenue up; office closes early Friday.", parents=[chunk_of(wh, "fin"), chunk_of(wh, "staff")],
                     subject="user:alice", tenant="acme")  # fmt: skip
    replica = Warehouse(wh.settings, embedder=wh.embedder)  # a second handle: another replica
    planned = racing(wh, monkeypatch, lambda: replica.sync([doc("staff", "", ["group:staff"], ["hr"])]))
    wh.sync([doc("fin", "", ["user:alice"], ["finance"], "confidential")])  # narrowed: finance -> alice only
    assert len(planned) == 2 and planned[1] > planned[0], "the losing sync planned again, from the winner's version"
    tags = wh.store.chunks.rows([note.chunk_id])[note.chunk_id]
    assert sorted(tags["labels"]) == ["finance", "hr"]  # the winner's label kept
    assert sorted(tags["acl_allow"]) == ["group:staff", "user:alice"]  # the narrowed ACL applied
    assert note.chunk_id not in visible_ids(wh, "user:olivia")  # finance, but no longer on fin's ACL


def test_a_derive_racing_a_sync_of_its_parent_takes_the_parents_new_tags(lifecycle_warehouse, monkeypatch):
    wh = lifecycle_warehouse
    replica = Warehouse(wh.settings, embedder=wh.embedder)
    retag = doc("staff", "", ["group:staff"], ["finance"], deny=["user:dave"])  # alice may still read it
    planned = racing(wh, monkeypatch, lambda: replica.sync([retag]))
    note = wh.derive("Office closes early Friday.", parents=[chunk_of(wh, "staff")], subject="user:alice", tenant="acme")
    assert len(planned) == 2
    assert note.tags.labels == frozenset({"finance"}) and note.tags.acl_deny == frozenset({"user:dave"})
    stored = wh.store.chunks.rows([note.chunk_id])[note.chunk_id]
    assert (stored["labels"], stored["acl_deny"]) == (["finance"], ["user:dave"])


def test_a_derive_racing_the_erasure_of_its_parent_is_refused_and_leaves_no_row(lifecycle_warehouse, monkeypatch):
    wh = lifecycle_warehouse
    parent = chunk_of(wh, "staff")
    replica = Warehouse(wh.settings, embedder=wh.embedder)
    racing(wh, monkeypatch, lambda: replica.forget("staff", reason="erasure request", tenant="acme"))
    with pytest.raises(NotFoundError):
        wh.derive("Office closes early Friday.", parents=[parent], subject="user:alice", tenant="acme")
    assert [r for r in raw_table(wh.store).search().select(["chunk_id", "kind"]).limit(None).to_list() if r["kind"] != "chunk"] == []


def test_an_erasure_cut_short_still_keeps_an_ingest_from_bringing_the_document_back(lifecycle_warehouse, monkeypatch):
    wh = lifecycle_warehouse

    def cut(*_: object, **__: object) -> None:
        raise WarehouseError("the process died here")

    monkeypatch.setattr(type(wh.store.chunks), "write", cut)
    with pytest.raises(WarehouseError):
        wh.forget("fin", tenant="acme", reason="erasure request 7")
    monkeypatch.undo()
    report = wh.ingest_records([doc("fin", "Q3 revenue grew twelve percent.", ["group:finance"], ["finance"], "confidential")])
    assert report.documents == 0 and [r.reason.split(" was erased")[0] for r in report.rejected] == ["'fin' of tenant 'acme'"]
    assert wh.forget("fin", tenant="acme", reason="erasure request 7, again").chunks == 1  # the erasure completes


def test_a_retag_landing_between_an_ingests_commit_and_its_record_leaves_the_record_saying_what_the_chunks_hold(
    lifecycle_warehouse, monkeypatch
):
    wh = lifecycle_warehouse
    replica = Warehouse(wh.settings, embedder=wh.embedder)
    retag = doc("staff", "", ["group:staff"], ["hr"])
    between_commit_and_record(wh, monkeypatch, lambda: replica.sync([retag]))
    wh.ingest_records([doc("staff", "The office closes at noon on Friday.", ["group:staff"])])
    (chunk,) = wh.store.chunks.rows(wh.store.chunks.chunk_ids_of("staff", "acme")).values()
    state = wh.store.sources.states([("acme", "staff")])[("acme", "staff")]
    assert chunk["text"] == "The office closes at noon on Friday." and chunk["labels"] == ["hr"]  # new text, later tags
    assert state.doc_version == chunk["doc_version"], "the record names the content the chunks hold"
    assert wh.store.sources.tags([("acme", "staff")])[0].labels == frozenset({"hr"})
    assert wh.ingest_records([doc("staff", "The office closes at noon on Friday.", ["group:staff"], ["hr"])]).documents == 0


def test_an_ingest_decided_before_an_erasure_and_committed_after_it_is_refused(lifecycle_warehouse, monkeypatch):
    wh = lifecycle_warehouse
    replica = Warehouse(wh.settings, embedder=wh.embedder)
    racing(wh, monkeypatch, lambda: replica.forget("fin", reason="erasure request 9", tenant="acme"))
    report = wh.ingest_records([
        doc("fin", "Q3 revenue grew twelve percent.", ["group:finance"], ["finance"], "confidential"),
        doc("staff", "The office closes at noon on Friday.", ["group:staff"]),
    ])  # fmt: skip
    assert report.documents == 1 and [r.reason.split(" was erased")[0] for r in report.rejected] == ["'fin' of tenant 'acme'"]
    assert wh.store.chunks.chunk_ids_of("fin", "acme") == [] and wh.store.sources.states([("acme", "fin")]) == {}
    assert "noon" in wh.store.chunks.rows(wh.store.chunks.chunk_ids_of("staff", "acme")).popitem()[1]["text"]


def test_an_erasure_mark_is_per_tenant_and_another_tenants_document_of_that_id_is_written(lifecycle_warehouse):
    wh = lifecycle_warehouse
    wh.forget("staff", tenant="acme", reason="test")
    report = wh.ingest_records([{**doc("staff", "Globex staff note.", ["group:staff"]), "tenant": "globex"}])
    assert (report.documents, report.rejected) == (1, ())
    assert wh.store.erasures.of([("acme", "staff"), ("globex", "staff")]).keys() == {("acme", "staff")}
