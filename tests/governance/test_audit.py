"""The audit log: a hash chain in a real LanceDB table, its tamper evidence, queries and writers.

Tampering is done the way someone with write access to the table would do it: through LanceDB's
own ``update``, ``delete`` and ``add``. Concurrent writers are spawned processes (never forked
after LanceDB started), each appending receipts as fast as it can.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import runpy
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa
import pytest

from ragwarden.errors import ConfigurationError, InvalidRequestError, WarehouseError
from ragwarden.governance.audit import (
    GENESIS_HASH,
    Checkpoint,
    Receipt,
    StoredReceipt,
    fingerprint,
    hash_payload,
)
from ragwarden.governance.merkle import EMPTY_ROOT
from ragwarden.state import AuditLog, AuditTable, audit_log, audit_table
from ragwarden.state.schema import AUDIT, AUDIT_CHECKPOINTS, AUDIT_SCHEMA

# -- fixtures ------------------------------------------------------------------------------


def connect(path: Path) -> Any:
    return lancedb.connect(path, read_consistency_interval=timedelta(0))


def log_of(db: Any, **options: Any) -> AuditLog:
    """An audit log over the ``audit`` table of ``db``, as a warehouse opens it."""
    return AuditLog(lambda key_check: AuditTable(db, key_check=key_check), **options)


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    return tmp_path / "warehouse"


@pytest.fixture
def db(warehouse: Path) -> Any:
    return connect(warehouse)


@pytest.fixture
def receipt() -> Callable[..., Receipt]:
    """A retrieval receipt for alice in acme; any field may be overridden."""

    def make(**overrides: Any) -> Receipt:
        values: dict[str, Any] = {
            "kind": "retrieval",
            "operation": "search",
            "subject": "user:alice",
            "tenant": "acme",
            "allowed": True,
            "reason": "filtered by policy",
            "purpose": "support",
            "query": "quarterly revenue",
            "chunk_ids": ("c1", "c2"),
            "doc_ids": ("d1",),
            "chunk_labels": {"c1": ("finance",), "c2": ("finance", "internal")},
            "withheld": 2,
            "policy_version": "p-1",
            "table_version": 7,
        }
        values.update(overrides)
        return Receipt(**values)

    return make


@pytest.fixture
def five(db: Any, receipt: Callable[..., Receipt]) -> tuple[AuditLog, list[StoredReceipt]]:
    """A log of five receipts (seq 1..5), each for a different chunk, doc and subject."""
    log = log_of(db)
    stored = [
        log.append(receipt(subject=f"user:u{i}", chunk_ids=(f"c{i}",), doc_ids=(f"d{i}",), chunk_labels={}))
        for i in range(1, 6)
    ]
    return log, stored


def rows_of(table: Any) -> list[dict[str, Any]]:
    return table.to_arrow().sort_by("seq").to_pylist()


def plain_hash(row: dict[str, Any]) -> str:
    """What anyone who read this module can compute: sha256 over the canonical payload."""
    return hashlib.sha256(hash_payload(row)).hexdigest()


def rewrite(table: Any, rows: list[dict[str, Any]]) -> None:
    """Replace every row of the table (what someone with write access to its storage can do)."""
    table.delete("true")
    table.add(pa.Table.from_pylist(rows, schema=AUDIT_SCHEMA))


def problems_about(report: Any, seq: int) -> list[str]:
    """The problems naming ``seq`` (of whichever chain), each without its chain's name."""
    found = [p.partition(" seq ")[2] for p in report.problems]
    return [f"seq {p}" for p in found if p.startswith((f"{seq}:", f"{seq}.."))]


def at(stored: list[StoredReceipt], seq: int) -> str:
    """How verify names receipt ``seq`` of the chain ``stored`` was appended to."""
    return f"chain {stored[0].chain} seq {seq}"


# -- appending and verifying ---------------------------------------------------------------


def test_appended_receipts_form_a_valid_chain_from_genesis(five: tuple[AuditLog, list[StoredReceipt]]) -> None:
    log, stored = five
    assert [r.seq for r in stored] == [1, 2, 3, 4, 5]
    assert stored[0].prev_hash == GENESIS_HASH
    assert all(later.prev_hash == earlier.hash for earlier, later in zip(stored, stored[1:], strict=False))
    assert len({r.chain for r in stored}) == 1 and len(stored[0].chain) == 16
    report = log.verify()
    assert report.ok and report.receipts == 5 and report.chains == 1 and report.problems == ()
    assert report.checkpoint is not None and report.checkpoint.heads == ((stored[0].chain, 5, stored[-1].hash),)


