"""Vectors brought in with their records, as Chroma's ``embeddings=`` takes them: written as they
are, one chunk a record, never embedded again; the warehouse records its model and refuses a
record or a query embedded by another model or of another dimension, naming both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pytest
from support.raw_tables import raw_table

from ragwarden.config import Settings
from ragwarden.embedder import MODEL_NAME, Embedder
from ragwarden.errors import ConfigurationError, InvalidRequestError
from ragwarden.warehouse import Warehouse

ALICE = {"subject": "user:alice", "tenant": "acme"}
TEXTS = {"orbit": "The satellite's orbit decays a little every year.",
         "tides": "Tides follow the moon's pull on the oceans."}  # fmt: skip


@pytest.fixture
def embedded_elsewhere(embedder: Embedder) -> dict[str, list[float]]:
    """Vectors of the warehouse's own model, computed apart from any ingest (as another pipeline would)."""
    return {doc_id: vector.tolist() for doc_id, vector in zip(TEXTS, embedder.encode(list(TEXTS.values())), strict=True)}


def _records(make_record: Any, vectors: dict[str, list[float]], model: str = MODEL_NAME) -> list[dict[str, Any]]:
    return [make_record(id=doc_id, text=TEXTS[doc_id], vector=vectors[doc_id], model=model) for doc_id in TEXTS]


def test_records_bring_their_vectors_and_nothing_is_embedded(
    demo_policy_warehouse: Warehouse, make_record: Any, embedded_elsewhere: dict[str, list[float]],
    monkeypatch: pytest.MonkeyPatch,
):  # fmt: skip
    def refuse(texts: list[str]) -> Any:
        raise AssertionError(f"embedded {len(texts)} texts that came with their vectors")

    monkeypatch.setattr(demo_policy_warehouse.embedder, "encode", refuse)
    report = demo_policy_warehouse.ingest_records(_records(make_record, embedded_elsewhere))
    assert report.ok and report.documents == 2 and report.chunks == 2
    rows = {row["doc_id"]: row for row in raw_table(demo_policy_warehouse.store).to_arrow().to_pylist()}
    for doc_id, vector in embedded_elsewhere.items():
        assert rows[doc_id]["text"] == TEXTS[doc_id] and rows[doc_id]["embedding_model"] == MODEL_NAME
        assert np.allclose(rows[doc_id]["vector"], vector, atol=1e-7)
    monkeypatch.undo()
    (hit,) = demo_policy_warehouse.search("Why does a satellite fall back to earth?", k=1, **ALICE)
    assert hit.doc_id == "orbit", "a query the warehouse embeds finds a vector brought in: they are one model's"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model": "openai/text-embedding-3-small"},
         f"'openai/text-embedding-3-small'; this warehouse's vectors are '{MODEL_NAME}'"),
        ({"vector": [0.5] * 1536}, f"vector has 1536 numbers; '{MODEL_NAME}' makes 384"),
        ({"model": None}, "a vector needs model"),
        ({"vector": None}, "give the record's vector too"),
        ({"vector": [float("nan")] * 384}, "NaN or infinity"),
        ({"vector": [0.0] * 384}, "all zeros"),
        ({"vector": ["0.1"] * 384}, "numbers only"),
        ({"vector": [True] + [0.5] * 383}, "numbers only"),
        ({"vector": [1e39] + [0.5] * 383}, "too large for float32"),
        ({"vector": [[0.5] * 384]}, "numbers only"),
    ],
)
def test_a_vector_the_warehouse_cannot_rank_with_its_own_is_refused_naming_both(
    demo_policy_warehouse: Warehouse, make_record: Any, embedded_elsewhere: dict[str, list[float]],
    change: dict[str, Any], named: str,
):  # fmt: skip
    record = {**_records(make_record, embedded_elsewhere)[0], **change}
    record = {key: value for key, value in record.items() if value is not None}
    report = demo_policy_warehouse.ingest_records([record])
    (rejected,) = report.rejected
    assert report.documents == 0 and "orbit" in rejected.source and named in rejected.reason, rejected.reason


def test_a_query_vector_of_another_model_or_dimension_is_refused_naming_both(
    demo_policy_warehouse: Warehouse, embedded_elsewhere: dict[str, list[float]]
):
    vector = embedded_elsewhere["orbit"]
    with pytest.raises(InvalidRequestError, match=f"'openai/text-embedding-3-small' is not this warehouse's model '{MODEL_NAME}'"):
        demo_policy_warehouse.search("orbit", vector=vector, vector_model="openai/text-embedding-3-small", **ALICE)
    with pytest.raises(InvalidRequestError, match=f"vector has shape \\(1536,\\); {MODEL_NAME}'s vectors have 384 numbers"):
        demo_policy_warehouse.search("orbit", vector=[0.1] * 1536, **ALICE)
    assert demo_policy_warehouse.search("orbit", vector=vector, vector_model=MODEL_NAME, **ALICE) == []  # nothing ingested


