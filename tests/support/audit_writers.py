"""Audit logs as a warehouse's processes open them, and the body of a writer killed before it could
fold its journal (run in a spawned process)."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import lancedb

from ragwarden.governance.audit import Receipt
from ragwarden.state import AuditLog
from ragwarden.state.audit_journal import ReceiptJournal
from ragwarden.state.audit_table import AuditTable


def receipt(n: int) -> Receipt:
    return Receipt(kind="retrieval", operation="search", subject="user:alice", tenant="acme", allowed=True,
                   reason=f"search #{n}", chunk_ids=(f"c{n}",))  # fmt: skip


def journaled_log(folder: Path, **options: Any) -> AuditLog:
    """A log over ``folder``'s audit table and journal, as a warehouse in that folder opens it (a
    new one per process: each has its own chain and its own unfolded files)."""
    db = lancedb.connect(folder, read_consistency_interval=timedelta(0))
    journal = ReceiptJournal.of(str(folder), {})
    return AuditLog(lambda key_check: AuditTable(db, key_check=key_check, journal=journal),
                    compact_every=None, checkpoint_every=None, **options)  # fmt: skip


def journal_and_die(folder: str, count: int, start: Any, result: str) -> None:
    """Append ``count`` receipts, record their ids, and stop as a SIGKILL would (no exit handler
    folds): the receipts are durable in the journal only."""
    log = journaled_log(Path(folder))
    start.wait(60)
    placed = [log.append(receipt(n)) for n in range(count)]
    Path(result).write_text(json.dumps([found.receipt_id for found in placed]))
    os._exit(0)