def test_empty_log_verifies_and_its_checkpoint_binds_no_chain(db: Any) -> None:
    report = log_of(db).verify()
    assert report.ok and report.receipts == 0 and report.chains == 0
    assert report.checkpoint is not None and report.checkpoint.heads == () and report.checkpoint.root == EMPTY_ROOT


def test_stored_receipt_reads_back_as_append_returned_it(db: Any, receipt: Callable[..., Receipt]) -> None:
    log = log_of(db)
    written = log.append(receipt(details={"doc_id": "d1", "rows_removed": 3}, actor="agent:bot"))
    (read,) = log.query()
    assert read == written
    assert read.time.tzinfo is not None and abs(read.time - datetime.now(timezone.utc)) < timedelta(minutes=1)
    assert read.details == {"doc_id": "d1", "rows_removed": 3}
    assert read.chunk_labels == {"c1": ("finance",), "c2": ("finance", "internal")}


def test_a_receipt_that_is_not_unicode_text_fails_alone_and_the_log_goes_on(db: Any, receipt: Callable[..., Receipt]) -> None:
    """A lone surrogate in details (possible from the Python API) is refused on its caller's thread,
    never inside a group commit, where it would fail every receipt of the batch."""
    log = log_of(db)
    with ThreadPoolExecutor(8) as pool:
        good = [pool.submit(log.append, receipt(subject=f"user:u{i}")) for i in range(8)]
        bad = pool.submit(log.append, receipt(details={"asked": "\ud800"}))
        with pytest.raises(InvalidRequestError, match="not valid Unicode"):
            bad.result(30)
        assert all(future.result(30).seq >= 1 for future in good)
    assert log.count() == 8 and log.verify().ok


def test_query_fingerprint_is_the_sha256_of_the_query_and_derived_when_missing(receipt: Callable[..., Receipt]) -> None:
    assert fingerprint("quarterly revenue") == hashlib.sha256(b"quarterly revenue").hexdigest()
    assert receipt().query_fingerprint == fingerprint("quarterly revenue")
    without_text = receipt(query=None, query_fingerprint=fingerprint("secret question"))
    assert without_text.query is None and without_text.query_fingerprint == fingerprint("secret question")


def test_table_keeps_ids_labels_and_hashes_but_no_chunk_text(
    five: tuple[AuditLog, list[StoredReceipt]], db: Any
) -> None:
    columns = set(db.open_table(AUDIT).schema.names)
    assert "text" not in columns and "vector" not in columns
    assert {"chunk_ids", "doc_ids", "labels", "chunk_labels", "withheld", "prev_hash", "hash"} <= columns


def test_labels_column_is_the_union_of_chunk_labels(db: Any, receipt: Callable[..., Receipt]) -> None:
    log_of(db).append(receipt())
    (row,) = rows_of(db.open_table(AUDIT))
    assert row["labels"] == ["finance", "internal"]
    assert json.loads(row["chunk_labels"]) == {"c1": ["finance"], "c2": ["finance", "internal"]}


