"""An import writes its rows as Arrow columns (``ingest.bulk``), and what it writes is what
``ingest_records`` writes for the records those rows make (``importers.as_record``): the same
chunks and source records column for column, the same refusals with the same reasons, the same
skips. A row whose document the warehouse holds goes through the document writer, so running an
import again, or over documents already there, decides changed and unchanged as any ingest."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.raw_tables import raw_table

from ragwarden.config import Settings
from ragwarden.embedder import MODEL_NAME, Embedder
from ragwarden.ingest.importers import AclFromMetadata, Collected, as_record
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
