"""Audit receipts: append-only, hash-chained logs of every retrieval and policy decision.

Each receipt is one row of the warehouse's ``audit`` table (``state.AuditTable`` stores them;
this module computes the chains). Every writer process appends to a chain of its own, named by a
random ``chain`` id: a sequence number ``seq`` (1, 2, 3, ...), the hash of the receipt before it
in that chain (``prev_hash``; 64 zeros for the first) and its own ``hash``: sha256 -- or
HMAC-sha256 when the log is given a key -- over a canonical JSON of every other field of the
receipt, the chain id included (``_CHAINED``). Receipts keep ids, labels, counts and hashes; never
chunk text, and the raw query only when the caller passes it. Receipts written before per-writer
chains form one legacy chain (no chain id, hashed without it) and keep verifying.

Writers never read each other's rows: within a process one appender commits the receipts of
concurrent callers together (``appender.GroupCommit``), each caller returning once its receipt is
durable, and processes append side by side without a race for a shared head. A group commit is
one record of the writer's segment of the receipts' journal locally, one file on object storage
(``state.audit_journal``); a thread of the writer folds what it journaled into the table every
``FOLD_AFTER_S`` (or ``FOLD_ROWS``), and at exit. A writer that cannot tell whether a commit
landed starts a new chain rather than risk a fork.

Checkpoints bind every chain's head at one moment into one hash, a Merkle tree root over the
heads (as RFC 6962 logs sign tree heads). Writers take one every ``checkpoint_every`` receipts,
``verify`` takes one of exactly what it verified, and ``checkpoint()`` takes one on demand.

What the chains prove, and what they do not:

- an edited, deleted, inserted or renumbered receipt, and a first receipt whose ``prev_hash`` is
  not the genesis value, are found by ``verify``;
- with plain sha256, anyone able to rewrite the table can also recompute every hash, so the
  chains then only show accidental damage; with an HMAC key (kept away from the table's
  storage) a rewrite cannot produce valid hashes;
- removing receipts *from the end* of a chain leaves a shorter chain that is still valid: only a
  checkpoint taken before shows the tail existed. ``verify`` checks the latest checkpoint in the
  log; record a checkpoint's root somewhere else (a ticket, a log shipper, another store) and pass
  it back as ``expect_head``, so that a checkpoint removed along with the tail is noticed too.

Each table commit lands as a small data file, so a writer merges them every ``compact_every`` of its
receipts and, at most every ``PRUNE_EVERY_S``, drops old versions (``state.audit_table.VERSIONS_KEPT``);
both run beside the appends, which they commute with. The warehouse's ``optimize`` does the same.
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any, Protocol

from ..errors import ConfigurationError, InvalidRequestError, WarehouseError
from .appender import GroupCommit
from .merkle import merkle_root
from .operations import ALL_OPERATIONS
from .sql import sql_list, sql_string

log = logging.getLogger(__name__)

__all__ = [
    "GENESIS_HASH",
    "KINDS",
    "AuditLog",
    "ChainReport",
    "Checkpoint",
    "Receipt",
    "ReceiptTable",
    "StoredReceipt",
    "fingerprint",
]

GENESIS_HASH = "0" * 64
KINDS = frozenset({"retrieval", "decision"})
OPERATIONS = ALL_OPERATIONS

_HASH_DOMAIN = b"ragwarden.audit.v1\n"  # the legacy chain, written before per-writer chains
_HASH_DOMAIN_CHAINED = b"ragwarden.audit.v2\n"
_CHECKPOINT_DOMAIN = b"ragwarden.audit.checkpoint.v1\n"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MAX_INT32 = 2**31 - 1
COMPACT_EVERY = 1000
CHECKPOINT_EVERY = 1000
FOLD_ROWS = 1000
"""A writer folds its journal into the table once this many of its receipts wait there..."""
FOLD_AFTER_S = 1.0
"""...or once the oldest has waited this long: one table commit a second for a busy writer."""
ORPHAN_SWEEP_S = 60.0
"""How often a writer's fold also takes the journal files that writers which stopped left."""
PRUNE_EVERY_S = 10.0
"""How often a writer's compactions also drop old versions: pruning reads every version's manifest."""
CHECKPOINT_SLACK = timedelta(minutes=10)
"""How far before the latest checkpoint a new one looks for receipts (clocks of writers differ)."""
LEGACY_CHAIN = ""
"""The chain id of receipts written before per-writer chains (stored as null)."""


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