def test_log_accepts_an_open_table_as_well_as_a_connection(db: Any, receipt: Callable[..., Receipt]) -> None:
    log_of(db).append(receipt())
    log = log_of(db)  # a second writer on the open table: a chain of its own
    assert log.append(receipt()).seq == 1 and log.verify().ok and log.verify().chains == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kind": "lookup"}, "kind"),
        ({"operation": "drop"}, "operation"),
        ({"subject": ""}, "subject"),
        ({"withheld": -1}, "withheld"),
        ({"allowed": 1}, "allowed"),
        ({"query_fingerprint": "abc"}, "query_fingerprint"),
        ({"query_fingerprint": fingerprint("another query")}, "sha256 of its query"),
        ({"chunk_ids": "c1"}, "chunk_ids"),
        ({"details": {"when": datetime.now(timezone.utc)}}, "JSON"),
    ],
)
def test_malformed_receipt_is_refused_naming_the_field(
    receipt: Callable[..., Receipt], overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        receipt(**overrides)


def test_existing_audit_table_with_another_schema_is_refused(db: Any) -> None:
    db.create_table(AUDIT, schema=pa.schema([pa.field("seq", pa.int64())]))
    with pytest.raises(WarehouseError, match="schema"):
        log_of(db)


# -- tamper evidence -----------------------------------------------------------------------


def test_edited_field_is_detected_at_its_seq(five: tuple[AuditLog, list[StoredReceipt]], db: Any) -> None:
    log, stored = five
    db.open_table(AUDIT).update(where="seq = 3", values={"subject": "user:mallory"})
    report = log.verify()
    assert not report.ok and report.checkpoint is None  # nothing broken is ever bound into a checkpoint
    assert report.problems == (f"{at(stored, 3)}: hash does not match the receipt's content (edited or forged)",)


def test_deleted_receipt_is_detected(five: tuple[AuditLog, list[StoredReceipt]], db: Any) -> None:
    log, _ = five
    db.open_table(AUDIT).delete("seq = 3")
    report = log.verify()
    assert not report.ok and report.receipts == 4
    assert problems_about(report, 3) == ["seq 3: missing (deleted or renumbered)"]
    assert problems_about(report, 4) == ["seq 4: prev_hash is not the hash of the receipt before it (seq 2)"]


def test_forged_receipt_inserted_with_plausible_seq_and_prev_hash_is_detected(
    five: tuple[AuditLog, list[StoredReceipt]], db: Any
) -> None:
    """The forger links to seq 2 and even computes a correct sha256 for the forged row: the
    duplicate seq, and seq 4 still linking to the genuine seq 3, give it away."""
    log, _ = five
    table = db.open_table(AUDIT)
    rows = rows_of(table)
    forged = {**rows[2], "receipt_id": "forged", "subject": "user:nobody", "prev_hash": rows[1]["hash"]}
    forged["hash"] = plain_hash(forged)
    table.add(pa.Table.from_pylist([forged], schema=AUDIT_SCHEMA))
    report = log.verify()
    assert not report.ok and report.receipts == 6
    assert any("seq 3: appears more than once" in p for p in report.problems)


def test_forged_receipt_spliced_in_by_renumbering_the_rest_is_detected(
    five: tuple[AuditLog, list[StoredReceipt]], db: Any
) -> None:
    log, _ = five
    table = db.open_table(AUDIT)
    rows = rows_of(table)
    forged = {**rows[2], "receipt_id": "forged", "subject": "user:nobody"}
    forged["hash"] = plain_hash(forged)
    shifted = [{**row, "seq": row["seq"] + 1} for row in rows[2:]]
    rewrite(table, rows[:2] + [forged] + shifted)
    report = log.verify()
    assert not report.ok and report.receipts == 6
    assert problems_about(report, 3) == []  # the forged row itself is self-consistent
    assert problems_about(report, 4)[0].startswith("seq 4: hash does not match")


def test_reordered_receipts_are_detected(five: tuple[AuditLog, list[StoredReceipt]], db: Any) -> None:
    log, _ = five
    table = db.open_table(AUDIT)
    table.update(where="seq = 2", values={"seq": 1000})
    table.update(where="seq = 4", values={"seq": 2})
    table.update(where="seq = 1000", values={"seq": 4})
    report = log.verify()
    assert not report.ok and report.receipts == 5
    for seq in (2, 4):
        assert f"{at(five[1], seq)}: hash does not match the receipt's content (edited or forged)" in report.problems
    assert any(p.startswith(f"{at(five[1], 3)}: prev_hash") for p in report.problems)


def test_broken_genesis_is_detected(five: tuple[AuditLog, list[StoredReceipt]], db: Any) -> None:
    log, _ = five
    table = db.open_table(AUDIT)
    (first, *rest) = rows_of(table)
    first = {**first, "prev_hash": "f" * 64}
    first["hash"] = plain_hash(first)
    rest[0] = {**rest[0], "prev_hash": first["hash"]}
    rest[0]["hash"] = plain_hash(rest[0])
    for i in range(1, len(rest)):
        rest[i] = {**rest[i], "prev_hash": rest[i - 1]["hash"]}
        rest[i]["hash"] = plain_hash(rest[i])
    rewrite(table, [first, *rest])
    assert log.verify().problems == (f"{at(five[1], 1)}: first receipt's prev_hash is not the genesis value (64 zeros)",)


def test_truncated_tail_is_not_detectable_by_the_chain_alone(
    five: tuple[AuditLog, list[StoredReceipt]], db: Any
) -> None:
    """Deleting the newest receipts leaves a shorter chain that is still valid: nothing left in
    the receipts can show the tail existed. Only a checkpoint taken before reveals it."""
    log, _ = five
    db.open_table(AUDIT).delete("seq >= 4")
    report = log.verify(checkpoint=False)
    assert report.ok and report.receipts == 3 and report.problems == ()


def test_a_truncated_tail_is_caught_against_the_last_checkpoint(
    five: tuple[AuditLog, list[StoredReceipt]], db: Any
) -> None:
    log, stored = five
    taken = log.verify().checkpoint
    assert taken is not None and taken.heads == ((stored[0].chain, 5, stored[4].hash),)
    db.open_table(AUDIT).delete("seq >= 4")
    assert log.verify().problems == (
        f"{at(stored, 5)}: the head checkpoint {taken.root[:16]} recorded is gone (the chain ends at seq 3; "
        "receipts were dropped from the end)",
    )


def test_a_checkpoint_removed_with_the_tail_is_caught_against_its_root_kept_elsewhere(
    five: tuple[AuditLog, list[StoredReceipt]], db: Any
) -> None:
    log, _ = five
    kept = log.verify().checkpoint
    assert kept is not None and log.verify(expect_head=kept.root).ok
    db.open_table(AUDIT).delete("seq >= 4")
    db.open_table(AUDIT_CHECKPOINTS).delete("true")
    assert log.verify(checkpoint=False).ok  # the log alone no longer shows it
    assert log.verify(expect_head=kept.root).problems == (
        f"checkpoint {kept.root}: not in the log (the log's checkpoints were removed, or the root is not of this log)",
    )


def test_an_edited_checkpoint_is_caught(five: tuple[AuditLog, list[StoredReceipt]], db: Any) -> None:
    log, stored = five
    kept = log.verify().checkpoint
    assert kept is not None
    forged_heads = json.dumps([[stored[0].chain, 3, stored[2].hash]], separators=(",", ":"))
    db.open_table(AUDIT_CHECKPOINTS).update(where="true", values={"heads": forged_heads})
    assert log.verify().problems == (f"checkpoint {kept.root[:16]}: does not match its heads (the checkpoint was edited)",)


def test_a_malformed_expected_head_is_refused_naming_it(five: tuple[AuditLog, list[StoredReceipt]]) -> None:
    with pytest.raises(InvalidRequestError, match="'nope' is not a checkpoint root"):
        five[0].verify(expect_head="nope")


def test_writers_keep_separate_chains_and_a_checkpoint_binds_every_head(
    db: Any, receipt: Callable[..., Receipt]
) -> None:
    first, second = log_of(db), log_of(db)
    ours = [first.append(receipt()), second.append(receipt()), first.append(receipt())]
    assert ours[0].chain == ours[2].chain != ours[1].chain
    assert [r.seq for r in ours] == [1, 1, 2]
    taken = first.checkpoint()
    assert isinstance(taken, Checkpoint)
    assert set(taken.heads) == {(ours[2].chain, 2, ours[2].hash), (ours[1].chain, 1, ours[1].hash)}
    assert taken.receipts == 3 and [c.root for c in second.checkpoints()] == [taken.root]
    report = second.verify(expect_head=taken.root)
    assert report.ok and report.chains == 2 and report.receipts == 3


def _legacy_rows(count: int) -> list[dict[str, Any]]:
    """Receipts as a log from before per-writer chains held them: one chain, no chain id, each
    hash sha256 over ``ragwarden.audit.v1`` and the canonical JSON of every other field."""
    rows: list[dict[str, Any]] = []
    prev = GENESIS_HASH
    for seq in range(1, count + 1):
        row = {"seq": seq, "receipt_id": f"r{seq}", "time": datetime(2026, 1, 1, 0, 0, seq, tzinfo=timezone.utc),
               "kind": "retrieval", "operation": "search", "subject": "user:alice", "actor": None, "tenant": "acme",
               "purpose": None, "query_fingerprint": None, "query": None, "chunk_ids": [f"c{seq}"], "doc_ids": [],
               "labels": [], "chunk_labels": "{}", "withheld": 0, "allowed": True, "reason": "filtered by policy",
               "policy_version": None, "table_version": None, "details": "{}", "prev_hash": prev}  # fmt: skip
        payload = {k: int(v.timestamp() * 1_000_000) if k == "time" else v for k, v in row.items()}
        body = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        row["hash"] = prev = hashlib.sha256(b"ragwarden.audit.v1\n" + body.encode()).hexdigest()
        rows.append(row)
    return rows


def test_a_log_from_before_per_writer_chains_keeps_verifying_and_grows_new_chains(
    db: Any, receipt: Callable[..., Receipt]
) -> None:
    legacy_schema = pa.schema([field for field in AUDIT_SCHEMA if field.name != "chain"])
    rows = _legacy_rows(3)
    db.create_table(AUDIT, data=pa.Table.from_pylist(rows, schema=legacy_schema))
    log = log_of(db)
    assert log.verify(expect_head=(3, rows[-1]["hash"])).ok  # a head its old verify printed
    added = log.append(receipt())
    assert added.chain and added.seq == 1
    assert [r.chain for r in log.query()][-3:] == ["", "", ""]
    report = log.verify()
    assert report.ok and report.chains == 2 and report.receipts == 4
    db.open_table(AUDIT).update(where="seq = 2 AND chain IS NULL", values={"subject": "user:mallory"})
    assert log.verify().problems == ("seq 2: hash does not match the receipt's content (edited or forged)",)


def test_hmac_key_detects_a_rewrite_that_recomputes_plain_sha256_hashes(
    db: Any, receipt: Callable[..., Receipt]
) -> None:
    key = b"kept-away-from-the-table"
    log = log_of(db, key=key)
    for i in range(4):
        log.append(receipt(subject=f"user:u{i}"))
    assert log.verify().ok
    table = db.open_table(AUDIT)
    rows = rows_of(table)
    prev = GENESIS_HASH
    for row in rows:  # edit seq 2, then re-chain everything with sha256 as a forger would
        if row["seq"] == 2:
            row["subject"] = "user:mallory"
        row["prev_hash"] = prev
        row["hash"] = prev = plain_hash(row)
    rewrite(table, rows)
    report = log.verify()
    assert not report.ok
    assert [p for p in report.problems if "hash does not match" in p] == [
        f"chain {rows[0]['chain']} seq {seq}: hash does not match the receipt's content (edited or forged)" for seq in (1, 2, 3, 4)
    ]


def test_without_a_key_a_full_rewrite_with_recomputed_hashes_passes(
    five: tuple[AuditLog, list[StoredReceipt]], db: Any
) -> None:
    """The honest limit of a plain sha256 chain: it shows damage, not a deliberate rewrite."""
    log, _ = five
    table = db.open_table(AUDIT)
    rows = rows_of(table)
    prev = GENESIS_HASH
    for row in rows:
        row["subject"] = "user:mallory"
        row["prev_hash"] = prev
        row["hash"] = prev = plain_hash(row)
    rewrite(table, rows)
    assert log.verify().ok


def test_a_writer_with_another_key_is_refused_and_verify_says_why(db: Any, receipt: Callable[..., Receipt]) -> None:
    log_of(db, key=b"right").append(receipt())
    for other in (log_of(db, key=b"wrong"), log_of(db)):
        with pytest.raises(ConfigurationError, match="HMAC key"):
            other.append(receipt())
        report = other.verify()
        assert not report.ok and report.problems[0].startswith("table:")
    assert log_of(db, key=b"right").verify().ok


# -- queries -------------------------------------------------------------------------------


@pytest.fixture
def varied(db: Any, receipt: Callable[..., Receipt]) -> tuple[AuditLog, list[datetime]]:
    """Four receipts with distinct chunks, docs, subjects, labels, tenants and operations, and
    the instants between them (before 1, between 1 and 2, ..., after 4)."""
    log = log_of(db)
    marks = []
    specs = [
        {"chunk_ids": ("c1",), "doc_ids": ("d1",), "chunk_labels": {"c1": ("finance",)}},
        {"chunk_ids": ("c1", "c2"), "doc_ids": ("d1", "d2"), "chunk_labels": {"c2": ("hr",)}, "subject": "user:bob"},
        {"chunk_ids": (), "doc_ids": ("d3",), "chunk_labels": {}, "tenant": "globex", "operation": "forget",
         "kind": "decision", "query": None},
        {"chunk_ids": ("c3",), "doc_ids": ("d2",), "chunk_labels": {"c3": ("hr", "pii")}, "subject": "user:o'brien"},
    ]  # fmt: skip
    for spec in specs:
        marks.append(datetime.now(timezone.utc))
        time.sleep(0.002)
        log.append(receipt(**spec))
        time.sleep(0.002)
    marks.append(datetime.now(timezone.utc))
    return log, marks


def seqs(found: list[StoredReceipt]) -> list[int]:
    return [r.seq for r in found]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, [4, 3, 2, 1]),
        ({"chunk_id": "c1"}, [2, 1]),
        ({"doc_id": "d2"}, [4, 2]),
        ({"subject": "user:bob"}, [2]),
        ({"subject": "user:o'brien"}, [4]),
        ({"label": "hr"}, [4, 2]),
        ({"label": "pii"}, [4]),
        ({"tenant": "globex"}, [3]),
        ({"operation": "forget"}, [3]),
        ({"tenant": "acme", "label": "hr", "subject": "user:alice"}, []),
        ({"chunk_id": "c1", "subject": "user:alice"}, [1]),
        ({"limit": 2}, [4, 3]),
        ({"label": "hr", "limit": 1}, [4]),
        ({"limit": 0}, []),
    ],
)
def test_query_filters_select_exactly_the_matching_receipts_newest_first(
    varied: tuple[AuditLog, list[datetime]], filters: dict[str, Any], expected: list[int]
) -> None:
    log, _ = varied
    assert seqs(log.query(**filters)) == expected


