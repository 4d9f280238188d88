"""The audit log's writer: receipts committed durably, chained, folded, compacted and checkpointed.

The receipts and their hash rule are ``governance.audit``'s; this is the service that keeps them.
Every writer process appends to a chain of its own. Writers never read each other's rows: within a
process one appender commits the receipts of concurrent callers together (``group_commit``), each
caller returning once its receipt is durable, and processes append side by side without a race for
a shared head. A group commit is one record of the writer's segment of the receipts' journal
locally, one file on object storage (``audit_journal``); a thread of the writer folds what it
journaled into the table every ``FOLD_AFTER_S`` (or ``FOLD_ROWS``), and at exit. A writer that
cannot tell whether a commit landed starts a new chain rather than risk a fork.

Writers take a checkpoint every ``checkpoint_every`` receipts, ``verify`` takes one of exactly what
it verified, and ``checkpoint()`` takes one on demand. Each table commit lands as a small data file,
so a writer merges them every ``compact_every`` of its receipts and, at most every
``PRUNE_EVERY_S``, drops old versions (``audit_table.VERSIONS_KEPT``); both run beside the appends,
which they commute with. The warehouse's ``optimize`` does the same.
"""

from __future__ import annotations

import atexit
import io
import json
import logging
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

import pyarrow.parquet as pq

from ..errors import ConfigurationError, InvalidRequestError, NotFoundError, WarehouseError
from ..governance.audit import (
    GENESIS_HASH,
    HEX64,
    LEGACY_CHAIN,
    PLACED,
    ArchiveReport,
    ChainHead,
    ChainPass,
    ChainReport,
    Checkpoint,
    KeyRing,
    Prepared,
    Receipt,
    StoredReceipt,
    broken_links,
    canonical_json,
    checkpoint_of,
    checkpoint_row,
    joined_payload,
    non_negative,
    payload_parts,
    place,
    stored_receipt,
)
from ..governance.sql import sql_list, sql_string, sql_timestamp
from ..group_commit import GroupCommit
from .commit_retry import is_missing_file

log = logging.getLogger(__name__)

COMPACT_EVERY = 1000
CHECKPOINT_EVERY = 1000
FOLD_ROWS = 1000
"""A writer folds its journal into the table once this many of its receipts wait there..."""
FOLD_AFTER_S = 1.0
FOLD_BACKOFF_MAX_S = 60.0
"""The longest wait between two tries of a fold that keeps failing (the object store gone, say)."""
"""...or once the oldest has waited this long: one table commit a second for a busy writer."""
ORPHAN_SWEEP_S = 60.0
"""How often a writer's fold also takes the journal files that writers which stopped left."""
PRUNE_EVERY_S = 10.0
"""How often a writer's compactions also drop old versions: pruning reads every version's manifest."""
CHECKPOINT_SLACK = timedelta(minutes=10)
VERIFY_ATTEMPTS = 3
"""How far before the latest checkpoint a new one looks for receipts (clocks of writers differ)."""


class ReceiptTable(Protocol):
    """Where the log's rows live (``state.AuditTable``): the chain is computed here, stored there."""

    def recorded_key_check(self) -> str | None: ...
    def schema_intact(self) -> bool: ...
    def count(self) -> int: ...
    def append(self, rows: Sequence[Mapping[str, Any]]) -> None: ...
    def batches(self, columns: Sequence[str] | None = None) -> Iterator[list[dict[str, Any]]]: ...
    def links(self, chain: str | None) -> list[dict[str, Any]]: ...
    def heads(self, where: str | None = None) -> dict[str | None, tuple[int, str]]: ...
    def rows(self, where: str | None = None) -> list[dict[str, Any]]: ...
    def page(self, where: str | None = None, *, offset: int = 0, limit: int | None = None) -> tuple[int, list[dict[str, Any]]]: ...
    def add_checkpoint(self, row: Mapping[str, Any]) -> None: ...
    def checkpoints(self) -> list[dict[str, Any]]: ...
    def compact(self, *, prune: bool = True) -> int: ...
    def pending(self) -> tuple[int, float]: ...
    def fold(self, *, orphaned_after: timedelta | None = ...) -> int: ...
    def journal_problems(self) -> list[str]: ...


