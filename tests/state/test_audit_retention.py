"""Audit retention: a range of old receipts is sealed and moved out of the log, never dropped.
The log verifies on from the seal; the archive verifies alone against it; a receipt removed or
edited after the seal, or an archive changed, is reported as before."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.audit_writers import journaled_log, receipt

from ragwarden.errors import InvalidRequestError, NotFoundError, WarehouseError
from ragwarden.state import AuditLog
from ragwarden.state import audit_log as audit_module

KEY = b"the audit key"


def archive_to(log: AuditLog, folder: Path, before: datetime):
    def write(name: str, data: bytes) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)

    return log.archive(before, write)


def read_from(folder: Path):
    return lambda name: (folder / name).read_bytes()


@pytest.fixture
def aged_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, AuditLog, AuditLog, datetime]:
    """Two writers' chains: five and three receipts written before the cut, then two more on the
    first chain after it (the slack before a cut shrunk so that a test need not wait ten minutes)."""
    monkeypatch.setattr(audit_module, "CHECKPOINT_SLACK", timedelta(0))
    folder = tmp_path / "warehouse"
    first, second = journaled_log(folder, key=KEY), journaled_log(folder, key=KEY)
    for n in range(5):
        first.append(receipt(n))
    for n in range(5, 8):
        second.append(receipt(n))
    cut = datetime.now(timezone.utc)
    for n in range(8, 10):
        first.append(receipt(n))
    first.fold(), second.fold()
    return folder, first, second, cut


def test_an_archived_range_leaves_the_log_which_verifies_on_from_the_seal(aged_log, tmp_path: Path) -> None:
    folder, first, _, cut = aged_log
    done = archive_to(first, tmp_path / "2026-q4", cut)
    assert (done.receipts, done.chains) == (8, 2)
    assert first.count() == 2  # only what was written after the cut stays
    report = first.verify()
    assert report.ok and report.receipts == 2, report.problems
    first.append(receipt(10))  # the chain goes on from its sealed head
    assert journaled_log(folder, key=KEY).verify(checkpoint=False).ok


def test_the_archive_verifies_alone_against_its_seal_and_a_changed_one_is_reported(aged_log, tmp_path: Path) -> None:
    _, first, _, cut = aged_log
    archive = tmp_path / "2026-q4"
    archive_to(first, archive, cut)
    report = first.verify_archive(read_from(archive))
    assert report.ok and (report.receipts, report.chains) == (8, 2), report.problems
    rows = pq.read_table(archive / "receipts.parquet")
    pq.write_table(rows.slice(1), archive / "receipts.parquet")  # a receipt dropped from the archive
    assert not first.verify_archive(read_from(archive)).ok


def test_a_receipt_removed_after_the_seal_is_still_reported(aged_log, tmp_path: Path) -> None:
    folder, first, _, cut = aged_log
    archive_to(first, tmp_path / "archive", cut)
    first._table._table.delete("seq = 6")  # the first kept receipt of the first chain, gone
    problems = journaled_log(folder, key=KEY).verify(checkpoint=False).problems
    assert any("missing (deleted or renumbered)" in p or "links do not add up" in p for p in problems), problems


def test_archives_follow_one_another_each_sealing_on_from_the_last(aged_log, tmp_path: Path) -> None:
    folder, first, _, cut = aged_log
    archive_to(first, tmp_path / "one", cut)
    later = datetime.now(timezone.utc)
    first.append(receipt(11))
    done = archive_to(first, tmp_path / "two", later)
    assert (done.receipts, done.chains) == (2, 1)
    assert first.verify_archive(read_from(tmp_path / "two")).ok and first.verify_archive(read_from(tmp_path / "one")).ok
    assert journaled_log(folder, key=KEY).verify(checkpoint=False).ok and first.count() == 1


def test_nothing_is_archived_from_a_log_that_does_not_verify_or_too_recent_or_empty(aged_log, tmp_path: Path, monkeypatch) -> None:
    folder, first, _, cut = aged_log
    monkeypatch.setattr(audit_module, "CHECKPOINT_SLACK", timedelta(minutes=10))
    with pytest.raises(InvalidRequestError, match="at least 0:10:00 ago"):
        archive_to(first, tmp_path / "soon", datetime.now(timezone.utc))
    monkeypatch.setattr(audit_module, "CHECKPOINT_SLACK", timedelta(0))
    with pytest.raises(NotFoundError, match="no receipt written before"):
        archive_to(first, tmp_path / "empty", cut - timedelta(days=1))
    first._table._table.update(where="seq = 2", values={"reason": "rewritten"})
    with pytest.raises(WarehouseError, match="does not verify"):
        archive_to(first, tmp_path / "broken", cut)
    assert not (tmp_path / "broken").exists() and first.count() == 10