def test_query_time_range_is_since_inclusive_until_exclusive(varied: tuple[AuditLog, list[datetime]]) -> None:
    log, marks = varied
    assert seqs(log.query(since=marks[1])) == [4, 3, 2]
    assert seqs(log.query(until=marks[2])) == [2, 1]
    assert seqs(log.query(since=marks[1], until=marks[3])) == [3, 2]
    (second,) = log.query(since=marks[1], until=marks[2])
    assert seqs(log.query(since=second.time, until=second.time + timedelta(microseconds=1))) == [2]
    assert seqs(log.query(since=second.time, until=second.time)) == []
    in_another_zone = marks[1].astimezone(timezone(timedelta(hours=-5)))
    assert seqs(log.query(since=in_another_zone)) == [4, 3, 2]


HOSTILE = ["x' OR '1'='1", "' OR 1=1 --", "acme') OR (1=1", "c1' OR true OR 'a", "user:o''brien", "%", "*"]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("name", ["chunk_id", "doc_id", "subject", "label", "tenant", "operation"])
def test_hostile_filter_values_match_nothing_extra(
    varied: tuple[AuditLog, list[datetime]], name: str, value: str
) -> None:
    log, _ = varied
    assert log.query(**{name: value}) == []


@pytest.mark.parametrize(
    "filters",
    [{"subject": "a\x00b"}, {"tenant": 3}, {"since": datetime(2025, 1, 1)}, {"until": "2025-01-01"}, {"limit": -1}],
)
def test_malformed_query_arguments_are_refused(
    varied: tuple[AuditLog, list[datetime]], filters: dict[str, Any]
) -> None:
    log, _ = varied
    with pytest.raises(InvalidRequestError):
        log.query(**filters)


