"""Audit receipts: an append-only, hash-chained log of every retrieval and policy decision.

Each receipt is one row of the warehouse's ``audit`` table (``state.AuditTable`` stores them;
this module computes the chain). It carries a sequence number ``seq`` (1, 2, 3, ...), the hash of
the receipt before it (``prev_hash``; 64 zeros for the first) and its own ``hash``: sha256 -- or
HMAC-sha256 when the log is given a key -- over a canonical JSON of every other field of the
receipt (``_CHAINED``). Receipts keep ids, labels, counts and hashes; never chunk text, and the raw
query only when the caller passes it.

Several processes may append at once, on a local folder or on object storage alike, without file
locks. Within a process, one appender commits the receipts of concurrent callers together
(``appender.GroupCommit``); each caller returns once its receipt is durable. The appender reads
the head (the highest ``seq`` and its hash) and commits the batch, chained on it, at the version it
read: a commit by another process since then that took one of its ``seq`` makes Lance refuse the
batch, which is then built again on the new head (bounded).

What the chain proves, and what it does not:

- an edited, deleted, inserted or renumbered receipt, and a first receipt whose ``prev_hash`` is
  not the genesis value, are found by ``verify``;
- with plain sha256, anyone able to rewrite the table can also recompute every hash, so the
  chain then only shows accidental damage; with an HMAC key (kept away from the table's
  storage) a rewrite cannot produce valid hashes;
- removing receipts *from the end* leaves a shorter chain that is still valid: nothing in the
  table can tell that the tail is gone. Record ``head()`` somewhere else from time to time
  (a ticket, a log shipper, another store) and compare it with the log to detect truncation.

Each batch lands as a small data file and reading the head scans them all, so the writer that
passes every ``compact_every``-th receipt merges them and drops versions older than a few
minutes (compaction commutes with concurrent appends); the warehouse's ``optimize`` does the same.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import re
import time as _time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any, Protocol

from ..errors import ConfigurationError, InvalidRequestError, WarehouseError
from .appender import GroupCommit
from .operations import ALL_OPERATIONS
from .sql import sql_list, sql_string

log = logging.getLogger(__name__)

__all__ = [
    "GENESIS_HASH",
    "KINDS",
    "AuditLog",
    "ChainReport",
    "Receipt",
    "ReceiptTable",
    "StoredReceipt",
    "fingerprint",
]

GENESIS_HASH = "0" * 64
KINDS = frozenset({"retrieval", "decision"})
OPERATIONS = ALL_OPERATIONS

_HASH_DOMAIN = b"ragwarden.audit.v1\n"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MAX_INT32 = 2**31 - 1
_MAX_ATTEMPTS = 100
_MAX_BACKOFF_S = 0.05
COMPACT_EVERY = 200


class ReceiptTable(Protocol):
    """Where the log's rows live (``state.AuditTable``): the chain is computed here, stored there."""

    def recorded_key_check(self) -> str | None: ...
    def schema_intact(self) -> bool: ...
    def count(self) -> int: ...
    def head(self, floor: int = 0) -> tuple[int, str] | None: ...
    def append_on_head(
        self, build: Callable[[int, str], Sequence[Mapping[str, Any]]], floor: int = 0
    ) -> Sequence[Mapping[str, Any]] | None: ...
    def rows(self, where: str | None = None) -> list[dict[str, Any]]: ...
    def all_rows(self) -> list[dict[str, Any]]: ...
    def compact(self) -> int: ...


def fingerprint(query: str) -> str:
    """The sha256 hex of a query: lets receipts be matched by query without keeping its text."""
    if not isinstance(query, str):
        raise InvalidRequestError(f"a query fingerprint needs a str, got {type(query).__name__}")
    return hashlib.sha256(query.encode("utf-8", "surrogatepass")).hexdigest()


def _canonical_json(value: Any) -> str:
    """One spelling per value (sorted keys, no spaces), so a hash over it is reproducible."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


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
    """A receipt as the log holds it: its place in the chain, its time and its hashes."""

    seq: int
    receipt_id: str
    time: datetime
    prev_hash: str
    hash: str


@dataclass(frozen=True, kw_only=True)
class ChainReport:
    """What ``verify`` found: ``ok`` when every receipt is intact and in place.

    Each problem names the ``seq`` it concerns and what is wrong with it.
    """

    ok: bool
    receipts: int
    problems: tuple[str, ...]


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


_CHAINED = (*_RECEIPT_FIELDS, "labels", "seq", "receipt_id", "time", "prev_hash")
"""What a receipt's hash covers: every field of the receipt as stored, but the hash itself."""


