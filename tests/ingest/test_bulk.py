"""An import writes its rows as Arrow columns (``ingest.bulk``), and what it writes is what
``ingest_records`` writes for the records those rows make (``importers.as_record``): the same
chunks and source records column for column, the same refusals with the same reasons, the same
skips. A row whose document the warehouse holds goes through the document writer, so running an
import again, or over documents already there, decides changed and unchanged as any ingest."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from support.raw_tables import raw_table

from ragwarden.config import Settings
from ragwarden.embedder import MODEL_NAME, Embedder
from ragwarden.ingest.importers import AclFromMetadata, Collected, CollectedBatch, as_record, lancedb_rows
from ragwarden.warehouse import Warehouse

TAGS = AclFromMetadata.parse("allow=owners,deny=blocked,labels=tags,classification=level")
RUN_COLUMNS = {"ingest_run_id", "created_at", "ingested_at", "chunks_version"}  # when and in which run: differ by design


def collection(embedder: Embedder) -> list[Collected]:
    """Rows of several tag sets, with every fault a row can have and rows that are fine beside them."""
    texts = [f"{topic} note {i}" for i, topic in enumerate(["budget", "payroll", "hiring", "travel"] * 6)]
    vectors = embedder.encode(texts)
    owners = ["group:finance", "group:hr,group:hr-managers", "group:staff", ["group:finance", "group:staff"]]
    rows = [Collected(id=f"n{i:02d}", text=text, vector=vectors[i],
                      metadata={"owners": owners[i % 4], "level": ["internal", "confidential"][i % 2], "page": i,
                                "tags": ["finance"] if i % 4 == 0 else [], "blocked": "user:bob" if i % 3 == 0 else None,
                                "seen": datetime(2026, 11, 1 + i, tzinfo=timezone.utc), "nested": {"a": [1, 2.5, None]}})
            for i, text in enumerate(texts)]  # fmt: skip
    faults = [
        Collected(id="no-acl", text="a note with no owner", vector=vectors[0], metadata={"level": "internal"}),
        Collected(id="nan", text="a note", vector=np.full(vectors.shape[1], np.nan, np.float32), metadata=rows[0].metadata),
        Collected(id="zero", text="a note", vector=np.zeros(vectors.shape[1], np.float32), metadata=rows[0].metadata),
        Collected(id="short", text="a note", vector=vectors[0][:10], metadata=rows[0].metadata),
        Collected(id="bad level", text="a note", vector=vectors[0], metadata={**rows[0].metadata, "level": "secret"}),
        Collected(id="", text="no id", vector=vectors[0], metadata=rows[0].metadata),
        Collected(id="no-text", text=None, vector=vectors[0], metadata=rows[0].metadata),
        Collected(id="empty", text="   ", vector=vectors[0], metadata=rows[0].metadata),
        Collected(id="n03", text="the same id again", vector=vectors[3], metadata=rows[3].metadata),
    ]
    return [*rows[:12], *faults, *rows[12:]]


def _tables(warehouse: Warehouse) -> dict[str, list[dict[str, Any]]]:
    found = {}
    for name, key in (("chunks", "chunk_id"), ("sources", "doc_id")):
        rows = raw_table(warehouse.store, name).to_arrow().to_pylist()
        found[name] = sorted(({k: v for k, v in row.items() if k not in RUN_COLUMNS} for row in rows), key=lambda r: r[key])
    return found


@pytest.fixture
def two_warehouses(tmp_path: Path, embedder: Embedder) -> tuple[Warehouse, Warehouse]:
    """Two empty warehouses: one to import into, one to ingest the same records into."""
    return tuple(Warehouse(Settings(warehouse=str(tmp_path / name)), embedder=embedder) for name in ("imported", "ingested"))  # type: ignore[return-value]


def test_an_import_writes_what_ingest_records_writes_for_the_same_records(
    two_warehouses: tuple[Warehouse, Warehouse], embedder: Embedder
) -> None:
    imported, ingested = two_warehouses
    rows = collection(embedder)
    report = imported.import_collection(rows, tags=TAGS, model=MODEL_NAME, origin="test:notes", tenant="acme", progress=False)
    records = [as_record(row, TAGS.tags_of(row), tenant="acme", classification=None, model=MODEL_NAME, origin="test:notes")
               for row in rows]  # fmt: skip
    reference = ingested.ingest_records(records)
    assert report.documents == reference.documents == 24 and report.unchanged == 0
    assert sorted(report.rejected) == sorted((r.source, r.reason) for r in reference.rejected)
    assert len(report.rejected) == 8 and report.without_acl == 1, "every fault refused, one of them for want of an ACL"
    assert {reason for source, reason in report.rejected if "'n03'" in source} == {"id 'n03' already appeared in this run at record 4 (id 'n03')"}
    assert _tables(imported) == _tables(ingested)


def test_an_import_over_documents_the_warehouse_holds_decides_changed_and_unchanged(
    two_warehouses: tuple[Warehouse, Warehouse], embedder: Embedder
) -> None:
    imported, ingested = two_warehouses
    rows = collection(embedder)
    imported.import_collection(rows[:12], tags=TAGS, model=MODEL_NAME, origin="test:notes", tenant="acme", progress=False)
    changed = Collected(id="n05", text="payroll note 5, revised", vector=embedder.encode(["payroll note 5, revised"])[0],
                        metadata=rows[5].metadata)  # fmt: skip
    again = [*rows[:5], changed, *rows[6:]]
    report = imported.import_collection(again, tags=TAGS, model=MODEL_NAME, origin="test:notes", tenant="acme", progress=False)
    assert (report.documents, report.unchanged) == (24 - 12 + 1, 11), "the rest new, n05 changed, eleven found unchanged"
    ingested.ingest_records([as_record(row, TAGS.tags_of(row), tenant="acme", classification=None, model=MODEL_NAME,
                                       origin="test:notes") for row in again])  # fmt: skip
    assert _tables(imported) == _tables(ingested)


def arrow_collection(embedder: Embedder, tmp_path: Path) -> str:
    """A LanceDB table of plain columns (text, lists of text, numbers, truth values) holding rows
    of several tag sets and every fault a column can hold; its uri."""
    texts = [f"{topic} note {i}" for i, topic in enumerate(["budget", "payroll", "hiring", "travel"] * 6)]
    vectors = embedder.encode(texts)
    owners = [["group:finance"], ["group:hr", "group:hr-managers"], ["group:staff"], ["group:finance", "group:staff"]]
    rows = [{"id": f"n{i:02d}", "text": text, "vector": vectors[i], "owners": owners[i % 4],
             "level": ["internal", "confidential"][i % 2], "tags": ["finance"] if i % 4 == 0 else [],
             "blocked": "user:bob" if i % 3 == 0 else None, "page": i, "score": i / 7, "pinned": i % 5 == 0}
            for i, text in enumerate(texts)]  # fmt: skip
    faults = [
        {**rows[0], "id": "no-acl", "owners": None}, {**rows[0], "id": "empty-acl", "owners": []},
        {**rows[0], "id": "no-vector", "vector": None},
        {**rows[0], "id": "zero", "vector": np.zeros(vectors.shape[1], np.float32)},
        {**rows[0], "id": "bad level", "level": "secret"}, {**rows[0], "id": "nan score", "score": float("nan")},
        {**rows[0], "id": ""}, {**rows[0], "id": "no-text", "text": None}, {**rows[0], "id": "empty", "text": "   "},
        {**rows[3], "text": "the same id again"},
    ]
    table = pa.Table.from_pylist([*rows[:12], *faults, *rows[12:]], schema=pa.schema([
        ("id", pa.string()), ("text", pa.string()), ("vector", pa.list_(pa.float32(), vectors.shape[1])),
        ("owners", pa.list_(pa.string())), ("level", pa.string()), ("tags", pa.list_(pa.string())), ("blocked", pa.string()),
        ("page", pa.int64()), ("score", pa.float64()), ("pinned", pa.bool_())]))  # fmt: skip
    uri = str(tmp_path / "prototype")
    lancedb.connect(uri).create_table("notes", table, on_bad_vectors="null")  # the row with no vector kept, as null
    return uri


def test_an_import_of_arrow_batches_writes_what_ingest_records_writes_for_their_rows(
    two_warehouses: tuple[Warehouse, Warehouse], embedder: Embedder, tmp_path: Path
) -> None:
    imported, ingested = two_warehouses
    uri = arrow_collection(embedder, tmp_path)
    _, batches = lancedb_rows(uri, "notes", batch_rows=7)  # batches joined and split into chunks of the import's size
    report = imported.import_collection(batches, tags=TAGS, model=MODEL_NAME, origin="test:notes", tenant="acme", progress=False)
    _, again = lancedb_rows(uri, "notes")
    rows = [row for batch in again for row in batch.rows()]
    reference = ingested.ingest_records([as_record(row, TAGS.tags_of(row), tenant="acme", classification=None,
                                                   model=MODEL_NAME, origin="test:notes") for row in rows])  # fmt: skip
    assert report.documents == reference.documents == 24
    assert sorted(report.rejected) == sorted((r.source, r.reason) for r in reference.rejected)
    assert len(report.rejected) == 9 and report.without_acl == 1, "every fault refused (an empty allow list too)"
    assert _tables(imported) == _tables(ingested)


@pytest.mark.parametrize("spec", ["allow=owners,deny=blocked,labels=tags,classification=level", "allow=text_owners,classification=page"])
def test_rows_grouped_by_their_columns_get_the_tags_their_own_metadata_gives(spec: str) -> None:
    """Values that look alike (a list or its text, an empty list, a list of one empty text, the
    same names in another order, a null inside a list) are never one group unless equal."""
    owners = [["a", "b"], ["b", "a"], ["a,b"], [], [""], None, ["a", "b"], ["a", None], ["a\x1fb"], ["a", "b"]]
    columns = pa.table({
        "owners": pa.array(owners, pa.list_(pa.string())),
        "text_owners": ["a,b", "a, b", "a,b", "", None, "a", "a,b", "b", "a", "a,b"],
        "blocked": [None, "c", None, None, "c", None, None, "c", None, None],
        "tags": pa.array([["x"], [], ["x"], ["x"], ["x"], [], ["x"], None, ["x"], ["x"]], pa.list_(pa.string())),
        "level": ["internal", "internal", "internal", None, "internal", "public", "internal", "x", "internal", "internal"],
        "page": list(range(10)),
    })  # fmt: skip
    batch = CollectedBatch(ids=[f"r{i}" for i in range(10)], texts=["t"] * 10, vectors=np.ones((10, 3), np.float32),
                           metadata=columns)  # fmt: skip
    tags = AclFromMetadata.parse(spec)
    found, which = tags.grouped(batch)
    assert [found[place] for place in which] == [tags.tags_of(row) for row in batch.rows()]
    if "page" not in spec:
        assert len(found) < len(batch), "rows of equal values share one parse"
        assert which[0] == which[6] == which[9] and len({which[0], which[1], which[2], which[8]}) == 4