@dataclass(frozen=True, kw_only=True)
class _Writer:
    """This process's own chain: where its next receipt goes."""

    pid: int
    chain: str
    seq: int = 0
    hash: str = GENESIS_HASH


def _fold_while_waiting(ref: weakref.ReferenceType[AuditLog]) -> None:
    """The folding thread's body: wake every quarter of ``FOLD_AFTER_S`` (at once when many wait)
    and fold what is due; end once nothing of this writer waits (its next receipt starts another)
    or nobody holds the log any more."""
    while True:
        audit = ref()
        if audit is None:
            return
        wake = audit._fold_wake
        if not audit._fold_when_due():
            return
        del audit  # hold the log only while folding
        wake.wait(FOLD_AFTER_S / 4)
        wake.clear()


def _fold_at_exit(ref: weakref.ReferenceType[AuditLog]) -> None:
    """At exit, fold what waits, so a process that stops normally leaves no journal behind. When
    the fold cannot run (the object store gone before the process), the receipts stay where they
    already count as the log's, and a later writer folds them: said as that, once."""
    audit = ref()
    waiting = audit._table.pending()[0] if audit is not None and audit._folder_pid == os.getpid() else 0
    if not waiting:
        return
    try:
        audit._table.fold(orphaned_after=None)  # type: ignore[union-attr]
    except Exception as exc:
        log.warning("%d audit receipt(s) of this process were left in the warehouse's audit journal, where they are "
                    "already part of the log; the next writer's fold takes them into the audit table (%s)", waiting, exc)  # fmt: skip


