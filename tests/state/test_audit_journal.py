"""The receipts' journal: a receipt is in the log from the moment it is journaled, every reader
sees it there or in the table (never twice, never in neither), a writer folds its segments into
the table in bulk, segments a killed writer left are folded once by whoever comes next (never a
live writer's), and a journal file tampered with is caught by verify like a row of the table."""

from __future__ import annotations

import binascii
import json
import multiprocessing
import shutil
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import lancedb
import pytest
from support.audit_writers import journal_and_die, journaled_log, receipt

from ragwarden.governance.audit import Receipt
from ragwarden.state import AuditLog
from ragwarden.state import audit_log as audit_module
from ragwarden.state import journal_segments as segments
from ragwarden.state.audit_journal import JOURNAL, Journaled, JournalFile, ReceiptJournal
from ragwarden.state.audit_table import AuditTable
from ragwarden.state.schema import AUDIT


def table_rows(folder: Path) -> int:
    return int(lancedb.connect(folder).open_table(AUDIT).count_rows())


def table_version(folder: Path) -> int:
    return int(lancedb.connect(folder).open_table(AUDIT).version)


def journal_files(folder: Path) -> list[Journaled]:
    return ReceiptJournal.of(str(folder), {}).files()  # type: ignore[union-attr]


def segment_of(folder: Path, seq: int) -> Path:
    """The segment whose first record starts with receipt ``seq`` (its name says when, not what)."""
    for file in journal_files(folder):
        data = (folder / JOURNAL / file.name).read_bytes()
        start = len(segments.MAGIC) + 8
        if json.loads(data[start : data.index(b"\n", start)])["seq"] == seq:
            return folder / JOURNAL / file.name
    raise AssertionError(f"no segment starts with seq {seq}")


