"""An erasure's purge leaves no earlier version holding rows, yet a write planned before it is still
checked against every commit made since (Lance reads those commits' records to find conflicts)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.raw_tables import raw_table

from ragwarden.state import tables
from ragwarden.state.commit_retry import PlanOutlived, is_commit_conflict
from ragwarden.state.snapshot import ChunkWrite
from ragwarden.state.tables import conditional_merge
from ragwarden.warehouse import Warehouse


def record(doc_id: str, text: str, allow: list[str]) -> dict[str, Any]:
    return {"id": doc_id, "text": text, "tenant": "acme", "acl": {"allow": allow}, "classification": "internal"}


@pytest.fixture
def two_document_warehouse(demo_policy_warehouse: Warehouse) -> Warehouse:
    """A staff note and a memo to be erased, each one chunk."""
    assert demo_policy_warehouse.ingest_records([
        record("staff", "The office closes early on Friday for the summer party.", ["group:staff"]),
        record("memo", "The vendor shortlist is final; the code word is wombat.", ["group:staff"]),
    ]).ok  # fmt: skip
    return demo_policy_warehouse


def stored_ids(warehouse: Warehouse) -> Counter[str]:
    return Counter(row["chunk_id"] for row in raw_table(warehouse.store).to_arrow().select(["chunk_id"]).to_pylist())


class PausedWrite:
    """A chunks write from another process, planned on the version there is now and paused between
    its reads and its commit: its rows arrive only once ``release`` is called."""

    def __init__(self, warehouse: Warehouse, rows: list[dict[str, Any]]) -> None:
        dataset = raw_table(warehouse.store).to_lance()
        table = pa.Table.from_pylist(rows, schema=dataset.schema)
        self._go, self._reading = threading.Event(), threading.Event()
        self.error: BaseException | None = None

        def batches() -> Iterator[pa.RecordBatch]:
            self._reading.set()
            self._go.wait(60)
            yield from table.to_batches()

        def commit() -> None:
            try:
                conditional_merge(dataset, "chunk_id", planned_at=time.monotonic(), what="a paused write").execute(
                    pa.RecordBatchReader.from_batches(table.schema, batches())
                )
            except Exception as exc:
                self.error = exc

        self._thread = threading.Thread(target=commit)
        self._thread.start()
        assert self._reading.wait(60)

    def release(self) -> BaseException | None:
        """Let the write commit; returns why it was refused (None: it committed)."""
        self._go.set()
        self._thread.join(60)
        return self.error


def test_a_write_planned_before_a_purge_is_refused_when_a_commit_since_touched_its_rows(
    two_document_warehouse: Warehouse,
):
    warehouse = two_document_warehouse
    (staff,) = warehouse.store.chunks.chunk_ids_of("staff", "acme")
    as_planned = warehouse.store.chunks.rows([staff], raw_table(warehouse.store).schema.names)[staff]
    paused = PausedWrite(warehouse, [as_planned])  # rewrites the staff row as it was before the sync
    warehouse.sync(
        [{"id": "staff", "tenant": "acme", "acl": {"allow": ["group:finance"]}, "classification": "internal"}]
    )
    warehouse.forget("memo", reason="erasure request", tenant="acme")  # purges every earlier version

    refused = paused.release()

    assert refused is not None and is_commit_conflict(refused), refused
    assert stored_ids(warehouse)[staff] == 1
    assert warehouse.store.chunks.rows([staff])[staff]["acl_allow"] == ["group:finance"]


def test_a_purge_leaves_only_the_latest_version_holding_rows_and_the_earlier_records_in_place(
    two_document_warehouse: Warehouse,
):
    warehouse = two_document_warehouse
    before = warehouse.store.chunks.version
    warehouse.forget("memo", reason="erasure request", tenant="acme")

    assert warehouse.store.maintenance.versions_left() == {"chunks": 1, "sources": 1}
    chunks = raw_table(warehouse.store)
    assert len(chunks.list_versions()) > 1, "the records of earlier commits stay for writers still planning"
    chunks.checkout(before)
    with pytest.raises(Exception, match="(?i)not found"):
        chunks.to_arrow()


def test_a_plan_older_than_its_lifetime_is_never_committed(
    two_document_warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch
):
    warehouse = two_document_warehouse
    (staff,) = warehouse.store.chunks.chunk_ids_of("staff", "acme")
    planned = warehouse.store.chunks.snapshot()
    row = planned.rows([staff])[staff]
    version = warehouse.store.chunks.version
    monkeypatch.setattr(tables, "PLAN_LIFETIME", timedelta(0))

    with pytest.raises(PlanOutlived, match="too long to commit safely") as outlived:
        planned.commit(ChunkWrite(rows=[{**row, "labels": ["finance"]}]))

    assert is_commit_conflict(outlived.value), "a write planned too long ago is planned again"
    assert warehouse.store.chunks.version == version


def test_a_second_purge_empties_the_versions_written_since_the_first(two_document_warehouse: Warehouse):
    """The second purge reads only the versions since the first (its mark), and still leaves the
    second erasure's text in no file."""
    warehouse = two_document_warehouse
    folder = warehouse.store.local_path
    assert folder is not None
    warehouse.forget("memo", reason="erasure request", tenant="acme")
    secret = "The second code word is aardvark, erased next."
    assert warehouse.ingest_records([record("later", secret, ["group:staff"])]).ok
    warehouse.sync(
        [{"id": "staff", "tenant": "acme", "acl": {"allow": ["group:finance"]}, "classification": "internal"}]
    )

    def files_holding_it() -> list[Path]:
        return [p for p in folder.rglob("*") if p.is_file() and b"aardvark" in p.read_bytes()]

    assert files_holding_it(), "positive control: the text is on disk before the second erasure"
    report = warehouse.forget("later", reason="erasure request", tenant="acme")

    assert files_holding_it() == []
    assert report.versions_left == {"chunks": 1, "sources": 1}
    assert stored_ids(warehouse).most_common(1)[0][1] == 1


def test_a_mark_that_is_not_this_tables_is_not_trusted(two_document_warehouse: Warehouse):
    """A mark naming a version of the right number but another commit time (a table restored or
    made again under the same name) would let the purge skip the versions before it."""
    warehouse = two_document_warehouse
    folder = warehouse.store.local_path
    assert folder is not None
    for group in ("group:finance", "group:staff"):  # the first re-tag's file is only in the version between
        warehouse.sync([{"id": "memo", "tenant": "acme", "acl": {"allow": [group]}, "classification": "internal"}])
    marks = warehouse.store.files("history")
    assert marks is not None
    marks.put("chunks", f"{warehouse.store.chunks.version} 1999-01-01T00:00:00".encode())

    def files_holding_it() -> list[Path]:
        return [p for p in folder.rglob("*") if p.is_file() and b"wombat" in p.read_bytes()]

    assert len(files_holding_it()) >= 3, "positive control: the memo is in a file of each version of its row"
    warehouse.forget("memo", reason="erasure request", tenant="acme")

    assert files_holding_it() == []
    assert warehouse.store.maintenance.versions_left() == {"chunks": 1, "sources": 1}