def test_the_warehouse_records_its_model_and_refuses_to_open_with_another(tmp_path: Path, embedder: Embedder):
    uri = str(tmp_path / "wh")
    assert Warehouse(Settings(warehouse=uri), embedder=embedder).store.chunks.embedding_model == MODEL_NAME
    chunks = lancedb.connect(uri).open_table("chunks").to_lance()
    chunks.update_schema_metadata({"ragwarden:embedding_model": "BAAI/bge-small-en-v1.5"})  # written by another model
    with pytest.raises(ConfigurationError, match=f"made by 'BAAI/bge-small-en-v1.5'; this process embeds with '{MODEL_NAME}'"):
        Warehouse(Settings(warehouse=uri), embedder=embedder)


def test_a_record_bringing_a_new_vector_for_the_same_text_is_written_again(
    demo_policy_warehouse: Warehouse, make_record: Any, embedded_elsewhere: dict[str, list[float]]
):
    records = _records(make_record, embedded_elsewhere)
    demo_policy_warehouse.ingest_records(records)
    assert demo_policy_warehouse.ingest_records(records).unchanged == 2, "the same vectors: nothing to write"
    moved = [*embedded_elsewhere["tides"]]  # the orbit record now brings the tides text's vector
    report = demo_policy_warehouse.ingest_records([{**records[0], "vector": moved}, records[1]])
    assert (report.documents, report.unchanged) == (1, 1)
    stored = {row["doc_id"]: row["vector"] for row in raw_table(demo_policy_warehouse.store).to_arrow().to_pylist()}
    assert np.allclose(stored["orbit"], moved, atol=1e-7)


def test_records_bringing_their_vectors_are_committed_a_batch_at_a_time(tmp_path: Path, embedder: Embedder, make_record: Any):
    """A collection imported has nothing to embed: its records are committed in batches of
    ``write_batch_brought`` (one commit each), beside records to embed, which keep theirs."""
    warehouse = Warehouse(Settings(warehouse=str(tmp_path / "w"), write_batch_brought=50, ingest_maintenance=False), embedder=embedder)
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((120, 384))
    brought = [make_record(id=f"v{i:03d}", text=f"imported row {i}", vector=vectors[i].tolist(), model=MODEL_NAME) for i in range(120)]
    before = warehouse.store.chunks.version
    report = warehouse.ingest_records([*brought, make_record(id="embedded", text="a record the warehouse embeds")])
    assert report.ok and report.documents == 121
    assert warehouse.store.chunks.version - before == 3 + 1, "120 brought in 3 commits of at most 50, the other in its own"
    stored = {row["doc_id"]: row["vector"] for row in raw_table(warehouse.store).to_arrow().to_pylist()}
    assert np.allclose(stored["v007"], vectors[7].astype(np.float32), atol=0) and len(stored) == 121


def test_one_tag_set_is_parsed_once_however_many_records_carry_it(
    demo_policy_warehouse: Warehouse, make_record: Any, embedded_elsewhere: dict[str, list[float]], monkeypatch: pytest.MonkeyPatch,
):  # fmt: skip
    from ragwarden.ingest import records as parsing

    parsed: list[object] = []
    real = parsing._parse_tags
    monkeypatch.setattr(parsing, "_parsed", {})
    monkeypatch.setattr(parsing, "_parse_tags", lambda **fields: parsed.append(fields) or real(**fields))
    vector = embedded_elsewhere["orbit"]
    same = [make_record(id=f"s{i}", text=f"row {i}", vector=vector, model=MODEL_NAME, acl={"allow": ["group:eng"]}) for i in range(40)]
    wrong = [make_record(id=f"w{i}", text="row", vector=vector, model=MODEL_NAME, acl={"allow": []}) for i in range(3)]
    report = demo_policy_warehouse.ingest_records([*same, *wrong])
    assert report.documents == 40 and len(report.rejected) == 3, "a refusal is said for every record, never kept"
    assert len(parsed) == 1 + 3


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"labels": ["1"]}, {"labels": "1"}),  # a list of text and the text alone
        ({"labels": ["finance"]}, {"labels": ("finance",)}),  # a list and a tuple: kept by value, as ever
        ({"tenant": "1"}, {"tenant": 1}),
        ({"classification": "internal"}, {"classification": 1}),
        ({"acl": {"allow": ["a"]}}, {"acl": {"allow": ["a"], "deny": []}}),
        ({"acl": {"allow": ["a"]}}, {"acl": {"allow": "a"}}),
    ],
)
def test_tags_kept_by_value_keep_every_type_apart(monkeypatch: pytest.MonkeyPatch, first: dict[str, Any], second: dict[str, Any]) -> None:
    """A tag set's cached parse answers only for a set of the same value and types: the second,
    parsed after the first, is parsed (accepted or refused) as if it were the only one."""
    from ragwarden.ingest import records as parsing

    base = {"tenant": "acme", "acl": {"allow": ["group:eng"]}, "labels": [], "classification": "internal"}

    def outcome(fields: dict[str, Any]) -> object:
        try:
            tags = parsing.parse_tags(**{**base, **fields})
        except ValueError as exc:
            return str(exc)
        return (tags.tenant, tags.row_columns(), tags.fingerprint())

    monkeypatch.setattr(parsing, "_parsed", {})
    alone = outcome(second)
    monkeypatch.setattr(parsing, "_parsed", {})
    outcome(first)
    assert outcome(second) == alone