@pytest.fixture
def unfolding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers fold only when told to, so what waits in the journal stays there."""
    monkeypatch.setattr(audit_module, "FOLD_AFTER_S", 3600.0)


@pytest.fixture
def journaled_receipts(tmp_path: Path, unfolding: None) -> Iterator[tuple[Path, AuditLog]]:
    """Five receipts of one writer, each its own group commit in a segment of its own (sealed
    after it), all still in the journal."""
    log = journaled_log(tmp_path)
    for n in range(5):
        log.append(receipt(n))
        log._table._journal.seal()
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


def test_a_writers_group_commits_go_to_one_segment_until_a_fold_seals_it(tmp_path: Path, unfolding: None) -> None:
    log = journaled_log(tmp_path)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: log.append(receipt(n)), range(40)))
    assert log._appender.batches > 1 and len(journal_files(tmp_path)) == 1  # many group commits, one file
    assert log.fold() == 40 and journal_files(tmp_path) == []
    log.append(receipt(40))  # the next receipt starts a new segment
    assert len(journal_files(tmp_path)) == 1 and log.count() == 41 and log.verify().ok


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


def test_close_leaves_nothing_in_the_journal_and_no_thread_writing_so_a_copy_of_the_folder_is_whole(
    tmp_path: Path,
) -> None:
    log = journaled_log(tmp_path / "warehouse")  # folds on its own, in the background
    for n in range(5):
        log.append(receipt(n))
    assert log._folder is not None and log._folder.is_alive()
    assert log.close()
    assert journal_files(tmp_path / "warehouse") == [] and not log._folder.is_alive()
    shutil.copytree(tmp_path / "warehouse", tmp_path / "copy")
    copied = journaled_log(tmp_path / "copy").verify()
    assert copied.ok and copied.receipts == 5
    log.append(receipt(5))  # still usable: the next receipt starts the background work again
    assert log._folder.is_alive() and log.count() == 6


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
    """Rewrite a one-record segment's rows, as someone who can write the folder would: with a
    length and checksum that match, so only the chain can tell."""
    data = path.read_bytes()
    length, _ = struct.unpack_from("<II", data, len(segments.MAGIC))
    start = len(segments.MAGIC) + 8
    rows = [json.loads(line) for line in data[start : start + length].splitlines()]
    change(rows)
    body = "".join(json.dumps(row) + "\n" for row in rows).encode()
    path.write_bytes(segments.MAGIC + struct.pack("<II", len(body), binascii.crc32(body)) + body)


def test_an_edited_receipt_in_the_journal_is_caught_by_verify(journaled_receipts: tuple[Path, AuditLog]) -> None:
    folder, log = journaled_receipts
    _rewrite(segment_of(folder, 3), lambda rows: rows[0].update(subject="user:mallory"))
    chain = log.query()[0].chain
    report = log.verify()
    assert not report.ok
    assert any(f"chain {chain} seq 3: hash does not match" in problem for problem in report.problems)


def test_a_journal_file_deleted_from_the_middle_of_a_chain_is_a_gap(journaled_receipts: tuple[Path, AuditLog]) -> None:
    folder, log = journaled_receipts
    chain = log.query()[0].chain
    segment_of(folder, 2).unlink()
    report = log.verify()
    assert not report.ok and any(f"chain {chain} seq 2: missing" in problem for problem in report.problems)


def test_a_damaged_record_in_a_segment_is_named_by_verify_and_the_records_before_it_still_read(
    journaled_receipts: tuple[Path, AuditLog],
) -> None:
    folder, log = journaled_receipts
    for n in (5, 6, 7):
        log.append(receipt(n))  # a new segment of three records
    path = segment_of(folder, 6)
    data = bytearray(path.read_bytes())
    (first,) = struct.unpack_from("<I", data, len(segments.MAGIC))
    data[len(segments.MAGIC) + 8 + first + 8 + 20] ^= 0x01  # one bit of the second record's body
    path.write_bytes(bytes(data))
    report = journaled_log(folder).verify()
    assert not report.ok and any(path.name in problem and "damaged" in problem for problem in report.problems)
    assert sorted(found.seq for found in journaled_log(folder).query()) == [1, 2, 3, 4, 5, 6]


def test_a_damaged_last_record_is_named_once_its_writer_holds_the_segment_no_more(
    journaled_receipts: tuple[Path, AuditLog],
) -> None:
    folder, log = journaled_receipts
    path = segment_of(folder, 5)  # the chain's last receipt, alone in its segment
    data = bytearray(path.read_bytes())
    data[len(segments.MAGIC) + 8 + 20] ^= 0x01
    path.write_bytes(bytes(data))
    report = journaled_log(folder).verify()  # its writer holds it: a last record may be mid-copy
    assert report.ok and report.receipts == 4
    for segment in log._table._journal._held.values():
        segment.release()  # as if the writer had died
    report = journaled_log(folder).verify()
    assert not report.ok and any(path.name in problem and "damaged" in problem for problem in report.problems)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:lance is not fork-safe:UserWarning")  # the child touches no table
def test_a_forked_child_keeps_none_of_its_parents_segments_held(tmp_path: Path, unfolding: None) -> None:
    log = journaled_log(tmp_path)
    log.append(receipt(0))
    (path,) = [tmp_path / JOURNAL / file.name for file in journal_files(tmp_path)]
    context = multiprocessing.get_context("fork")  # a fork copies the parent's descriptors, and locks
    ready, done = context.Event(), context.Event()

    def child() -> None:
        ready.set()
        done.wait(30)

    process = context.Process(target=child)
    process.start()
    try:
        assert ready.wait(30)
        assert segments.in_use(path)  # the parent, alive, holds it
        for segment in log._table._journal._held.values():
            segment.release()  # as if the parent had died, its child living on
        assert not segments.in_use(path), "the child's copy of the descriptor kept the lock"
    finally:
        done.set()
        process.join(30)


def test_a_receipt_over_a_megabyte_is_journaled_folded_and_verified(tmp_path: Path, unfolding: None) -> None:
    log = journaled_log(tmp_path)
    ids = tuple(f"{n:032x}" for n in range(40_000))  # an operator's run naming 40,000 rows
    big = Receipt(kind="decision", operation="forget", subject="operator", tenant="acme", allowed=True,
                  reason="erasure", chunk_ids=ids)  # fmt: skip
    log.append(receipt(0))
    log.append(big)
    assert log.count() == 2 and log.verify().ok
    assert log.fold() == 2 and [len(found.chunk_ids) for found in log.query(operation="forget")] == [40_000]
    assert log.verify().ok


def test_a_record_being_copied_ends_a_segment_still_written_without_a_problem(tmp_path: Path) -> None:
    folder = tmp_path / JOURNAL
    segment = segments.OpenSegment(folder, 1 << 16)
    segment.append(segments.encode([{"seq": 1, "time": datetime.now(timezone.utc)}]))
    torn = segments.encode([{"seq": 2, "time": datetime.now(timezone.utc)}])
    data = bytearray((folder / segment.file.name).read_bytes())
    end = data.rstrip(b"\x00").__len__()
    data[end + 8 : end + 8 + len(torn) // 2] = torn[: len(torn) // 2]  # half its body, no length yet
    data[end : end + 4] = struct.pack("<I", len(torn))  # or a length read before its checksum
    bodies, problem = segments.decode(bytes(data), settled=False)
    assert [json.loads(body)["seq"] for body in bodies] == [1] and problem is None
    segment.release()


def test_a_live_writers_segment_is_never_folded_for_it_even_when_any_age_will_do(
    journaled_receipts: tuple[Path, AuditLog],
) -> None:
    folder, log = journaled_receipts
    log.append(receipt(5))  # five sealed segments and an open one, all its writer's until folded
    other = journaled_log(folder)
    assert other._table.fold(orphaned_after=timedelta(0)) == 0
    assert len(journal_files(folder)) == 6 and table_rows(folder) == 0
    assert log.fold() == 6 and journal_files(folder) == []
    assert table_rows(folder) == 6 and log.count() == 6 and log.verify().ok


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


def test_a_verify_that_meets_a_file_pruned_under_it_reads_again_and_a_real_failure_still_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = journaled_log(tmp_path)
    log.append(receipt(1))
    verify, calls = log._verify, []

    def pruned_once(**options: Any):
        calls.append(options)
        if len(calls) == 1:  # what object storage answers for a file a compaction pruned meanwhile
            raise OSError("AWS Error NO_SUCH_KEY during GetObject operation: The specified key does not exist.")
        return verify(**options)

    monkeypatch.setattr(log, "_verify", pruned_once)
    assert log.verify().ok and len(calls) == 2
    monkeypatch.setattr(log, "_verify", lambda **_: (_ for _ in ()).throw(OSError("disk on fire")))
    with pytest.raises(OSError, match="disk on fire"):
        log.verify()
