"""The writer: idempotent, atomic per document, tags inherited exactly, never re-embeds."""

from __future__ import annotations

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from support.racing import racing
from support.raw_tables import raw_table

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.errors import InvalidRequestError
from ragwarden.warehouse import Warehouse

LONG = " ".join(f"Paragraph {i}: the budget for team {i % 7} grows by {i} percent next year." for i in range(120))


class CountingEmbedder(Embedder):
    """The real embedder, counting how many texts it was asked to encode."""

    def __init__(self) -> None:
        super().__init__()
        self.encoded = 0

    def encode(self, texts: list[str]) -> np.ndarray:
        self.encoded += len(texts)
        return super().encode(texts)


class FailingEmbedder(Embedder):
    """The real embedder, failing whenever a text mentions the word 'explode'."""

    def encode(self, texts: list[str]) -> np.ndarray:
        if any("explode" in t for t in texts):
            raise RuntimeError("embedding failed")
        return super().encode(texts)


def chunk_rows(warehouse: Warehouse, doc_id: str) -> list[dict]:
    return raw_table(warehouse.store).search().where(f"doc_id = '{doc_id}'").limit(None).to_list()


def test_chunks_table_has_the_design_columns_with_their_types(fresh_warehouse):
    schema = raw_table(fresh_warehouse.store).to_lance().schema  # as the table holds it
    expected = {
        "chunk_id": pa.string(),
        "doc_id": pa.string(),
        "source_uri": pa.string(),
        "doc_version": pa.string(),
        "text": pa.string(),
        "vector": pa.list_(pa.float32(), 384),
        "tenant": pa.string(),
        "acl_allow": pa.list_(pa.string()),
        "acl_deny": pa.list_(pa.string()),
        "labels": pa.list_(pa.string()),
        "classification": pa.int8(),
        "parents": pa.list_(pa.string()),
        "ingest_run_id": pa.string(),
        "embedding_model": pa.string(),
        "created_at": pa.timestamp("us", tz="UTC"),
        "metadata": pa.json_(),
    }
    for name, arrow_type in expected.items():
        assert schema.field(name).type == arrow_type, name
    sources = set(raw_table(fresh_warehouse.store, "sources").schema.names)
    assert {"doc_id", "uri", "doc_version", "tenant", "acl_allow", "labels", "classification", "ingested_at"} <= sources


def test_every_chunk_inherits_its_documents_tags_exactly(fresh_warehouse, make_record):
    record = make_record(
        text=LONG, acl={"allow": ["group:finance", "user:zed"], "deny": ["user:bob"]}, labels=["finance", "pii"]
    )
    report = fresh_warehouse.ingest_records([record])
    rows = chunk_rows(fresh_warehouse, "doc-1")
    assert report.chunks == len(rows) > 1
    for row in rows:
        assert row["tenant"] == "acme"
        assert row["acl_allow"] == ["group:finance", "user:zed"]
        assert row["acl_deny"] == ["user:bob"]
        assert row["labels"] == ["finance", "pii"]
        assert row["classification"] == 1
        assert row["parents"] == ["doc-1"]
        assert row["ingest_run_id"] == report.run_id
        assert row["embedding_model"].startswith("sentence-transformers/all-MiniLM-L6-v2")


def test_reingesting_unchanged_documents_writes_nothing(fresh_warehouse, make_record):
    records = [make_record(id=f"doc-{i}", text=f"Note {i}: {LONG[:300]}") for i in range(5)]
    fresh_warehouse.ingest_records(records)
    versions = (fresh_warehouse.store.chunks.version, raw_table(fresh_warehouse.store, "sources").version)
    again = fresh_warehouse.ingest_records(records)
    assert (again.documents, again.unchanged, again.chunks) == (0, 5, 0)
    assert (fresh_warehouse.store.chunks.version, raw_table(fresh_warehouse.store, "sources").version) == versions