def _hash_payload(row: Mapping[str, Any]) -> bytes:
    """Canonical bytes of the ``_CHAINED`` fields; ``time`` as integer microseconds (UTC)."""
    payload = {}
    for name in _CHAINED:
        value = row[name]
        if name == "time":
            value = _micros(value)
        elif isinstance(value, tuple):
            value = list(value)
        payload[name] = value
    return _HASH_DOMAIN + _canonical_json(payload).encode("utf-8")


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


class AuditLog:
    """The ``audit`` table: append receipts, verify the chain, find receipts by what they touched.

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
    ) -> None:
        """``table_for(key_check)`` opens the receipts' table, recording ``key_check`` (a check
        value of ``key``) if it creates it (``state.Store.audit_table``)."""
        if key is not None and (not isinstance(key, bytes) or not key):
            raise ConfigurationError("the audit HMAC key must be non-empty bytes")
        if compact_every is not None and (not isinstance(compact_every, int) or compact_every < 1):
            raise ConfigurationError(f"compact_every must be a positive int or None, got {compact_every!r}")
        self._compact_every = compact_every
        self._key = key
        self._key_check = (
            hmac.new(key, b"ragwarden audit key check", hashlib.sha256).hexdigest() if key is not None else "none"
        )
        self._table = table_for(self._key_check)
        self._key_problem_at_open = self._key_problem()  # the key check never changes legitimately
        self._head: tuple[int, str] = (0, GENESIS_HASH)
        self._appender: GroupCommit[Receipt, StoredReceipt] = GroupCommit(self._commit, name="audit-appender")
        self.lost_races = 0  # appends that found their seq taken and retried (for monitoring)

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

    def _hash(self, row: Mapping[str, Any]) -> str:
        payload = _hash_payload(row)
        if self._key is None:
            return hashlib.sha256(payload).hexdigest()
        return hmac.new(self._key, payload, hashlib.sha256).hexdigest()

    # -- maintenance ------------------------------------------------------------------------

    def compact(self) -> None:
        """Merge the receipts' small data files, so reading the head stays fast; rows are unchanged."""
        self._table.compact()

    def _compact_quietly(self) -> None:
        # The receipt is already committed: a failed compaction (say, a race with another
        # compaction) must not make the caller believe the append failed and retry it.
        try:
            self.compact()
        except Exception as exc:
            log.warning("audit log compaction failed (it will be tried again later): %s", exc)

    # -- appending ------------------------------------------------------------------------

    def head(self) -> tuple[int, str]:
        """(seq, hash) of the last receipt, (0, genesis) when empty: keep it elsewhere to detect a
        truncated tail later."""
        return self._table.head(self._head[0]) or (0, GENESIS_HASH)

    def append(self, receipt: Receipt) -> StoredReceipt:
        """Add ``receipt`` at the end of the chain and return it as stored, once it is durable.

        The process's receipts are committed by one appender, in batches (``appender``); races with
        other processes are settled by ``seq``: a batch whose first ``seq`` was taken is built again
        on the new head, up to a bound.
        """
        if not isinstance(receipt, Receipt):
            raise InvalidRequestError(f"append needs a Receipt, got {type(receipt).__name__}")
        if self._key_problem_at_open:
            raise ConfigurationError(f"{self._key_problem_at_open}; open it with the key it was created with")
        return self._appender.submit(receipt)

    def _commit(self, receipts: Sequence[Receipt]) -> list[StoredReceipt]:
        """Chain ``receipts`` onto the head and commit them at once; again on a new head if another
        writer took the next ``seq`` meanwhile."""
        columns = [_columns_of(receipt) for receipt in receipts]

        def chained(head_seq: int, head_hash: str) -> list[dict[str, Any]]:
            rows: list[dict[str, Any]] = []
            for offset, values in enumerate(columns, start=1):
                row = {**values, "seq": head_seq + offset, "receipt_id": str(uuid.uuid4()),
                       "time": datetime.now(timezone.utc), "prev_hash": rows[-1]["hash"] if rows else head_hash or GENESIS_HASH}  # fmt: skip
                row["hash"] = self._hash(row)
                rows.append(row)
            return rows

        for attempt in range(_MAX_ATTEMPTS):
            rows = self._table.append_on_head(chained, self._head[0])
            if rows is not None:
                first, last = rows[0], rows[-1]
                self._head = (last["seq"], last["hash"])
                if self._compact_every and (first["seq"] - 1) // self._compact_every != last["seq"] // self._compact_every:
                    self._compact_quietly()
                return [
                    StoredReceipt(
                        **{name: getattr(receipt, name) for name in _RECEIPT_FIELDS},
                        seq=row["seq"], receipt_id=row["receipt_id"], time=row["time"], prev_hash=row["prev_hash"],
                        hash=row["hash"],
                    )  # fmt: skip
                    for receipt, row in zip(receipts, rows, strict=True)
                ]
            self.lost_races += 1
            _time.sleep(random.uniform(0, min(_MAX_BACKOFF_S, 0.001 * 2**attempt)))
        raise WarehouseError(
            f"the audit receipts could not be appended after {_MAX_ATTEMPTS} attempts: other writers kept "
            "taking the next sequence number; retry the operation, or run fewer concurrent writers"
        )

    # -- verifying ------------------------------------------------------------------------

    def verify(self, *, expect_head: tuple[int, str] | None = None) -> ChainReport:
        """Recompute every hash and link; report each receipt that is edited, missing, extra or
        out of place. A tail cut off the end is visible only against ``expect_head``, a (seq, hash)
        recorded elsewhere earlier: the chain must still hold that receipt, unchanged."""
        problems: list[str] = []
        key_problem = self._key_problem()
        if key_problem:
            problems.append(f"table: {key_problem}")
        if not self._table.schema_intact():
            problems.append("table: the audit table's schema was changed")
            return ChainReport(ok=False, receipts=self._table.count(), problems=tuple(problems))
        rows = self._table.all_rows()
        expected_seq, expected_prev, prev_seq = 1, GENESIS_HASH, None
        for row in rows:
            seq = row["seq"]
            if seq < expected_seq:
                problems.append(f"seq {seq}: appears more than once (a receipt was inserted or renumbered)")
            elif seq > expected_seq:
                missing = f"{expected_seq}" if seq == expected_seq + 1 else f"{expected_seq}..{seq - 1}"
                problems.append(f"seq {missing}: missing (deleted or renumbered)")
            try:
                computed = self._hash(row)
            except (TypeError, ValueError, KeyError) as exc:
                computed = f"<cannot hash: {exc}>"
            if computed != row["hash"]:
                problems.append(f"seq {seq}: hash does not match the receipt's content (edited or forged)")
            if row["prev_hash"] != expected_prev:
                if prev_seq is None:
                    problems.append(f"seq {seq}: first receipt's prev_hash is not the genesis value (64 zeros)")
                else:
                    problems.append(f"seq {seq}: prev_hash is not the hash of the receipt before it (seq {prev_seq})")
            expected_seq, expected_prev, prev_seq = seq + 1, row["hash"], seq
        if expect_head is not None:
            seq, digest = expect_head
            held = [row["hash"] for row in rows if row["seq"] == seq]
            if not held:
                problems.append(f"seq {seq}: the recorded head is gone (the chain ends at seq {prev_seq or 0}; "
                                "receipts were dropped from the end)")  # fmt: skip
            elif digest not in held:
                problems.append(f"seq {seq}: its hash is not the recorded head's (the chain was rewritten)")
        return ChainReport(ok=not problems, receipts=len(rows), problems=tuple(problems))

    # -- querying -------------------------------------------------------------------------

    def query(
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
    ) -> list[StoredReceipt]:
        """Receipts matching every given filter, newest (highest seq) first.

        ``since`` is inclusive and ``until`` exclusive; both need a timezone. ``limit`` keeps the
        newest that many. ``any_chunk_ids`` matches receipts naming any of those rows (none: no
        receipt). Every value reaches SQL as a quoted literal.
        """
        clauses: list[str] = []
        if any_chunk_ids is not None:
            wanted = sorted({c for c in any_chunk_ids if "\x00" not in c})
            if not wanted:
                return []
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
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise InvalidRequestError(f"audit query limit must be a non-negative int, got {limit!r}")

        found = self._table.rows(" AND ".join(f"({clause})" for clause in clauses) or None)
        if limit is not None:
            found = found[:limit]
        return [self._stored(row) for row in found]

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