# -- compaction and concurrent writers -----------------------------------------------------


def test_compaction_keeps_the_chain_and_merges_the_small_files(db: Any, receipt: Callable[..., Receipt]) -> None:
    log = log_of(db, compact_every=5)
    for _ in range(5):
        log.append(receipt())
    assert log.settled()  # the writer compacts in the background, after the fifth receipt's commit
    table = db.open_table(AUDIT)
    assert len(table.to_lance().get_fragments()) == 1
    for _ in range(2):
        log.append(receipt())
    assert len(table.to_lance().get_fragments()) == 3  # the merged file, then seq 6 and 7
    report = log.verify()
    assert report.ok and report.receipts == 7


def _writer(warehouse: str, name: str, count: int, start: Any, result: str) -> None:
    """Body of one spawned writer: wait for the start signal, append ``count`` receipts."""
    log = log_of(connect(Path(warehouse)), compact_every=7)
    start.wait(60)
    began = time.perf_counter()
    placed = [
        log.append(
            Receipt(kind="retrieval", operation="search", subject=f"user:{name}", tenant="acme", allowed=True,
                    reason=f"{name} #{i}", chunk_ids=(f"{name}-{i}",))
        )
        for i in range(count)
    ]  # fmt: skip
    Path(result).write_text(
        json.dumps({"places": [[r.chain, r.seq] for r in placed], "seconds": time.perf_counter() - began})
    )