def test_changed_document_replaces_its_chunks_so_no_version_shows_both_or_neither(fresh_warehouse, make_record):
    fresh_warehouse.ingest_records([make_record(text=LONG)])
    first = fresh_warehouse.store.chunks.version
    fresh_warehouse.ingest_records([make_record(text=LONG.replace("budget", "forecast"))])
    fresh_warehouse.ingest_records([make_record(text="A short third version.")])
    db = lancedb.connect(fresh_warehouse.uri)
    table = db.open_table("chunks")
    seen_versions = set()
    for version in range(first, fresh_warehouse.store.chunks.version + 1):
        table.checkout(version)
        doc_versions = {row["doc_version"] for row in table.search().where("doc_id = 'doc-1'").limit(None).to_list()}
        assert len(doc_versions) == 1, f"table version {version} shows {len(doc_versions)} document versions"
        seen_versions |= doc_versions
    assert len(seen_versions) == 3
    assert [r["text"] for r in chunk_rows(fresh_warehouse, "doc-1")] == ["A short third version."]


@pytest.mark.parametrize("state", ["new", "just erased"])
def test_two_ingests_of_a_document_without_chunks_at_once_leave_only_the_later_commits_text(
    demo_policy_warehouse, make_record, monkeypatch, state
):
    wh = demo_policy_warehouse
    if state == "just erased":
        wh.ingest_records([make_record(text="The original travel policy.")])
        wh.forget("doc-1", tenant="acme", reason="erasure request")
    replica = Warehouse(wh.settings, embedder=wh.embedder)  # a second handle: another replica
    wider = make_record(text="Draft: the travel budget is open to everyone.", acl={"allow": ["group:staff"], "deny": []})
    narrower = make_record(text="Final: the travel budget is for finance only.")
    notes: list[str] = []

    restore = state == "just erased"  # both ingests bring the erased document back on purpose

    def rival() -> None:  # ingests the document, and derives a note from it, between our plan and commit
        assert replica.ingest_records([wider], restore_erased=restore).ok
        parent = replica.store.chunks.chunk_ids_of("doc-1", "acme")
        notes.append(replica.derive("Travel is open.", parents=parent, subject="user:alice", tenant="acme").chunk_id)

    racing(wh, monkeypatch, rival)
    assert wh.ingest_records([narrower], restore_erased=restore).ok
    assert notes, "the rival committed between our plan and our commit"
    rows = chunk_rows(wh, "doc-1")
    assert [r["text"] for r in rows] == [narrower["text"]]
    assert {r["kind"] for r in rows} == {"chunk"} and sorted(rows[0]["acl_allow"]) == ["group:finance"]
    assert wh.store.chunks.rows(notes) == {}, "the note derived from the superseded text went with it"
    (record,) = raw_table(wh.store, "sources").to_arrow().to_pylist()
    assert record["doc_version"] == rows[0]["doc_version"]


def test_retagging_keeps_vectors_byte_identical_without_reembedding(tmp_path, make_record):
    embedder = CountingEmbedder()
    warehouse = Warehouse(Settings(warehouse=str(tmp_path / "wh")), embedder=embedder)
    warehouse.ingest_records([make_record(text=LONG)])
    before = {r["chunk_id"]: np.asarray(r["vector"], dtype=np.float32).tobytes() for r in chunk_rows(warehouse, "doc-1")}
    encoded = embedder.encoded
    report = warehouse.ingest_records([make_record(text=LONG, labels=["finance", "legal-hold"], classification="restricted")])
    after = chunk_rows(warehouse, "doc-1")
    assert report.documents == 1 and embedder.encoded == encoded
    assert {r["chunk_id"]: np.asarray(r["vector"], dtype=np.float32).tobytes() for r in after} == before
    assert all(r["labels"] == ["finance", "legal-hold"] and r["classification"] == 3 for r in after)


def test_a_document_whose_batch_fails_lands_not_at_all(tmp_path, make_record):
    warehouse = Warehouse(Settings(warehouse=str(tmp_path / "wh"), write_batch_docs=2), embedder=FailingEmbedder())
    records = [
        make_record(id="a", text="first batch, fine"),
        make_record(id="b", text="first batch, fine too"),
        make_record(id="c", text=LONG),
        make_record(id="d", text=LONG + " and then explode"),
    ]
    with pytest.raises(RuntimeError, match="embedding failed"):
        warehouse.ingest_records(records)
    assert sorted({r["doc_id"] for r in raw_table(warehouse.store).search().limit(None).to_list()}) == ["a", "b"]
    assert sorted(r["doc_id"] for r in raw_table(warehouse.store, "sources").search().limit(None).to_list()) == ["a", "b"]


