"""The receipts' journal: a receipt is in the log from the moment its journal file exists, every
reader sees it there or in the table (never twice, never in neither), a writer folds its files
into the table in bulk, files a killed writer left are folded once by whoever comes next, and a
journal file tampered with is caught by verify like a row of the table."""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa
import pytest
from pyarrow import ipc
from support.audit_writers import journal_and_die, journaled_log, receipt

from ragwarden.governance import audit as audit_module
from ragwarden.governance.audit import AuditLog
from ragwarden.state.audit_journal import JOURNAL, JournalFile, ReceiptJournal
from ragwarden.state.audit_table import AuditTable
from ragwarden.state.schema import AUDIT


def table_rows(folder: Path) -> int:
    return int(lancedb.connect(folder).open_table(AUDIT).count_rows())


def table_version(folder: Path) -> int:
    return int(lancedb.connect(folder).open_table(AUDIT).version)


def journal_files(folder: Path) -> list[JournalFile]:
    return ReceiptJournal.of(str(folder), {}).files()  # type: ignore[union-attr]


@pytest.fixture
def unfolding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers fold only when told to, so what waits in the journal stays there."""
    monkeypatch.setattr(audit_module, "FOLD_AFTER_S", 3600.0)


@pytest.fixture
def journaled_receipts(tmp_path: Path, unfolding: None) -> Iterator[tuple[Path, AuditLog]]:
    """Five receipts of one writer, each its own group commit, all still in the journal."""
    log = journaled_log(tmp_path)
    for n in range(5):
        log.append(receipt(n))
    yield tmp_path, log


def test_a_receipt_is_in_the_log_from_its_journal_file_before_any_fold(
    journaled_receipts: tuple[Path, AuditLog],
) -> None:
    folder, _ = journaled_receipts
    assert table_rows(folder) == 0 and len(journal_files(folder)) == 5
    reader = journaled_log(folder)  # another process's view of the warehouse
    assert reader.count() == 5
    assert sorted(found.reason for found in reader.query(subject="user:alice")) == [f"search #{n}" for n in range(5)]
    assert [found.seq for found in reader.query(chunk_id="c3")] == [4]
    report = reader.verify()
    assert report.ok and report.receipts == 5 and report.chains == 1


def test_a_fold_moves_every_waiting_file_in_one_commit_and_each_receipt_stays_once(
    journaled_receipts: tuple[Path, AuditLog],
) -> None:
    folder, log = journaled_receipts
    before = table_version(folder)
    assert log.fold() == 5
    assert table_version(folder) == before + 1 and table_rows(folder) == 5
    assert journal_files(folder) == [] and log.count() == 5 and log.verify().ok
    log.append(receipt(5))  # the chain goes on from the journal
    assert [found.seq for found in log.query(chunk_id="c5")] == [6] and log.verify().ok


def test_busy_concurrent_writers_commit_the_table_once_per_fold_not_once_per_group_commit(tmp_path: Path) -> None:
    log = journaled_log(tmp_path)
    log.append(receipt(-1))  # the table exists before the race
    assert log.fold() == 1
    before = table_version(tmp_path)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: log.append(receipt(n)), range(800)))
    groups = log._appender.batches
    log.fold()  # what the folder has not folded yet
    commits = table_version(tmp_path) - before
    assert table_rows(tmp_path) == 801 and log.verify().ok
    assert groups > 16  # many group commits...
    assert commits <= 800 / 50  # ...but at most one table version per 50 receipts


def test_a_writer_folds_on_its_own_once_its_oldest_receipt_has_waited_and_then_its_thread_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_module, "FOLD_AFTER_S", 0.2)
    log = journaled_log(tmp_path)

    def settles(done: Callable[[], bool]) -> bool:
        for _ in range(100):
            if done():
                return True
            threading.Event().wait(0.05)
        return False

    def folders() -> set[threading.Thread]:
        return {thread for thread in threading.enumerate() if thread.name == "audit-folder"}

    others = folders()  # other tests' writers, whose receipts still wait
    for round_ in (1, 2):  # the second receipt starts the thread again
        log.append(receipt(round_))
        assert settles(lambda: not journal_files(tmp_path)) and table_rows(tmp_path) == round_
        assert settles(lambda: folders() <= others)  # nothing waits: no thread polls for it


def test_a_journal_read_while_a_fold_lands_finds_each_receipt_exactly_once(
    journaled_receipts: tuple[Path, AuditLog],
) -> None:
    folder, log = journaled_receipts
    reader = journaled_log(folder)
    counts: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            counts.append(reader.count())

    thread = threading.Thread(target=read)
    thread.start()
    for n in range(5, 25):
        log.append(receipt(n))
        if n % 4 == 0:
            log.fold()
    stop.set()
    thread.join()
    assert counts and all(5 <= count <= 25 for count in counts)
    assert counts == sorted(counts)  # never one too many (in both places) nor one too few (in neither)
    assert reader.count() == 25


def test_a_killed_writer_s_journal_is_folded_once_even_by_two_writers_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "warehouse"
    journaled_log(folder).count()  # the table exists
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    result = tmp_path / "placed.json"
    process = context.Process(target=journal_and_die, args=(str(folder), 12, start, str(result)))
    process.start()
    start.set()
    process.join(120)
    placed = json.loads(result.read_text())
    assert len(placed) == 12 and journal_files(folder) and table_rows(folder) == 0

    tables = [journaled_log(folder)._table for _ in range(2)]  # two writers that came after
    barrier = threading.Barrier(2)

    def sweep(table: AuditTable) -> int:
        barrier.wait()
        return table.fold(orphaned_after=timedelta(0))

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(sweep, tables))
    assert journal_files(folder) == [] and table_rows(folder) == 12
    assert sorted(found.receipt_id for found in journaled_log(folder).query()) == sorted(placed)
    assert journaled_log(folder).verify().ok


def test_another_writer_leaves_a_fresh_journal_file_to_its_own_writer(
    journaled_receipts: tuple[Path, AuditLog],
) -> None:
    folder, _ = journaled_receipts
    assert journaled_log(folder).fold() == 0  # younger than ORPHANED_AFTER: its writer is alive
    assert len(journal_files(folder)) == 5


def _rewrite(path: Path, change: Any) -> None:
    rows = ipc.open_file(pa.memory_map(str(path))).read_all().to_pylist()
    change(rows)
    table = pa.Table.from_pylist(rows, schema=ipc.open_file(pa.memory_map(str(path))).schema)
    with ipc.new_file(str(path), table.schema) as out:
        out.write_table(table)


def test_an_edited_receipt_in_the_journal_is_caught_by_verify(journaled_receipts: tuple[Path, AuditLog]) -> None:
    folder, log = journaled_receipts
    file = journal_files(folder)[2]
    _rewrite(folder / JOURNAL / file.name, lambda rows: rows[0].update(subject="user:mallory"))
    report = log.verify()
    assert not report.ok
    assert any(f"chain {file.chain} seq 3: hash does not match" in problem for problem in report.problems)


def test_a_journal_file_deleted_from_the_middle_of_a_chain_is_a_gap(journaled_receipts: tuple[Path, AuditLog]) -> None:
    folder, log = journaled_receipts
    file = journal_files(folder)[1]
    (folder / JOURNAL / file.name).unlink()
    report = log.verify()
    assert not report.ok and any(f"chain {file.chain} seq 2: missing" in problem for problem in report.problems)


def test_an_unreadable_journal_file_is_named_by_verify_and_skipped_by_queries(
    journaled_receipts: tuple[Path, AuditLog],
) -> None:
    folder, log = journaled_receipts
    stray = JournalFile(chain="ab" * 8, first=1, last=1, written_ms=0)
    (folder / JOURNAL / stray.name).write_bytes(b"not an arrow file")
    assert log.count() == 5 and len(log.query()) == 5
    report = log.verify()
    assert not report.ok and any(stray.name in problem and "cannot be read" in problem for problem in report.problems)


def test_a_journal_file_s_name_says_whose_receipts_it_holds() -> None:
    file = JournalFile(chain="0123456789abcdef", first=7, last=12, written_ms=1_700_000_000_000)
    assert JournalFile.parse(file.name) == file
    for stray in ("notes.txt", f".{file.name}.0a1b.tmp", file.name.replace(".arrow", ".lance")):
        assert JournalFile.parse(stray) is None
