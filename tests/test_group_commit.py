"""Group commit: concurrent receipts go out in few commits, each caller returns only once its own
item is committed, and a failed commit fails exactly the callers whose items it held."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import timedelta

import lancedb
import pytest

from ragwarden.governance.audit import Receipt
from ragwarden.group_commit import GroupCommit
from ragwarden.state import AuditLog, AuditTable


def _race(threads: int, each: int, work) -> list:
    start = threading.Barrier(threads)
    results: list = []

    def run() -> None:
        start.wait()
        for n in range(each):
            results.append(work(n))

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return results


def test_concurrent_items_are_committed_in_batches_and_each_caller_gets_its_own_result():
    committed: list[int] = []

    def commit(items: Sequence[int]) -> list[int]:
        time.sleep(0.01)  # a commit takes a while: items arriving meanwhile form the next batch
        committed.extend(items)
        return [item * 10 for item in items]

    appender: GroupCommit[int, int] = GroupCommit(commit)
    counter = iter(range(10**6))
    lock = threading.Lock()

    def submit(_: int) -> tuple[int, int]:
        with lock:
            item = next(counter)
        return item, appender.submit(item)

    results = _race(8, 10, submit)
    assert all(result == item * 10 for item, result in results)
    assert sorted(committed) == list(range(80))
    assert appender.items == 80 and appender.batches <= 40, "eight waiting callers share commits"


def test_a_failed_commit_fails_its_callers_and_the_next_batch_still_commits():
    fail = threading.Event()
    fail.set()

    def commit(items: Sequence[str]) -> list[str]:
        if fail.is_set():
            fail.clear()
            raise OSError("disk full")
        return list(items)

    appender: GroupCommit[str, str] = GroupCommit(commit)
    with pytest.raises(OSError, match="disk full"):
        appender.submit("first")
    assert appender.submit("second") == "second"


def test_receipts_appended_by_many_threads_form_one_valid_chain_in_fewer_commits(tmp_path):
    db = lancedb.connect(tmp_path, read_consistency_interval=timedelta(0))
    log = AuditLog(lambda key_check: AuditTable(db, key_check=key_check))
    receipt = Receipt(kind="decision", operation="audit", subject="user:a", tenant="acme", allowed=True, reason="r")
    stored = _race(8, 10, lambda _: log.append(receipt))
    assert sorted(r.seq for r in stored) == list(range(1, 81))
    report = log.verify()
    assert report.ok and report.receipts == 80, report.problems
    versions = len(db.open_table("audit").list_versions())
    assert versions < 80, f"{versions} table versions for 80 receipts: no batching happened"


class _LostAnswerTable(AuditTable):
    """A real audit table whose first append lands but reports a failure, as a connection reset
    after the commit would: the writer cannot tell whether its receipts are in."""

    failed = False

    def append(self, rows):
        super().append(rows)
        if not self.failed:
            self.failed = True
            raise OSError("connection reset by peer")


def test_a_writer_that_cannot_tell_whether_a_commit_landed_starts_a_new_chain_never_a_fork(tmp_path):
    db = lancedb.connect(tmp_path, read_consistency_interval=timedelta(0))
    log = AuditLog(lambda key_check: _LostAnswerTable(db, key_check=key_check))
    receipt = Receipt(kind="decision", operation="audit", subject="user:a", tenant="acme", allowed=True, reason="r")
    with pytest.raises(OSError, match="connection reset"):
        log.append(receipt)
    after = [log.append(receipt), log.append(receipt)]
    assert [r.seq for r in after] == [1, 2] and after[0].chain == after[1].chain
    report = log.verify()
    assert report.ok and report.receipts == 3 and report.chains == 2, report.problems