def test_an_id_used_in_another_tenant_names_a_separate_document(fresh_warehouse, make_record):
    fresh_warehouse.ingest_records([make_record()])
    acme_rows = chunk_rows(fresh_warehouse, "doc-1")
    report = fresh_warehouse.ingest_records([make_record(tenant="globex", text="Another tenant's own doc-1.")])
    assert (report.documents, report.rejected) == (1, ())
    rows = {tenant: [r for r in chunk_rows(fresh_warehouse, "doc-1") if r["tenant"] == tenant] for tenant in ("acme", "globex")}
    assert rows["acme"] == acme_rows, "acme's document changed when globex used its id"
    assert [r["text"] for r in rows["globex"]] == ["Another tenant's own doc-1."]
    assert not {r["chunk_id"] for r in rows["acme"]} & {r["chunk_id"] for r in rows["globex"]}

    fresh_warehouse.forget("doc-1", tenant="globex", reason="test")
    assert chunk_rows(fresh_warehouse, "doc-1") == acme_rows
    assert fresh_warehouse.store.sources.document_tenants("doc-1") == ["acme"]


def test_the_same_text_under_the_same_id_in_two_tenants_gets_distinct_chunk_ids(fresh_warehouse, make_record):
    fresh_warehouse.ingest_records([make_record(), make_record(tenant="globex")])
    rows = chunk_rows(fresh_warehouse, "doc-1")
    assert sorted(r["tenant"] for r in rows) == ["acme", "globex"]
    assert len({r["chunk_id"] for r in rows}) == 2


def test_an_operator_naming_no_tenant_for_an_id_two_tenants_use_is_asked_to(fresh_warehouse, make_record):
    fresh_warehouse.ingest_records([make_record(), make_record(tenant="globex")])
    with pytest.raises(InvalidRequestError, match="used in tenants 'acme', 'globex': name the tenant"):
        fresh_warehouse.forget("doc-1", reason="which one?")
    with pytest.raises(InvalidRequestError, match="name the tenant"):
        fresh_warehouse.lineage("doc-1")
    assert fresh_warehouse.lineage("doc-1", tenant="globex")["source"]["tenant"] == "globex"
    assert len(chunk_rows(fresh_warehouse, "doc-1")) == 2


def test_duplicate_ids_in_one_run_are_rejected_after_the_first(fresh_warehouse, make_record):
    report = fresh_warehouse.ingest_records([make_record(), make_record(text="second copy")])
    assert report.documents == 1
    assert "already appeared in this run at record 1" in report.rejected[0].reason
    assert chunk_rows(fresh_warehouse, "doc-1")[0]["text"] == make_record()["text"]


def test_a_window_of_batches_is_embedded_in_one_call_and_committed_batch_by_batch(tmp_path, make_record, monkeypatch):
    embedder = CountingEmbedder()
    calls: list[int] = []
    original = Embedder.encode
    monkeypatch.setattr(
        CountingEmbedder, "encode", lambda self, texts: calls.append(len(texts)) or original(self, texts)
    )
    warehouse = Warehouse(Settings(warehouse=str(tmp_path / "wh"), write_batch_docs=2), embedder=embedder)
    commits: list[list[str]] = []
    record = warehouse.store.sources.record  # called once per committed batch, with its documents
    monkeypatch.setattr(
        warehouse.store.sources,
        "record",
        lambda rows, **k: commits.append([row["doc_id"] for row in rows]) or record(rows, **k),
    )
    report = warehouse.ingest_records([make_record(id=f"d{i}", text=f"Document number {i}.") for i in range(5)])
    assert report.documents == 5 and calls == [5]
    assert commits == [["d0", "d1"], ["d2", "d3"], ["d4"]]