def fingerprint(query: str) -> str:
    """The sha256 hex of a query: lets receipts be matched by query without keeping its text."""
    if not isinstance(query, str):
        raise InvalidRequestError(f"a query fingerprint needs a str, got {type(query).__name__}")
    return hashlib.sha256(query.encode("utf-8", "surrogatepass")).hexdigest()


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _canonical_json(value: Any) -> str:
    """One spelling per value (sorted keys, no spaces), so a hash over it is reproducible."""
    return _CANONICAL.encode(value)


def _check_text(value: object, what: str, *, optional: bool = False, empty: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise InvalidRequestError(f"receipt {what} must be a str, got {type(value).__name__}")
    if not value and not empty:
        raise InvalidRequestError(f"receipt {what} is empty")
    if "\x00" in value:
        raise InvalidRequestError(f"receipt {what} holds a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(f"receipt {what} is not valid Unicode text: {exc}") from None


def _text_tuple(values: object, what: str) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise InvalidRequestError(f"receipt {what} must be a sequence of str, got {type(values).__name__}")
    items = tuple(values)
    for item in items:
        _check_text(item, f"{what} entry")
    return items


def _non_negative(value: object, what: str) -> None:
    """Refuse an audit query's ``offset`` or ``limit`` that is not a non-negative int."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRequestError(f"audit query {what} must be a non-negative int, got {value!r}")


def _check_int(value: object, what: str, *, high: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
        raise InvalidRequestError(f"receipt {what} must be an int from 0 to {high}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Receipt:
    """What a caller records about one retrieval or one policy decision (never chunk text).

    ``withheld`` counts candidates the filter hid from the caller: kept here, never shown to them.
    ``query`` is the raw query, passed only where configured; its fingerprint is derived from it
    when not given. ``details`` holds small JSON-able facts (e.g. a forget's doc id and row count).
    """

    kind: str
    operation: str
    subject: str
    tenant: str
    allowed: bool
    reason: str
    actor: str | None = None
    purpose: str | None = None
    query_fingerprint: str | None = None
    query: str | None = None
    chunk_ids: tuple[str, ...] = ()
    doc_ids: tuple[str, ...] = ()
    chunk_labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    withheld: int = 0
    policy_version: str | None = None
    table_version: int | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequestError(f"receipt kind {self.kind!r} is not one of {sorted(KINDS)}")
        if self.operation not in OPERATIONS:
            raise InvalidRequestError(f"receipt operation {self.operation!r} is not one of {sorted(OPERATIONS)}")
        _check_text(self.subject, "subject")
        _check_text(self.tenant, "tenant")
        _check_text(self.reason, "reason", empty=True)
        for name in ("actor", "purpose", "query", "policy_version"):
            _check_text(getattr(self, name), name, optional=True)
        if not isinstance(self.allowed, bool):
            raise InvalidRequestError(f"receipt allowed must be a bool, got {self.allowed!r}")
        _check_int(self.withheld, "withheld", high=_MAX_INT32)
        _check_int(self.table_version, "table_version", high=2**63 - 1, optional=True)

        digest = self.query_fingerprint
        if digest is not None and (not isinstance(digest, str) or not _HEX64.fullmatch(digest)):
            raise InvalidRequestError(f"receipt query_fingerprint {digest!r} is not a lowercase sha256 hex digest")
        if self.query is not None:
            if digest is None:
                object.__setattr__(self, "query_fingerprint", fingerprint(self.query))
            elif digest != fingerprint(self.query):
                raise InvalidRequestError("receipt query_fingerprint is not the sha256 of its query")

        object.__setattr__(self, "chunk_ids", _text_tuple(self.chunk_ids, "chunk_ids"))
        object.__setattr__(self, "doc_ids", _text_tuple(self.doc_ids, "doc_ids"))
        if not isinstance(self.chunk_labels, Mapping):
            raise InvalidRequestError("receipt chunk_labels must map chunk ids to their labels")
        labels: dict[str, tuple[str, ...]] = {}
        for chunk_id, chunk_labels in self.chunk_labels.items():
            _check_text(chunk_id, "chunk_labels key")
            labels[chunk_id] = tuple(sorted(set(_text_tuple(chunk_labels, f"labels of chunk {chunk_id!r}"))))
        object.__setattr__(self, "chunk_labels", MappingProxyType(labels))
        if not isinstance(self.details, Mapping):
            raise InvalidRequestError("receipt details must be a mapping of JSON-able values")
        try:
            details = json.loads(_canonical_json(dict(self.details)))
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"receipt details are not JSON-able: {exc}") from None
        object.__setattr__(self, "details", MappingProxyType(details))


@dataclass(frozen=True, kw_only=True)
class StoredReceipt(Receipt):
    """A receipt as the log holds it: its chain (``LEGACY_CHAIN`` for receipts from before
    per-writer chains), its place in it, its time and its hashes."""

    chain: str
    seq: int
    receipt_id: str
    time: datetime
    prev_hash: str
    hash: str

    @classmethod
    def _placed(cls, receipt: Receipt, placed: Mapping[str, Any]) -> StoredReceipt:
        """``receipt`` with what the log added (``_PLACED``), its fields not checked again: they
        were checked when it was made, and a search's receipt is made once per answer."""
        stored = object.__new__(cls)
        for name in _RECEIPT_FIELDS:
            object.__setattr__(stored, name, getattr(receipt, name))
        for name in _PLACED:
            object.__setattr__(stored, name, placed[name])
        return stored


ChainHead = tuple[str, int, str]
"""(chain, seq, hash) of a chain's last receipt."""


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """Every chain's head at one moment, bound into one Merkle ``root`` (``merkle.merkle_root``).

    Keep the root elsewhere and pass it back to ``verify(expect_head=root)``: each head it binds
    must still be in the log, unchanged. ``hash`` (sha256, or HMAC with the log's key) covers the
    rest, so an edited checkpoint is caught too.
    """

    root: str
    time: datetime
    receipts: int
    heads: tuple[ChainHead, ...]
    hash: str


@dataclass(frozen=True, kw_only=True)
class ChainReport:
    """What ``verify`` found: ``ok`` when every receipt of every chain is intact and in place.

    Each problem names the chain and ``seq`` it concerns and what is wrong with it. ``checkpoint``
    binds exactly the heads verified (taken only when ``ok``).
    """

    ok: bool
    receipts: int
    problems: tuple[str, ...]
    chains: int = 0
    checkpoint: Checkpoint | None = None


_RECEIPT_FIELDS = tuple(f.name for f in fields(Receipt))


def _columns_of(receipt: Receipt) -> dict[str, Any]:
    """The table columns a receipt fills (all but seq, receipt_id, time and the hashes)."""
    row = {name: getattr(receipt, name) for name in _RECEIPT_FIELDS}
    row["chunk_ids"] = list(receipt.chunk_ids)
    row["doc_ids"] = list(receipt.doc_ids)
    row["labels"] = sorted({label for labels in receipt.chunk_labels.values() for label in labels})
    row["chunk_labels"] = _canonical_json({k: list(v) for k, v in receipt.chunk_labels.items()})
    row["details"] = _canonical_json(dict(receipt.details))
    return row


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


_HASH_PIECE = 2000
"""hashlib gives up the interpreter lock for an update of 2,048 bytes or more; a group commit,
which every search in it waits for, hashes in shorter pieces (the digest is the same)."""

_PLACED = ("chain", "seq", "receipt_id", "time", "prev_hash", "hash")
"""What the log adds to a receipt when it stores it (``StoredReceipt``)."""

_LEGACY_CHAINED = (*_RECEIPT_FIELDS, "labels", "seq", "receipt_id", "time", "prev_hash")
_CHAINED = (*_LEGACY_CHAINED, "chain")
"""What a receipt's hash covers: every field of the receipt as stored, but the hash itself (a
legacy receipt's: all of those but the chain it does not have)."""


def _payload_parts(row: Mapping[str, Any], names: Sequence[str]) -> dict[str, bytes]:
    """Each of ``names`` as it appears in a hash payload: ``"name":value`` in canonical JSON, UTF-8
    (a tuple as a list, ``time`` as integer microseconds, UTC). UnicodeEncodeError for a value that
    is not text (a lone surrogate)."""
    parts = {}
    for name in names:
        value = row[name]
        if name == "time":
            value = _micros(value)
        elif isinstance(value, tuple):
            value = list(value)
        parts[name] = f"{_canonical_json(name)}:{_canonical_json(value)}".encode("utf-8")
    return parts


def _joined_payload(parts: Mapping[str, bytes], *, legacy: bool) -> bytes:
    """The canonical JSON object of ``parts`` (keys sorted, as ``_canonical_json`` spells a dict),
    after the hash domain."""
    body = b",".join(parts[name] for name in sorted(parts))
    return (_HASH_DOMAIN if legacy else _HASH_DOMAIN_CHAINED) + b"{" + body + b"}"


def _hash_payload(row: Mapping[str, Any]) -> bytes:
    """Canonical bytes of the ``_CHAINED`` fields; ``time`` as integer microseconds (UTC)."""
    legacy = not row.get("chain")
    return _joined_payload(_payload_parts(row, _LEGACY_CHAINED if legacy else _CHAINED), legacy=legacy)


_UNPLACED = tuple(name for name in _CHAINED if name not in _PLACED)
"""What of a receipt's hash payload is known before the log places it (all but its chain, seq,
id, time and previous hash)."""


@dataclass(frozen=True, kw_only=True)
class _Prepared:
    """A receipt readied for the log on its caller's thread: its table columns and its part of the
    hash payload, so the commit (one at a time) only places and chains it."""

    receipt: Receipt
    columns: dict[str, Any]
    parts: dict[str, bytes]
    receipt_id: str  # drawn here: drawing it reads the system's randomness, which gives up the lock

    @classmethod
    def of(cls, receipt: Receipt) -> _Prepared:
        """Refuses, on the caller's own thread, a receipt whose payload is not UTF-8 text (a lone
        surrogate in ``details``), so it fails alone rather than the batch committed with it."""
        columns = _columns_of(receipt)
        try:
            parts = _payload_parts(columns, _UNPLACED)
        except UnicodeEncodeError as exc:
            raise InvalidRequestError(
                f"receipt is not valid Unicode text ({exc.reason} at {exc.start}); it was not recorded"
            ) from None
        return cls(receipt=receipt, columns=columns, parts=parts, receipt_id=str(uuid.uuid4()))


def _checkpoint_payload(root: str, moment: datetime, receipts: int, heads: Sequence[ChainHead]) -> bytes:
    body = {"root": root, "time": _micros(moment), "receipts": receipts, "heads": [list(head) for head in heads]}
    return _CHECKPOINT_DOMAIN + _canonical_json(body).encode("utf-8")


def _place(chain: str, seq: int | str) -> str:
    """How a problem names a receipt: ``seq N`` in the legacy chain, ``chain C seq N`` elsewhere."""
    return f"seq {seq}" if chain == LEGACY_CHAIN else f"chain {chain} seq {seq}"


def _link_digest(seq: int, digest: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seq}:{digest}".encode("utf-8", "surrogatepass")).digest(), "big")


@dataclass(kw_only=True)
class _ChainTally:
    """What one streamed pass keeps of a chain, whatever its length: enough to tell whether its
    links are complete (the receipts' (seq, hash) pairs and their (seq - 1, prev_hash) claims are
    equal multisets, summed as hashes) and where it ends."""

    count: int = 0
    low: int = 0
    head: tuple[int, str] = (0, GENESIS_HASH)
    have: int = 0
    want: int = 0
    genesis_ok: bool = True

    def add(self, seq: int, digest: str, prev: str) -> None:
        self.count += 1
        self.low = seq if self.count == 1 else min(self.low, seq)
        if seq > self.head[0]:
            self.head = (seq, digest)
        self.have += _link_digest(seq, digest)
        if seq == 1:
            self.genesis_ok = self.genesis_ok and prev == GENESIS_HASH
        else:
            self.want += _link_digest(seq - 1, prev)

    def intact(self) -> bool:
        return (
            self.genesis_ok and self.low == 1 and self.count == self.head[0]
            and self.have - _link_digest(*self.head) == self.want
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class _Writer:
    """This process's own chain: where its next receipt goes."""

    pid: int
    chain: str
    seq: int = 0
    hash: str = GENESIS_HASH


def _timestamp_literal(moment: object, what: str) -> str:
    """An SQL timestamp literal for a timezone-aware datetime (built here, never from caller text)."""
    if not isinstance(moment, datetime):
        raise InvalidRequestError(f"{what} must be a datetime, got {type(moment).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidRequestError(f"{what} {moment.isoformat()} has no timezone; pass an aware datetime")
    try:
        utc = moment.astimezone(timezone.utc)
    except OverflowError:
        raise InvalidRequestError(f"{what} {moment.isoformat()} is out of range in UTC") from None
    # the year zero-padded: strftime writes year 86 as "86", which the SQL parser refuses
    return f"TIMESTAMP '{utc.year:04d}-{utc.strftime('%m-%dT%H:%M:%S.%f')}Z'"


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
    """At exit, fold what waits, so a process that stops normally leaves no journal behind."""
    audit = ref()
    if audit is not None and audit._folder_pid == os.getpid() and audit._table.pending()[0]:
        try:
            audit._table.fold(orphaned_after=None)
        except Exception as exc:
            log.warning("folding the audit journal at exit failed (another writer will fold it): %s", exc)


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
        compact_every: int | None = COMPACT_EVERY,
        checkpoint_every: int | None = CHECKPOINT_EVERY,
    ) -> None:
        """``table_for(key_check)`` opens the receipts' table, recording ``key_check`` (a check
        value of ``key``) if it creates it (``state.Store.audit_table``). A writer merges the
        table's small files every ``compact_every`` of its receipts and takes a checkpoint every
        ``checkpoint_every`` (None: never)."""
        if key is not None and (not isinstance(key, bytes) or not key):
            raise ConfigurationError("the audit HMAC key must be non-empty bytes")
        for name, every in (("compact_every", compact_every), ("checkpoint_every", checkpoint_every)):
            if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
                raise ConfigurationError(f"{name} must be a positive int or None, got {every!r}")
        self._compact_every = compact_every
        self._checkpoint_every = checkpoint_every
        self._key = key
        self._key_check = (
            hmac.new(key, b"ragwarden audit key check", hashlib.sha256).hexdigest() if key is not None else "none"
        )
        self._table = table_for(self._key_check)
        self._key_problem_at_open = self._key_problem()  # the key check never changes legitimately
        self._writer: _Writer | None = None
        self._written = 0  # receipts this process committed (for its maintenance rhythm)
        self._maintaining = threading.Lock()
        self._pruned_at = float("-inf")
        self._appender: GroupCommit[_Prepared, dict[str, Any]] = GroupCommit(self._commit, name="audit-appender")
        self._fold_wake = threading.Event()
        self._folder_pid: int | None = None
        self._folder_running = False
        self._folder_lock = threading.Lock()
        self._swept_at = float("-inf")

    def _key_problem(self) -> str | None:
        recorded = self._table.recorded_key_check()
        if recorded is None or recorded == self._key_check:
            return None
        if recorded == "none":
            return "the audit log was created without an HMAC key, but this one was given a key"
        if self._key is None:
            return "the audit log was created with an HMAC key, but this one was given none"
        return "the audit log was created with a different HMAC key than the one given"

    # -- hashing --------------------------------------------------------------------------

    def _digest(self, payload: bytes) -> str:
        digest = hashlib.sha256() if self._key is None else hmac.new(self._key, digestmod=hashlib.sha256)
        for start in range(0, len(payload), _HASH_PIECE):  # pieces short enough to keep the lock
            digest.update(payload[start : start + _HASH_PIECE])
        return digest.hexdigest()

    def _hash(self, row: Mapping[str, Any]) -> str:
        return self._digest(_hash_payload(row))

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
        threading.Thread(target=_fold_while_waiting, args=(weakref.ref(self),), name="audit-folder", daemon=True).start()

    def _fold_when_due(self) -> bool:
        """Fold if ``FOLD_ROWS`` receipts wait or the oldest has waited ``FOLD_AFTER_S`` (sweeping
        stopped writers' files every ``ORPHAN_SWEEP_S``); False once nothing waits (the thread
        is then marked stopped)."""
        with self._folder_lock:  # a receipt journaled after this sees the thread gone, and starts one
            rows, waited = self._table.pending()
            if not rows:
                self._folder_running = False
                return False
        if rows >= FOLD_ROWS or waited >= FOLD_AFTER_S:
            sweep = time.monotonic() - self._swept_at >= ORPHAN_SWEEP_S
            try:
                if sweep:
                    self.fold()
                else:
                    self._table.fold(orphaned_after=None)
            except Exception as exc:  # the receipts are durable in the journal; the next pass retries
                log.warning("folding the audit journal failed (it will be tried again): %s", exc)
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
        latest = self._checkpoint_of(stored[-1]) if stored else None
        if latest is not None and self._intact(latest):
            heads = {chain: (seq, digest) for chain, seq, digest in latest.heads}
            where = f"time >= {_timestamp_literal(latest.time - CHECKPOINT_SLACK, 'since')}"
        for chain, (seq, digest) in self._table.heads(where).items():
            key = chain or LEGACY_CHAIN
            if key not in heads or seq > heads[key][0]:
                heads[key] = (seq, digest)
        return self._store_checkpoint(heads)

    def _store_checkpoint(self, heads: Mapping[str, tuple[int, str]]) -> Checkpoint:
        listed = tuple(sorted((chain, seq, digest) for chain, (seq, digest) in heads.items()))
        root = merkle_root(listed)
        moment = datetime.now(timezone.utc)
        receipts = sum(seq for _, seq, _ in listed)
        digest = self._digest(_checkpoint_payload(root, moment, receipts, listed))
        stored = _canonical_json([list(head) for head in listed])
        self._table.add_checkpoint({"root": root, "time": moment, "receipts": receipts, "heads": stored, "hash": digest})
        return Checkpoint(root=root, time=moment, receipts=receipts, heads=listed, hash=digest)

    def _intact(self, checkpoint: Checkpoint) -> bool:
        """Whether a checkpoint's root and hash still match its heads."""
        payload = _checkpoint_payload(checkpoint.root, checkpoint.time, checkpoint.receipts, checkpoint.heads)
        return merkle_root(checkpoint.heads) == checkpoint.root and self._digest(payload) == checkpoint.hash

    def checkpoints(self) -> list[Checkpoint]:
        """Every stored checkpoint, oldest first."""
        return [self._checkpoint_of(row) for row in self._table.checkpoints()]

    @staticmethod
    def _checkpoint_of(row: Mapping[str, Any]) -> Checkpoint:
        try:
            heads = tuple((str(chain), int(seq), str(digest)) for chain, seq, digest in json.loads(row["heads"]))
        except (TypeError, ValueError) as exc:
            heads = ()
            log.warning("audit checkpoint %s has malformed heads: %s", row.get("root"), exc)
        return Checkpoint(root=row["root"], time=row["time"].astimezone(timezone.utc), receipts=row["receipts"],
                          heads=heads, hash=row["hash"])  # fmt: skip

    # -- appending ------------------------------------------------------------------------

    def append(self, receipt: Receipt) -> StoredReceipt:
        """Add ``receipt`` at the end of this process's chain and return it as stored, once durable.

        The process's receipts are committed by one appender, in batches (``appender``).
        """
        if not isinstance(receipt, Receipt):
            raise InvalidRequestError(f"append needs a Receipt, got {type(receipt).__name__}")
        if self._key_problem_at_open:
            raise ConfigurationError(f"{self._key_problem_at_open}; open it with the key it was created with")
        return StoredReceipt._placed(receipt, self._appender.submit(_Prepared.of(receipt)))

    def _commit(self, prepared: Sequence[_Prepared]) -> list[dict[str, Any]]:
        """Chain ``prepared`` receipts onto this process's chain (a new one in a new process) and
        commit them at once; returns what the log added to each (``_PLACED``). Commits run one at
        a time and every search waits for one, so what can be done before (a receipt's columns and
        most of its hash payload) is done on the caller's thread (``_Prepared``)."""
        writer = self._writer
        if writer is None or writer.pid != os.getpid():
            writer = _Writer(pid=os.getpid(), chain=secrets.token_hex(8))
        rows: list[dict[str, Any]] = []
        prev_hash = writer.hash
        for offset, item in enumerate(prepared, start=1):
            placed = {"chain": writer.chain, "seq": writer.seq + offset, "receipt_id": item.receipt_id,
                      "time": datetime.now(timezone.utc), "prev_hash": prev_hash}  # fmt: skip
            payload = _joined_payload({**item.parts, **_payload_parts(placed, tuple(placed))}, legacy=False)
            prev_hash = placed["hash"] = self._digest(payload)
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
        return [{name: row[name] for name in _PLACED} for row in rows]

    # -- verifying ------------------------------------------------------------------------

    def verify(self, *, expect_head: str | tuple[int, str] | None = None, checkpoint: bool = True) -> ChainReport:
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

        anchors = self._anchors(expect_head, problems)
        wanted = {(chain, seq): (digest, name) for name, heads in anchors for chain, seq, digest in heads}
        tallies: dict[str, _ChainTally] = {}
        receipts = 0
        for rows in self._table.batches():
            for row in rows:
                receipts += 1
                chain, seq = row["chain"] or LEGACY_CHAIN, row["seq"]
                try:
                    computed = self._hash(row)
                except (TypeError, ValueError, KeyError) as exc:
                    computed = f"<cannot hash: {exc}>"
                if computed != row["hash"]:
                    problems.append(f"{_place(chain, seq)}: hash does not match the receipt's content (edited or forged)")
                tallies.setdefault(chain, _ChainTally()).add(seq, row["hash"], row["prev_hash"])
                expected = wanted.pop((chain, seq), None)
                if expected is not None and expected[0] != row["hash"]:
                    problems.append(f"{_place(chain, seq)}: its hash is not the one {expected[1]} recorded (the chain was rewritten)")
        for chain in sorted(chain for chain, tally in tallies.items() if not tally.intact()):
            problems.extend(self._broken_links(chain))
        for (chain, seq), (_, name) in sorted(wanted.items()):
            end = tallies[chain].head[0] if chain in tallies else 0
            problems.append(f"{_place(chain, seq)}: the head {name} recorded is gone (the chain ends at seq {end}; "
                            "receipts were dropped from the end)")  # fmt: skip
        taken = None
        if not problems and checkpoint:
            try:
                taken = self._store_checkpoint({chain: tally.head for chain, tally in tallies.items()})
            except Exception as exc:  # the verdict stands; only the record of it is missing
                log.warning("audit verify could not store its checkpoint: %s", exc)
        return ChainReport(ok=not problems, receipts=receipts, problems=tuple(problems), chains=len(tallies),
                           checkpoint=taken)  # fmt: skip

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
            if not isinstance(expect_head, str) or not _HEX64.fullmatch(expect_head):
                raise InvalidRequestError(f"expect_head {expect_head!r} is not a checkpoint root (64 lowercase hex digits)")
            matching = [row for row in stored if row["root"] == expect_head]
            if not matching:
                problems.append(f"checkpoint {expect_head}: not in the log (the log's checkpoints were removed, "
                                "or the root is not of this log)")  # fmt: skip
            chosen = [*matching[-1:], *(row for row in chosen if row["root"] != expect_head)]
        for row in chosen:
            found = self._checkpoint_of(row)
            name = f"checkpoint {found.root[:16]}"
            if not self._intact(found):
                problems.append(f"{name}: does not match its heads (the checkpoint was edited)")
            anchors.append((name, found.heads))
        return anchors

    def _broken_links(self, chain: str) -> list[str]:
        """What exactly is wrong with the links of a chain the streamed pass found broken."""
        problems: list[str] = []
        expected_seq, expected_prev, prev_seq = 1, GENESIS_HASH, None
        for row in self._table.links(chain or None):
            seq = row["seq"]
            if seq < expected_seq:
                problems.append(f"{_place(chain, seq)}: appears more than once (a receipt was inserted or renumbered)")
            elif seq > expected_seq:
                missing = f"{expected_seq}" if seq == expected_seq + 1 else f"{expected_seq}..{seq - 1}"
                problems.append(f"{_place(chain, missing)}: missing (deleted or renumbered)")
            if row["prev_hash"] != expected_prev:
                if prev_seq is None:
                    problems.append(f"{_place(chain, seq)}: first receipt's prev_hash is not the genesis value (64 zeros)")
                else:
                    problems.append(f"{_place(chain, seq)}: prev_hash is not the hash of the receipt before it (seq {prev_seq})")
            expected_seq, expected_prev, prev_seq = seq + 1, row["hash"], seq
        return problems or [f"chain {chain or '(legacy)'}: its links do not add up (a receipt was inserted or renumbered)"]

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
        _non_negative(offset, "offset")
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
            clauses.append(f"time >= {_timestamp_literal(since, 'since')}")
        if until is not None:
            clauses.append(f"time < {_timestamp_literal(until, 'until')}")
        if limit is not None:
            _non_negative(limit, "limit")

        total, shown = self._table.page(" AND ".join(f"({clause})" for clause in clauses) or None, offset=offset, limit=limit)
        return total, [self._stored(row) for row in shown]

    @staticmethod
    def _stored(row: Mapping[str, Any]) -> StoredReceipt:
        try:
            values = {name: row[name] for name in _RECEIPT_FIELDS}
            values["chunk_ids"] = tuple(row["chunk_ids"])
            values["doc_ids"] = tuple(row["doc_ids"])
            values["chunk_labels"] = {k: tuple(v) for k, v in json.loads(row["chunk_labels"]).items()}
            values["details"] = json.loads(row["details"])
            return StoredReceipt(
                **values,
                chain=row["chain"] or LEGACY_CHAIN,
                seq=row["seq"],
                receipt_id=row["receipt_id"],
                time=row["time"].astimezone(timezone.utc),
                prev_hash=row["prev_hash"],
                hash=row["hash"],
            )
        except (InvalidRequestError, ValueError, TypeError, AttributeError) as exc:
            raise WarehouseError(
                f"audit receipt seq {row.get('seq')} is malformed ({exc}); run verify to see what was changed"
            ) from exc
