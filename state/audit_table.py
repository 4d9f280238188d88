"""The ``audit`` and ``audit_checkpoints`` tables: where receipts and checkpoints are stored and read.

The chains themselves (what a receipt holds, its hash, what ``verify`` proves) are
``governance.audit``; this module only stores rows. Each writer appends to its own chain, so an
append is a plain Lance append: appends by many processes commit side by side without a
conflict, and no writer ever reads another's rows to write its own. A log written before
per-writer chains gains the ``chain`` column in place (null: its rows form the one legacy chain).

Receipts reach the table through the journal (``audit_journal``) where the warehouse has one: an
append writes one journal file, and ``fold`` moves this writer's files into the table in one
commit (and, past ``ORPHANED_AFTER``, files a dead writer left). Every read covers both.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidValueError, WarehouseError
from ..governance.audit import LEGACY_CHAIN
from ..governance.sql import sql_in_list, sql_string
from .audit_journal import Journaled, ReceiptJournal
from .commit_retry import retrying_conflicts
from .journal_segments import encode, to_table
from .schema import AUDIT, AUDIT_CHECKPOINTS, AUDIT_SCHEMA, AUDIT_SEALS, CHECKPOINT_SCHEMA
from .tables import (
    compact_and_prune,
    damaged_files,
    declare_primary_key,
    local_path,
    names_storage_failures,
    open_table,
)

KEY_CHECK = b"ragwarden.audit.key_check"
"""Schema metadata naming the check value of the HMAC key the log was created with."""

BATCH_ROWS = 4096
"""Rows per batch when a whole log is streamed (verifying, finding heads): memory stays bounded."""

LINK_COLUMNS = ("chain", "seq", "hash", "prev_hash")

VERSIONS_KEPT = timedelta(seconds=30)
"""How long an old version of the receipts is kept. Every commit must find the latest version among
those kept, so an append slows as versions pile up, and busy replicas
commit many times a second, so the log keeps far fewer than the other tables; a read that may take
longer (verifying, finding the heads) pins its version with a tag instead (``_pinned``)."""


ORPHANED_AFTER = timedelta(seconds=60)
"""How old a journal file of another writer must be before any writer folds it: its own writer
folds within a second or two, so one this old was left by a writer that stopped (killed)."""


@names_storage_failures
class AuditTable:
    """The receipts' rows and the checkpoints over them. ``key_check`` is recorded in the receipts'
    schema when this creates the table."""

    def __init__(self, db: Any, *, key_check: str, journal: ReceiptJournal | None = None) -> None:
        self.uri: str = db.uri
        self._db = db
        self._journal = journal
        self._pending: list[tuple[Journaled, bytes, int]] = []  # this process's group commits, oldest first
        self._pending_pid = os.getpid()
        self._pending_lock = threading.Lock()
        self._folding = threading.Lock()
        self._table = self._open(db, key_check)
        if "chain" not in self._table.schema.names:  # a log from before per-writer chains
            self._table.add_columns(AUDIT_SCHEMA.field("chain"))
        schema = self._table.schema
        if journal is not None:  # two writers folding one stopped writer's file insert it once
            declare_primary_key(self._table, "receipt_id")
        if not schema.equals(AUDIT_SCHEMA, check_metadata=False):
            raise WarehouseError(
                f"the audit table has schema {schema}, expected {AUDIT_SCHEMA}; "
                "it was written by another version of ragwarden"
            )
        self._checkpoints: Any = None  # opened on first use: most processes never touch it

    @staticmethod
    def _open(db: Any, key_check: str) -> Any:
        """The receipts' table, created recording ``key_check``; its schema is checked by the caller,
        after a log from before per-writer chains has gained the ``chain`` column."""
        try:
            return db.open_table(AUDIT)
        except Exception:
            pass
        try:
            return db.create_table(AUDIT, schema=AUDIT_SCHEMA.with_metadata({KEY_CHECK: key_check.encode()}))
        except Exception as create_error:
            try:  # another process created it first
                return db.open_table(AUDIT)
            except Exception:
                raise WarehouseError(f"the audit table cannot be opened or created: {create_error}") from create_error

    def _checkpoint_table(self) -> Any:
        if self._checkpoints is None:
            self._checkpoints = open_table(self._db, AUDIT_CHECKPOINTS, CHECKPOINT_SCHEMA)
        return self._checkpoints

    def damaged_files(self) -> list[str]:
        tables = {AUDIT: self._table}
        if self._checkpoints is not None:
            tables[AUDIT_CHECKPOINTS] = self._checkpoints
        return damaged_files(local_path(self.uri), tables)

    def data_bytes(self) -> int:
        """Bytes of the data files the latest version of the receipts names: what the log holds
        once older versions are pruned."""
        return sum(int(data.file_size_bytes or 0) for fragment in self._table.to_lance().get_fragments()
                   for data in fragment.data_files())  # fmt: skip

    def recorded_key_check(self) -> str | None:
        """The key check the table was created with (None: a table older than key checks)."""
        value = (self._table.schema.metadata or {}).get(KEY_CHECK)
        return value.decode() if value is not None else None

    def schema_intact(self) -> bool:
        """Whether the table still has the receipts' schema (a changed one is tampering or damage)."""
        return bool(self._table.schema.equals(AUDIT_SCHEMA, check_metadata=False))

    def count(self) -> int:
        with self._view() as (dataset, unfolded):
            return int(dataset.count_rows()) + unfolded.num_rows

    # -- appending and folding ------------------------------------------------------------

    def append(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Make ``rows`` (consecutive receipts of one chain) durable at once, all or none: one
        journal write, or where the warehouse has no journal a plain append to the table (which
        never conflicts with another writer's append or with a compaction)."""
        if self._journal is None:
            self._table.add(pa.Table.from_pylist([dict(row) for row in rows], schema=AUDIT_SCHEMA))
            return
        chain = rows[0]["chain"]
        if not chain or any(row["chain"] != chain for row in rows):
            raise InvalidValueError("a group commit journals receipts of one (non-legacy) chain")
        body = encode(rows)
        with self._pending_lock:  # a fold seals and takes what is journaled, never half of a write
            written = self._journal.write(body, chain=chain, first=rows[0]["seq"], last=rows[-1]["seq"])
            self._own_pending().append((written, body, len(rows)))

    def _own_pending(self) -> list[tuple[Journaled, bytes, int]]:
        """This process's unfolded files (a forked child starts with none: the parent folds its own)."""
        if self._pending_pid != os.getpid():
            self._pending_pid, self._pending = os.getpid(), []
        return self._pending

    def pending(self) -> tuple[int, float]:
        """How many of this writer's receipts wait in the journal, and how many seconds the oldest has."""
        with self._pending_lock:
            own = list(self._own_pending())
        if not own:
            return 0, 0.0
        return sum(count for _, _, count in own), own[0][0].age_s()

    def fold(self, *, orphaned_after: timedelta | None = ORPHANED_AFTER) -> int:
        """Move this writer's journal files into the table in one commit, then (unless
        ``orphaned_after`` is None) other writers' files at least that old, in one commit that
        inserts only receipts the table lacks, so two writers folding one file leave it once.
        Returns the receipts moved."""
        if self._journal is None:
            return 0
        with self._folding:
            with self._pending_lock:
                own = list(self._own_pending())
                if own:
                    self._journal.seal()
            moved = 0
            if own:
                self._table.add(to_table([body for _, body, _ in own]))
                with self._pending_lock:  # in the table now: never added again, whatever follows
                    del self._own_pending()[: len(own)]
                self._journal.remove(list(dict.fromkeys(file for file, _, _ in own)))
                moved += sum(count for _, _, count in own)
            if orphaned_after is not None:
                moved += self._fold_orphans(orphaned_after, {file.name for file, _, _ in own})
            return moved

    def _fold_orphans(self, orphaned_after: timedelta, own: set[str]) -> int:
        assert self._journal is not None
        with self._pending_lock:
            own |= {file.name for file, _, _ in self._own_pending()}
        limit = orphaned_after.total_seconds()
        orphans = [file for file in self._journal.files()
                   if file.name not in own and file.age_s() >= limit and self._journal.abandoned(file)]  # fmt: skip
        if not orphans:
            return 0
        found = self._journal.read(orphans)
        if found.rows.num_rows:

            def insert_missing() -> None:  # refused if another writer inserts one of these meanwhile
                merge = self._table.to_lance().merge_insert("receipt_id").when_not_matched_insert_all()
                merge.conflict_retries(0).execute(found.rows)

            retrying_conflicts(insert_missing, what="folding the audit journal of a writer that stopped")
        self._journal.remove(found.read)  # an unreadable file stays, for verify to report
        return found.rows.num_rows

    # -- reading --------------------------------------------------------------------------

    @contextmanager
    def _pinned(self) -> Iterator[Any]:
        """The latest version of the receipts, tagged while it is read so no prune removes it."""
        dataset = self._table.to_lance()
        tag = f"reading-{uuid.uuid4().hex}"
        dataset.tags.create(tag, dataset.version)
        try:
            yield dataset
        finally:
            dataset.tags.delete(tag)

    @contextmanager
    def _view(self) -> Iterator[tuple[Any, pa.Table]]:
        """One version of the table (pinned) and the journal's receipts it does not hold yet. The
        journal is read first: a file folded meanwhile is then in the table read after it."""
        journal = self._journal.read(self._journal.files()) if self._journal is not None else None
        with self._pinned() as dataset:
            unfolded = journal.rows if journal is not None else AUDIT_SCHEMA.empty_table()
            ids = [value for value in unfolded.column("receipt_id").to_pylist() if value and "\x00" not in value]
            if ids:
                folded = dataset.to_table(columns=["receipt_id"], filter=f"receipt_id IN {sql_in_list(ids)}")
                unfolded = unfolded.filter(pc.invert(pc.is_in(unfolded.column("receipt_id"), folded.column("receipt_id"))))
            yield dataset, unfolded

    def journal_problems(self) -> list[str]:
        """Journal files that cannot be read as receipts (a reader skips them; verify reports them)."""
        return list(self._journal.read(self._journal.files()).problems) if self._journal is not None else []

    def batches(self, columns: Sequence[str] | None = None) -> Iterator[list[dict[str, Any]]]:
        """Every receipt of one version and the journal, ``BATCH_ROWS`` at a time."""
        for batch in self._arrow_batches(columns):
            yield batch.to_pylist()

    def _arrow_batches(self, columns: Sequence[str] | None, where: str | None = None) -> Iterator[pa.RecordBatch]:
        with self._view() as (dataset, unfolded):
            yield from dataset.to_batches(columns=list(columns) if columns else None, filter=where, batch_size=BATCH_ROWS)
            yield from _selected(unfolded, columns, where).to_batches(BATCH_ROWS)

    def links(self, chain: str | None) -> list[dict[str, Any]]:
        """``LINK_COLUMNS`` of one chain's rows (None: the legacy chain), lowest ``seq`` first; read
        to say exactly what is wrong with a chain once a streamed check has found it broken."""
        found: list[pa.RecordBatch] = []
        for batch in self._arrow_batches(LINK_COLUMNS):
            column = batch.column("chain")
            mask = pc.is_null(column) if chain is None else pc.fill_null(pc.equal(column, chain), False)
            found.append(batch.filter(mask))
        if not found:
            return []
        return pa.Table.from_batches(found).sort_by([("seq", "ascending")]).to_pylist()

    def heads(self, where: str | None = None) -> dict[str | None, tuple[int, str]]:
        """Each chain's highest ``seq`` and its hash (None: the legacy chain) among the rows
        ``where`` admits (every row for None), streamed and computed per batch in Arrow."""
        heads: dict[str | None, tuple[int, str]] = {}
        for batch in self._arrow_batches(("chain", "seq", "hash"), where):
            table = pa.Table.from_batches([batch])
            table = table.set_column(0, "chain", pc.fill_null(table.column("chain"), ""))
            top = table.group_by("chain", use_threads=False).aggregate([("seq", "max")])
            found = table.join(top, keys=["chain"], use_threads=False)
            found = found.filter(pc.equal(found.column("seq"), found.column("seq_max")))
            for chain, seq, digest in zip(*(found.column(name).to_pylist() for name in ("chain", "seq", "hash")), strict=True):
                key = chain or None
                if key not in heads or seq > heads[key][0]:
                    heads[key] = (seq, digest)
        return heads

    def rows(self, where: str | None = None) -> list[dict[str, Any]]:
        """Rows ``where`` admits (every row for None), newest first."""
        return self.page(where)[1]

    def page(self, where: str | None = None, *, offset: int = 0, limit: int | None = None) -> tuple[int, list[dict[str, Any]]]:
        """How many rows ``where`` admits, and ``limit`` of them after the newest ``offset``,
        newest first: only the page becomes Python objects."""
        found = pa.Table.from_batches(list(self._arrow_batches(None, where)), schema=AUDIT_SCHEMA)
        ordered = found.sort_by([("time", "descending"), ("chain", "ascending"), ("seq", "descending")])
        return ordered.num_rows, ordered.slice(offset, limit).to_pylist()

    def add_checkpoint(self, row: Mapping[str, Any]) -> None:
        self._checkpoint_table().add(pa.Table.from_pylist([dict(row)], schema=CHECKPOINT_SCHEMA))

    def seals(self) -> list[dict[str, Any]]:
        """Every retention seal, oldest first: each binds, per chain, the last receipt archived."""
        if AUDIT_SEALS not in self._db.list_tables().tables:
            return []
        return open_table(self._db, AUDIT_SEALS, CHECKPOINT_SCHEMA).to_arrow().sort_by([("time", "ascending")]).to_pylist()

    def archive_rows(self, ranges: Mapping[str, tuple[int, int]]) -> pa.Table:
        """The receipts of each chain after the first seq of its range and up to the last (the
        table's; the journal is folded first), in chain and seq order, as the table holds them."""
        self.fold()
        where = " OR ".join(f"({_chain_is(chain)} AND seq > {int(after)} AND seq <= {int(through)})"
                            for chain, (after, through) in sorted(ranges.items()))  # fmt: skip
        found = pa.Table.from_batches(list(self._arrow_batches(None, where)), schema=AUDIT_SCHEMA) if where else AUDIT_SCHEMA.empty_table()
        return found.sort_by([("chain", "ascending"), ("seq", "ascending")])

    def seal_and_remove(self, seal: Mapping[str, Any], cut: Mapping[str, int]) -> None:
        """Record ``seal``, then remove the receipts it seals (``cut``: per chain, the last seq
        archived) in one commit, then merge the table's files (older versions go with the next
        prune). In that order: a removal cut short leaves sealed rows that verify passes over."""
        open_table(self._db, AUDIT_SEALS, CHECKPOINT_SCHEMA).add(pa.Table.from_pylist([dict(seal)], schema=CHECKPOINT_SCHEMA))
        where = _through(cut)
        if where:
            self._table.delete(where)
            compact_and_prune(self._table, prune=True)

    def checkpoints(self) -> list[dict[str, Any]]:
        """Every checkpoint, oldest first (none when no checkpoint was ever taken)."""
        if self._checkpoints is None and AUDIT_CHECKPOINTS not in self._db.list_tables().tables:
            return []
        return self._checkpoint_table().to_arrow().sort_by([("time", "ascending")]).to_pylist()

    def compact(self, *, prune: bool = True) -> int:
        """Fold the journal (this writer's files, and orphans), merge both tables' small data files
        (each commit leaves one) and, with ``prune``, drop their old versions (``VERSIONS_KEPT``);
        receipts are unchanged. Returns the versions dropped."""
        self.fold()
        dropped = compact_and_prune(self._table, prune=prune, older_than=VERSIONS_KEPT)
        if self._checkpoints is not None or AUDIT_CHECKPOINTS in self._db.list_tables().tables:
            dropped += compact_and_prune(self._checkpoint_table(), prune=prune, older_than=VERSIONS_KEPT)
        return dropped


def _through(cut: Mapping[str, int]) -> str:
    """A filter of each chain's receipts up to its seq in ``cut``."""
    return " OR ".join(f"({_chain_is(chain)} AND seq <= {int(seq)})" for chain, seq in sorted(cut.items()))


def _chain_is(chain: str) -> str:
    """A filter of one chain's receipts (quoted as data; the legacy chain, from before per-writer
    chains, is the one without a name)."""
    return "chain IS NULL" if chain == LEGACY_CHAIN else f"chain = {sql_string(chain)}"


def _selected(rows: pa.Table, columns: Sequence[str] | None, where: str | None) -> pa.Table:
    """``columns`` of the ``rows`` that ``where`` (the table's SQL) admits: evaluated by Lance on an
    in-memory copy, so the journal's receipts are filtered exactly as the table's."""
    if where and rows.num_rows:
        rows = lance.write_dataset(rows, f"memory://{uuid.uuid4().hex}").to_table(filter=where)
    return rows.select(list(columns)) if columns else rows