def test_concurrent_spawned_writers_each_give_one_complete_valid_chain(tmp_path: Path, warehouse: Path) -> None:
    writers, each = 3, 20
    log_of(connect(warehouse))  # create the table before the race
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    results = [tmp_path / f"writer-{i}.json" for i in range(writers)]
    processes = [
        context.Process(
            target=runpy.run_path,
            args=(__file__,),
            kwargs={
                "run_name": "audit_writer",
                "init_globals": {"WRITER": (str(warehouse), f"w{i}", each, start, str(results[i]))},
            },
        )
        for i in range(writers)
    ]
    for process in processes:
        process.start()
    time.sleep(0.5)
    start.set()
    for process in processes:
        process.join(120)
    assert [p.exitcode for p in processes] == [0] * writers

    outcomes = [json.loads(path.read_text()) for path in results]
    for outcome in outcomes:  # each writer its own chain, numbered 1..each without a gap
        assert len({chain for chain, _ in outcome["places"]}) == 1
        assert [seq for _, seq in outcome["places"]] == list(range(1, each + 1))
    assert len({outcome["places"][0][0] for outcome in outcomes}) == writers
    log = log_of(connect(warehouse))
    report = log.verify()
    assert report.ok and report.receipts == writers * each and report.chains == writers, report.problems
    mine = {r.reason for r in log.query(subject="user:w1")}
    assert mine == {f"w1 #{i}" for i in range(each)}
    print("concurrent writers:", [round(o["seconds"], 2) for o in outcomes], "seconds per writer")


