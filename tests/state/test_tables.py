"""Every table is the state layer's to check and tidy: damage in the audit log is named like damage
anywhere, a Lance failure leaves as a WarehouseError naming the caller's operation, and the
append-only logs' old versions are pruned by the usual optimize."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import lancedb
import pytest
from support.raw_tables import raw_table

from ragwarden.errors import WarehouseError
from ragwarden.governance.audit import Receipt
from ragwarden.state import AuditLog, audit_table, tables
from ragwarden.state.schema import AUDIT_SCHEMA
from ragwarden.warehouse import Warehouse


def _audit_files(warehouse: Warehouse) -> list[Path]:
    return sorted((Path(warehouse.uri) / "audit.lance" / "data").glob("*.lance"))


def test_a_damaged_audit_file_is_named_and_the_question_fails_naming_the_operation(small_warehouse: Warehouse):
    small_warehouse.search("cafeteria menu", subject="user:alice", tenant="acme")
    small_warehouse.audit.fold()  # the receipt's journal file into the table
    assert small_warehouse.store.damaged_files() == []
    files = _audit_files(small_warehouse)
    files[0].unlink()
    assert str(files[0]) in small_warehouse.store.damaged_files()
    with pytest.raises(WarehouseError) as caught:
        small_warehouse.receipts(caller="user:carol", tenant="acme")
    assert str(files[0]) in str(caught.value) and "audit failed" in str(caught.value)


def test_optimize_prunes_the_old_versions_of_the_audit_log_and_keeps_every_receipt(
    small_warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch
):
    for _ in range(3):
        small_warehouse.search("cafeteria menu", subject="user:alice", tenant="acme")
        small_warehouse.audit.fold()  # a commit each
    audit = raw_table(small_warehouse.store, "audit")
    receipts = audit.count_rows()
    assert len(audit.list_versions()) > 3
    small_warehouse.store.maintenance.optimize()
    assert len(raw_table(small_warehouse.store, "audit").list_versions()) > 3  # younger than the log's VERSIONS_KEPT: kept
    monkeypatch.setattr(audit_table, "VERSIONS_KEPT", timedelta(0))
    small_warehouse.store.maintenance.optimize()
    audit = raw_table(small_warehouse.store, "audit")
    assert len(audit.list_versions()) == 1 and audit.count_rows() == receipts
    assert small_warehouse.audit.verify().ok


def test_the_audit_schema_holds_exactly_what_the_chain_covers_and_the_hash():
    from ragwarden.governance.audit import CHAINED

    assert sorted({*CHAINED, "hash"}) == sorted(AUDIT_SCHEMA.names)


RECEIPT = Receipt(kind="decision", operation="audit", subject="user:a", tenant="acme", allowed=True, reason="r")


@pytest.fixture
def unmaintained_log(tmp_path: Path) -> tuple[Any, audit_table.AuditTable, AuditLog]:
    """An empty audit log whose writer never compacts or checkpoints by itself: (connection, table, log)."""
    db = lancedb.connect(tmp_path, read_consistency_interval=timedelta(0))
    table = audit_table.AuditTable(db, key_check="none")
    return db, table, AuditLog(lambda _: table, compact_every=None, checkpoint_every=None)


def test_a_long_read_of_the_audit_log_keeps_its_version_while_writers_compact_and_prune(
    unmaintained_log: tuple[Any, audit_table.AuditTable, AuditLog], monkeypatch: pytest.MonkeyPatch
):
    """The log keeps old versions only briefly (every commit lists them); a read that outlasts that,
    like verify, tags its version so no prune removes the files under it."""
    monkeypatch.setattr(audit_table, "BATCH_ROWS", 4)
    monkeypatch.setattr(audit_table, "VERSIONS_KEPT", timedelta(0))
    db, table, log = unmaintained_log
    receipt = RECEIPT
    for _ in range(60):  # sixty commits, sixty small files
        log.append(receipt)
    reading = table.batches()
    first = next(reading)
    log.append(receipt)
    table.compact()  # meanwhile: one file rewritten from all sixty, every version but the latest pruned
    assert len(first) + sum(len(rows) for rows in reading) == 60
    table.compact()  # the read is over: its version goes with the next prune
    assert len(db.open_table("audit").list_versions()) == 1


def test_compaction_leaves_a_full_file_alone_so_the_log_is_never_rewritten_whole(
    unmaintained_log: tuple[Any, audit_table.AuditTable, AuditLog], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(tables, "FRAGMENT_ROWS", 4)
    db, table, log = unmaintained_log
    receipt = RECEIPT

    def files() -> dict[str, int]:
        fragments = db.open_table("audit").to_lance().get_fragments()
        return {data.path: fragment.count_rows() for fragment in fragments for data in fragment.data_files()}

    for _ in range(4):
        log.append(receipt)
    table.compact()
    (full,) = files()
    for _ in range(4):
        log.append(receipt)
    table.compact()
    assert full in files() and sorted(files().values()) == [4, 4]  # the full file kept, the new four merged
    assert log.verify().ok


@pytest.mark.parametrize("many", [0, 4, 10_000], ids=["keys joined, then columns joined", "keys joined, then asked", "asked"])
def test_documents_asked_for_in_any_number_are_the_rows_a_filter_finds(
    small_warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch, many: int
) -> None:
    """Above ``MANY_KEYS`` keys the table's keys are scanned and joined in Arrow, then the columns
    (or, for few found, asked by filter); every way gives what the filter gives, absent keys and
    keys holding quotes or NUL included."""
    sources = raw_table(small_warehouse.store, "sources")
    held = [(row["tenant"], row["doc_id"]) for row in sources.to_arrow().to_pylist()]
    asked = [*held, ("acme", "absent"), ("acme", "o'brien"), ("acme", "nul\x00"), ("globex", held[0][1])]
    columns = ["tenant", "doc_id", "doc_version", "metadata"]
    expected = tables.documents_rows(sources, asked, columns)
    monkeypatch.setattr(tables, "MANY_KEYS", many)
    found = tables.documents_rows(sources, asked, columns)
    assert sorted(found, key=lambda r: (r["tenant"], r["doc_id"])) == sorted(expected, key=lambda r: (r["tenant"], r["doc_id"]))
    assert {(r["tenant"], r["doc_id"]) for r in found} == set(held) and len(held) == 3
    assert tables.documents_rows(sources, [("acme", "absent"), ("nowhere", "x")], columns) == []