class AuditLog:
    """The ``audit`` table: append receipts, verify the chains, find receipts by what they touched.

    ``key``, when given, makes every hash an HMAC-sha256 so that whoever can rewrite the table
    cannot forge a valid chain without the key. A log keeps one key for its life: the table
    records a check value of it, and a writer with another key (or none) is refused.
    """

    def __init__(
        self,
        table_for: Callable[[str], ReceiptTable],
        *,
        key: bytes | None = None,
        retired_keys: Sequence[bytes] = (),
        seal: str | None = None,
        compact_every: int | None = COMPACT_EVERY,
        checkpoint_every: int | None = CHECKPOINT_EVERY,
    ) -> None:
        """``table_for(key_check)`` opens the receipts' table, recording ``key_check`` (a check
        value of ``key``) if it creates it (``state.Store.audit_table``). A writer merges the
        table's small files every ``compact_every`` of its receipts and takes a checkpoint every
        ``checkpoint_every`` (None: never)."""
        self._keys = KeyRing.of(key, retired_keys, seal)  # the key writers hash with, and those rotated out
        self._hasher = self._keys.current
        for name, every in (("compact_every", compact_every), ("checkpoint_every", checkpoint_every)):
            if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
                raise ConfigurationError(f"{name} must be a positive int or None, got {every!r}")
        self._compact_every = compact_every
        self._checkpoint_every = checkpoint_every
        self._table = table_for(self._hasher.key_check)
        self._key_problem_at_open = self._key_problem()  # the key check never changes legitimately
        self._writer: _Writer | None = None
        self._written = 0  # receipts this process committed (for its maintenance rhythm)
        self._maintaining = threading.Lock()
        self._pruned_at = float("-inf")
        self._appender: GroupCommit[Prepared, dict[str, Any]] = GroupCommit(self._commit, name="audit-appender")
        self._fold_wake = threading.Event()
        self._folder_pid: int | None = None
        self._folder_running = False
        self._folder_lock = threading.Lock()
        self._folder: threading.Thread | None = None
        self._swept_at = float("-inf")
        self._fold_failures = 0  # in a row: each doubles the wait before the next try (``FOLD_BACKOFF_MAX_S`` at most)
        self._fold_retry_at = float("-inf")

    def _key_problem(self) -> str | None:
        return self._keys.key_problem(self._table.recorded_key_check())

    # -- maintenance ------------------------------------------------------------------------

    def compact(self) -> None:
        """Fold the journal into the table, merge the receipts' small data files and drop old
        versions; receipts are unchanged."""
        self._table.compact()
        self._pruned_at = time.monotonic()

    def fold(self) -> int:
        """Move this writer's receipts from the journal into the table now (one commit), and the
        files of writers that stopped; returns how many moved. Writers fold on their own."""
        self._swept_at = time.monotonic()
        return self._table.fold()

    def _start_folder(self) -> None:
        """Start this process's folding thread unless it runs. It holds the log only weakly (a log
        nobody uses any more is collected and its thread ends) and ends when nothing waits."""
        with self._folder_lock:
            if self._folder_running and self._folder_pid == os.getpid():
                return
            if self._folder_pid != os.getpid():
                atexit.register(_fold_at_exit, weakref.ref(self))
            self._folder_pid, self._folder_running = os.getpid(), True
            self._folder = threading.Thread(target=_fold_while_waiting, args=(weakref.ref(self),), name="audit-folder", daemon=True)
            self._folder.start()

    def close(self, timeout: float = 60.0) -> bool:
        """Finish this writer's background work: fold its journal into the table, let the folding
        thread end and wait for any compaction or checkpoint, so the folder can be copied or the
        process left with nothing in flight. False if something still ran at ``timeout``. The log
        stays usable: a later receipt starts the work again."""
        self.fold()
        with self._folder_lock:
            folder = self._folder
        if folder is not None:
            self._fold_wake.set()
            folder.join(timeout)
        return self.settled(timeout) and not (folder is not None and folder.is_alive())

    def _fold_when_due(self) -> bool:
        """Fold if ``FOLD_ROWS`` receipts wait or the oldest has waited ``FOLD_AFTER_S`` (sweeping
        stopped writers' files every ``ORPHAN_SWEEP_S``); False once nothing waits (the thread
        is then marked stopped)."""
        with self._folder_lock:  # a receipt journaled after this sees the thread gone, and starts one
            rows, waited = self._table.pending()
            if not rows:
                self._folder_running = False
                return False
        if (rows >= FOLD_ROWS or waited >= FOLD_AFTER_S) and time.monotonic() >= self._fold_retry_at:
            sweep = time.monotonic() - self._swept_at >= ORPHAN_SWEEP_S
            try:
                if sweep:
                    self.fold()
                else:
                    self._table.fold(orphaned_after=None)
            except Exception as exc:  # the receipts are durable in the journal; a later pass retries
                self._fold_failures += 1
                self._fold_retry_at = time.monotonic() + min(FOLD_BACKOFF_MAX_S, FOLD_AFTER_S * 2**self._fold_failures)
                if self._fold_failures == 1:  # said once per outage, not at every try
                    log.warning("folding the audit journal failed (it will be tried again, less and less often): %s", exc)
                return True
            if self._fold_failures:
                log.warning("folding the audit journal works again, after %d failed tries", self._fold_failures)
                self._fold_failures, self._fold_retry_at = 0, float("-inf")
        return True

    def _compact_as_writer(self) -> None:
        """A writer's compaction: merge every time, drop old versions at most every ``PRUNE_EVERY_S``."""
        if time.monotonic() - self._pruned_at >= PRUNE_EVERY_S:
            self.compact()
        else:
            self._table.compact(prune=False)

    def _in_background(self, what: str, step: Callable[[], object]) -> None:
        """Run ``step`` on a thread of its own (one at a time), so no caller waits for it and
        appends go on meanwhile (compaction and checkpoints commute with appends). The receipts are
        already committed: a failed step (say, a race with another process's compaction) is only
        logged, never mistaken for a failed append."""
        if not self._maintaining.acquire(blocking=False):
            return  # one step at a time; the next threshold tries again

        def run() -> None:
            try:
                step()
            except Exception as exc:
                log.warning("audit log %s failed (it will be tried again later): %s", what, exc)
            finally:
                self._maintaining.release()

        # Not a daemon: a process that exits meanwhile waits for the step rather than abort inside Lance.
        threading.Thread(target=run, name=f"audit-{what}", daemon=False).start()

    def pending(self) -> tuple[int, float]:
        """How many of this writer's receipts wait in the journal to be folded into the table, and
        how many seconds the oldest has waited (for metrics)."""
        return self._table.pending()

    def count(self) -> int:
        """How many receipts the log holds, in all chains."""
        return self._table.count()

    def settled(self, timeout: float = 60.0) -> bool:
        """Wait until no compaction or checkpoint runs in the background (False if one still does)."""
        if not self._maintaining.acquire(timeout=timeout):
            return False
        self._maintaining.release()
        return True

    def checkpoint(self) -> Checkpoint:
        """Bind every chain's current head into one root, store it and return it. Only receipts
        written since the latest checkpoint (less ``CHECKPOINT_SLACK``, for clocks that differ)
        are read, the older heads taken from that checkpoint when it is intact; else every
        receipt is read. Either way verify confirms each recorded head is still in the log."""
        stored = self._table.checkpoints()
        heads: dict[str, tuple[int, str]] = {}
        where = None
        latest = checkpoint_of(stored[-1]) if stored else None
        if latest is not None and self._keys.intact(latest):
            heads = {chain: (seq, digest) for chain, seq, digest in latest.heads}
            where = f"time >= {sql_timestamp(latest.time - CHECKPOINT_SLACK, 'since')}"
        for chain, (seq, digest) in self._table.heads(where).items():
            key = chain or LEGACY_CHAIN
            if key not in heads or seq > heads[key][0]:
                heads[key] = (seq, digest)
        return self._store_checkpoint(heads)

    def _store_checkpoint(self, heads: Mapping[str, tuple[int, str]]) -> Checkpoint:
        taken = self._hasher.checkpoint(heads, datetime.now(timezone.utc))
        self._table.add_checkpoint(checkpoint_row(taken))
        return taken

    def checkpoints(self) -> list[Checkpoint]:
        """Every stored checkpoint, oldest first."""
        return [checkpoint_of(row) for row in self._table.checkpoints()]

    # -- appending ------------------------------------------------------------------------

    def append(self, receipt: Receipt) -> StoredReceipt:
        """Add ``receipt`` at the end of this process's chain and return it as stored, once durable.

        The process's receipts are committed by one appender, in batches (``appender``).
        """
        if not isinstance(receipt, Receipt):
            raise InvalidRequestError(f"append needs a Receipt, got {type(receipt).__name__}")
        if self._key_problem_at_open:
            raise ConfigurationError(f"{self._key_problem_at_open}; open it with the key it was created with")
        return StoredReceipt._placed(receipt, self._appender.submit(Prepared.of(receipt)))

    def _commit(self, prepared: Sequence[Prepared]) -> list[dict[str, Any]]:
        """Chain ``prepared`` receipts onto this process's chain (a new one in a new process) and
        commit them at once; returns what the log added to each (``PLACED``). Commits run one at
        a time and every search waits for one, so what can be done before (a receipt's columns and
        most of its hash payload) is done on the caller's thread (``Prepared``)."""
        writer = self._writer
        if writer is None or writer.pid != os.getpid():
            writer = _Writer(pid=os.getpid(), chain=secrets.token_hex(8))
        rows: list[dict[str, Any]] = []
        prev_hash = writer.hash
        for offset, item in enumerate(prepared, start=1):
            placed = {"chain": writer.chain, "seq": writer.seq + offset, "receipt_id": item.receipt_id,
                      "time": datetime.now(timezone.utc), "prev_hash": prev_hash}  # fmt: skip
            payload = joined_payload({**item.parts, **payload_parts(placed, tuple(placed))}, legacy=False)
            prev_hash = placed["hash"] = self._hasher.digest(payload)
            rows.append({**item.columns, **placed})
        self._writer = None  # until the commit is known to have landed: a failure starts a new chain
        self._table.append(rows)
        self._writer = _Writer(pid=writer.pid, chain=writer.chain, seq=rows[-1]["seq"], hash=rows[-1]["hash"])
        waiting, _ = self._table.pending()
        if waiting:  # journaled: the folder moves them into the table
            self._start_folder()
            if waiting >= FOLD_ROWS:
                self._fold_wake.set()
        before, self._written = self._written, self._written + len(rows)
        for every, what, step in ((self._compact_every, "compaction", self._compact_as_writer),
                                  (self._checkpoint_every, "checkpoint", self.checkpoint)):  # fmt: skip
            if every and before // every != self._written // every:
                self._in_background(what, step)
        return [{name: row[name] for name in PLACED} for row in rows]

    # -- verifying ------------------------------------------------------------------------

    def verify(self, *, expect_head: str | tuple[int, str] | None = None, checkpoint: bool = True) -> ChainReport:
        """See ``_verify``. Read-only, so a pass that meets a file another writer's compaction
        pruned from under it (the version it opened was replaced meanwhile) reads again, from the
        latest version, at most ``VERIFY_ATTEMPTS`` times."""
        attempt = 1
        while True:
            try:
                return self._verify(expect_head=expect_head, checkpoint=checkpoint)
            except Exception as exc:
                if attempt >= VERIFY_ATTEMPTS or not is_missing_file(exc):
                    raise
                log.info("audit verify read a file pruned meanwhile; reading again: %s", exc)
                attempt += 1

    def _verify(self, *, expect_head: str | tuple[int, str] | None = None, checkpoint: bool = True) -> ChainReport:
        """Recompute every hash and link of every chain, streaming the log (memory grows with the
        number of chains, not receipts); report each receipt that is edited, missing, extra or out
        of place. A tail cut off the end is visible only against a checkpoint taken before: the
        latest in the log, and ``expect_head``, the root of one recorded elsewhere (or, for a log
        from before per-writer chains, the SEQ:HASH head its verify printed). When all is intact and
        ``checkpoint`` is set, the report carries a new checkpoint of exactly the heads verified."""
        problems: list[str] = []
        key_problem = self._key_problem()
        if key_problem:
            problems.append(f"table: {key_problem}")
        if not self._table.schema_intact():
            problems.append("table: the audit table's schema was changed")
            return ChainReport(ok=False, receipts=self._table.count(), problems=tuple(problems))
        problems.extend(self._table.journal_problems())

        sealed = self._sealed_heads(problems)  # per chain, the last receipt archived
        anchors = self._anchors(expect_head, problems)
        wanted = {(chain, seq): (digest, name) for name, heads in anchors for chain, seq, digest in heads
                  if seq > sealed.get(chain, (0, ""))[0]}  # fmt: skip
        chains = ChainPass(self._keys, sealed)
        tallies = chains.tallies
        receipts = 0
        for rows in self._table.batches():
            for row in rows:
                receipts += 1
                chain, seq = row["chain"] or LEGACY_CHAIN, row["seq"]
                if seq <= chains.start(chain)[0]:
                    continue  # archived under a seal; its removal was cut short
                chains.add(row, problems)
                expected = wanted.pop((chain, seq), None)
                if expected is not None and expected[0] != row["hash"]:
                    problems.append(f"{place(chain, seq)}: its hash is not the one {expected[1]} recorded (the chain was rewritten)")
        for chain in sorted(chain for chain, tally in tallies.items() if not tally.intact()):
            problems.extend(broken_links(chain, self._table.links(chain or None), chains.start(chain)))
        retired = chains.retired_heads()
        if retired and self._keys.seal is not None:
            problems.extend(self._keys.sealed_problems(retired, [checkpoint_of(row) for row in self._table.checkpoints()]))
        for (chain, seq), (_, name) in sorted(wanted.items()):
            end = tallies[chain].head[0] if chain in tallies else 0
            problems.append(f"{place(chain, seq)}: the head {name} recorded is gone (the chain ends at seq {end}; "
                            "receipts were dropped from the end)")  # fmt: skip
        taken = None
        if not problems and checkpoint:
            try:
                taken = self._store_checkpoint({chain: tally.head for chain, tally in tallies.items()})
            except Exception as exc:  # the verdict stands; only the record of it is missing
                log.warning("audit verify could not store its checkpoint: %s", exc)
        return ChainReport(ok=not problems, receipts=receipts, problems=tuple(problems), chains=len(tallies),
                           checkpoint=taken)  # fmt: skip

    def _sealed_heads(self, problems: list[str]) -> dict[str, tuple[int, str]]:
        """Per chain, the last receipt the latest retention seal archived (none: nothing was); a
        seal that no longer matches its heads, under any key of the ring, is a problem."""
        seals = [checkpoint_of(row) for row in self._table.seals()]
        for seal in seals:
            if not self._keys.intact(seal):
                problems.append(f"retention seal {seal.root[:16]}: does not match its heads (the seal was edited)")
        return {chain: (seq, digest) for chain, seq, digest in seals[-1].heads} if seals else {}

    def archive(self, before: datetime, write: Callable[[str, bytes], None]) -> ArchiveReport:
        """Seal the receipts written before ``before`` and move them out of the log: verify the
        whole log first (refused unless intact), hand the range to ``write`` (``receipts.parquet``:
        the rows as stored; ``seal.json``: the seal, and the one before it), record the seal, then
        remove the range. The seal binds each chain's last archived receipt, so verify goes on
        from it, and the archive verifies alone against it (``verify_archive``)."""
        if before > datetime.now(timezone.utc) - CHECKPOINT_SLACK:
            raise InvalidRequestError(f"archive before {before.isoformat()}: choose a time at least "
                                      f"{CHECKPOINT_SLACK} ago (receipts still arriving may carry it)")  # fmt: skip
        self.fold()
        report = self.verify(checkpoint=False)
        if not report.ok:
            raise WarehouseError(f"the audit log does not verify ({len(report.problems)} problems, first: "
                                 f"{report.problems[0]}); nothing was archived")  # fmt: skip
        previous: dict[str, tuple[int, str]] = self._sealed_heads([])
        heads = self._table.heads(f"time < {sql_timestamp(before, 'before')}")
        cut = {chain or LEGACY_CHAIN: head for chain, head in heads.items()
               if head[0] > previous.get(chain or LEGACY_CHAIN, (0, ""))[0]}  # fmt: skip
        if not cut:
            raise NotFoundError(f"no receipt written before {before.isoformat()} is left to archive")
        rows = self._table.archive_rows({chain: (previous.get(chain, (0, ""))[0], seq) for chain, (seq, _) in cut.items()})
        seal = self._hasher.checkpoint(previous | cut, datetime.now(timezone.utc))
        sink = io.BytesIO()
        pq.write_table(rows, sink)
        write("receipts.parquet", sink.getvalue())
        write("seal.json", canonical_json({"seal": checkpoint_row(seal) | {"time": seal.time.isoformat()},
                                           "previous": sorted([chain, *head] for chain, head in previous.items())}).encode())  # fmt: skip
        self._table.seal_and_remove(checkpoint_row(seal), {chain: seq for chain, (seq, _) in cut.items()})
        return ArchiveReport(seal=seal, receipts=rows.num_rows, chains=len(cut))

    def verify_archive(self, read: Callable[[str], bytes]) -> ChainReport:
        """Whether an archive ``archive`` wrote is whole: every receipt's hash under the ring, each
        chain linked from the seal before it to the head its seal binds, and the seal is this
        log's (it is among the log's seals, intact)."""
        written = json.loads(read("seal.json"))
        seal = checkpoint_of({**written["seal"], "time": datetime.fromisoformat(written["seal"]["time"])})
        previous = {chain: (int(seq), digest) for chain, seq, digest in written["previous"]}
        problems = [] if self._keys.intact(seal) else [f"seal {seal.root[:16]}: does not match its heads"]
        if seal.root not in {row["root"] for row in self._table.seals()}:
            problems.append(f"seal {seal.root[:16]}: not among this log's seals")
        chains = ChainPass(self._keys, previous)
        rows = pq.read_table(io.BytesIO(read("receipts.parquet"))).to_pylist()
        for row in rows:
            chains.add(row, problems)
        tallies = chains.tallies
        bound = {chain: (seq, digest) for chain, seq, digest in seal.heads}
        for chain in sorted(set(bound) | set(tallies)):
            tally = tallies.get(chain)
            if tally is None:
                if bound[chain] != previous.get(chain):
                    problems.append(f"chain {chain}: the seal binds seq {bound[chain][0]} but the archive holds none of it")
            elif not tally.intact() or tally.head != bound.get(chain):
                problems.append(f"chain {chain}: the archived receipts do not link up to the head the seal binds")
        return ChainReport(ok=not problems, receipts=len(rows), problems=tuple(problems), chains=len(tallies))

    def _anchors(
        self, expect_head: str | tuple[int, str] | None, problems: list[str]
    ) -> list[tuple[str, tuple[ChainHead, ...]]]:
        """The heads the log must still hold: the latest checkpoint's and the expected one's, each
        named for its problems; a checkpoint that is itself changed, or missing, is a problem."""
        stored = self._table.checkpoints()
        anchors: list[tuple[str, tuple[ChainHead, ...]]] = []
        chosen: list[Mapping[str, Any]] = stored[-1:]
        if isinstance(expect_head, tuple):
            seq, digest = expect_head
            anchors.append(("the expected head", ((LEGACY_CHAIN, seq, digest),)))
        elif expect_head is not None:
            if not isinstance(expect_head, str) or not HEX64.fullmatch(expect_head):
                raise InvalidRequestError(f"expect_head {expect_head!r} is not a checkpoint root (64 lowercase hex digits)")
            matching = [row for row in stored if row["root"] == expect_head]
            if not matching:
                problems.append(f"checkpoint {expect_head}: not in the log (the log's checkpoints were removed, "
                                "or the root is not of this log)")  # fmt: skip
            chosen = [*matching[-1:], *(row for row in chosen if row["root"] != expect_head)]
        for row in chosen:
            found = checkpoint_of(row)
            name = f"checkpoint {found.root[:16]}"
            if not self._keys.intact(found):
                problems.append(f"{name}: does not match its heads (the checkpoint was edited)")
            anchors.append((name, found.heads))
        return anchors

    # -- querying -------------------------------------------------------------------------

    def query(self, **filters: Any) -> list[StoredReceipt]:
        """Receipts matching every given filter, newest first (the filters and ``limit`` of
        ``page``, which also gives their number)."""
        return self.page(**filters)[1]

    def page(
        self,
        *,
        chunk_id: str | None = None,
        doc_id: str | None = None,
        any_chunk_ids: Iterable[str] | None = None,
        subject: str | None = None,
        label: str | None = None,
        tenant: str | None = None,
        operation: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
        allowed: bool | None = None,
        offset: int = 0,
    ) -> tuple[int, list[StoredReceipt]]:
        """How many receipts match every given filter, and ``limit`` of them, newest first, after
        the newest ``offset``: a page, with the total a pager shows.

        ``since`` is inclusive and ``until`` exclusive; both need a timezone. ``any_chunk_ids``
        matches receipts naming any of those rows (none: no receipt); ``allowed`` keeps the allowed
        (True) or the refused (False). Every value reaches SQL as a quoted literal.
        """
        clauses: list[str] = []
        if allowed is not None:
            if not isinstance(allowed, bool):
                raise InvalidRequestError(f"audit query allowed must be true or false, got {allowed!r}")
            clauses.append(f"allowed = {'true' if allowed else 'false'}")
        non_negative(offset, "offset")
        if any_chunk_ids is not None:
            wanted = sorted({c for c in any_chunk_ids if "\x00" not in c})
            if not wanted:
                return 0, []
            clauses.append(f"array_has_any(chunk_ids, {sql_list(wanted)})")
        try:
            for column, value in (("chunk_ids", chunk_id), ("doc_ids", doc_id), ("labels", label)):
                if value is not None:
                    clauses.append(f"array_has_any({column}, {sql_list([value])})")
            for column, value in (("subject", subject), ("tenant", tenant), ("operation", operation)):
                if value is not None:
                    clauses.append(f"{column} = {sql_string(value)}")
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"audit query filter refused: {exc}") from None
        if since is not None:
            clauses.append(f"time >= {sql_timestamp(since, 'since')}")
        if until is not None:
            clauses.append(f"time < {sql_timestamp(until, 'until')}")
        if limit is not None:
            non_negative(limit, "limit")

        total, shown = self._table.page(" AND ".join(f"({clause})" for clause in clauses) or None, offset=offset, limit=limit)
        return total, [stored_receipt(row) for row in shown]