if __name__ == "audit_writer":  # run in a spawned process by runpy (see the test above)
    _writer(*WRITER)  # type: ignore[name-defined]  # noqa: F821


def test_verify_streams_the_log_so_its_memory_does_not_grow_with_the_receipts(
    db: Any, receipt: Callable[..., Receipt], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_table, "BATCH_ROWS", 200)
    log = log_of(db, checkpoint_every=None)
    with ThreadPoolExecutor(32) as pool:  # concurrent appends: group-committed, a few dozen commits
        list(pool.map(lambda _: log.append(receipt()), range(3000)))
    table = AuditTable(db, key_check="none")
    tracemalloc.start()
    try:
        every_row = [row for rows in table.batches() for row in rows]
        _, holding_all = tracemalloc.get_traced_memory()
        del every_row
        tracemalloc.reset_peak()
        report = log.verify(checkpoint=False)
        _, verifying = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.ok and report.receipts == 3000
    assert verifying < holding_all / 4, f"verify peaked at {verifying} bytes; holding every row takes {holding_all}"


def test_a_checkpoint_reads_only_recent_receipts_yet_binds_every_chain(
    db: Any, receipt: Callable[..., Receipt], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = log_of(db), log_of(db)
    quiet = second.append(receipt())  # a chain nobody writes to after the first checkpoint
    first.append(receipt())
    first.checkpoint()
    latest = first.append(receipt())
    monkeypatch.setattr(audit_log, "CHECKPOINT_SLACK", timedelta(0))
    asked: list[str | None] = []
    heads_of = AuditTable.heads
    monkeypatch.setattr(AuditTable, "heads", lambda self, where=None: asked.append(where) or heads_of(self, where))
    taken = first.checkpoint()
    assert asked and asked[-1] is not None and asked[-1].startswith("time >= TIMESTAMP")
    assert set(taken.heads) == {(quiet.chain, 1, quiet.hash), (latest.chain, 2, latest.hash)}
    assert taken.root == log_of(db).verify().checkpoint.root  # the same heads a full read finds


def test_a_writer_takes_a_checkpoint_every_so_many_of_its_receipts(db: Any, receipt: Callable[..., Receipt]) -> None:
    log = log_of(db, checkpoint_every=3)
    stored = [log.append(receipt()) for _ in range(3)]
    assert log.settled()  # taken in the background, after the third receipt's commit
    (taken,) = log.checkpoints()
    assert taken.heads == ((stored[0].chain, 3, stored[2].hash),) and taken.receipts == 3
    log.append(receipt())
    assert log.settled() and len(log.checkpoints()) == 1  # the next one after three more
