"""Audit receipts and their hash rule: append-only, hash-chained logs of every retrieval and policy
decision. Pure: the values and the rule; the writer that keeps them is ``state.audit_log``.

Each receipt is one row of the warehouse's ``audit`` table. Every writer process appends to a chain
of its own, named by a random ``chain`` id: a sequence number ``seq`` (1, 2, 3, ...), the hash of
the receipt before it in that chain (``prev_hash``; 64 zeros for the first) and its own ``hash``:
sha256 -- or HMAC-sha256 when the log is given a key (``ReceiptHasher``) -- over a canonical JSON
of every other field of the receipt, the chain id included (``CHAINED``). Receipts keep ids,
labels, counts and hashes; never chunk text, and the raw query only when the caller passes it.
Receipts written before per-writer chains form one legacy chain (no chain id, hashed without it)
and keep verifying.

Checkpoints bind every chain's head at one moment into one hash, a Merkle tree root over the
heads (as RFC 6962 logs sign tree heads).

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
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any

from ..errors import ConfigurationError, InvalidRequestError, WarehouseError
from .merkle import merkle_root
from .operations import ALL_OPERATIONS

log = logging.getLogger(__name__)

__all__ = [
    "GENESIS_HASH",
    "KINDS",
    "ChainReport",
    "Checkpoint",
    "Receipt",
    "ReceiptHasher",
    "StoredReceipt",
    "fingerprint",
]

GENESIS_HASH = "0" * 64
KINDS = frozenset({"retrieval", "decision"})
OPERATIONS = ALL_OPERATIONS

_HASH_DOMAIN = b"ragwarden.audit.v1\n"  # the legacy chain, written before per-writer chains
_HASH_DOMAIN_CHAINED = b"ragwarden.audit.v2\n"
_CHECKPOINT_DOMAIN = b"ragwarden.audit.checkpoint.v1\n"
HEX64 = re.compile(r"[0-9a-f]{64}")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MAX_INT32 = 2**31 - 1
LEGACY_CHAIN = ""
"""The chain id of receipts written before per-writer chains (stored as null)."""


def fingerprint(query: str) -> str:
    """The sha256 hex of a query: lets receipts be matched by query without keeping its text."""
    if not isinstance(query, str):
        raise InvalidRequestError(f"a query fingerprint needs a str, got {type(query).__name__}")
    return hashlib.sha256(query.encode("utf-8", "surrogatepass")).hexdigest()


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
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


def non_negative(value: object, what: str) -> None:
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
        if digest is not None and (not isinstance(digest, str) or not HEX64.fullmatch(digest)):
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
            details = json.loads(canonical_json(dict(self.details)))
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
        """``receipt`` with what the log added (``PLACED``), its fields not checked again: they
        were checked when it was made, and a search's receipt is made once per answer."""
        stored = object.__new__(cls)
        for name in RECEIPT_FIELDS:
            object.__setattr__(stored, name, getattr(receipt, name))
        for name in PLACED:
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


RECEIPT_FIELDS = tuple(f.name for f in fields(Receipt))


def columns_of(receipt: Receipt) -> dict[str, Any]:
    """The table columns a receipt fills (all but seq, receipt_id, time and the hashes)."""
    row = {name: getattr(receipt, name) for name in RECEIPT_FIELDS}
    row["chunk_ids"] = list(receipt.chunk_ids)
    row["doc_ids"] = list(receipt.doc_ids)
    row["labels"] = sorted({label for labels in receipt.chunk_labels.values() for label in labels})
    row["chunk_labels"] = canonical_json({k: list(v) for k, v in receipt.chunk_labels.items()})
    row["details"] = canonical_json(dict(receipt.details))
    return row


def micros(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


HASH_PIECE = 2000
"""hashlib gives up the interpreter lock for an update of 2,048 bytes or more; a group commit,
which every search in it waits for, hashes in shorter pieces (the digest is the same)."""

PLACED = ("chain", "seq", "receipt_id", "time", "prev_hash", "hash")
"""What the log adds to a receipt when it stores it (``StoredReceipt``)."""

LEGACY_CHAINED = (*RECEIPT_FIELDS, "labels", "seq", "receipt_id", "time", "prev_hash")
CHAINED = (*LEGACY_CHAINED, "chain")
"""What a receipt's hash covers: every field of the receipt as stored, but the hash itself (a
legacy receipt's: all of those but the chain it does not have)."""


def payload_parts(row: Mapping[str, Any], names: Sequence[str]) -> dict[str, bytes]:
    """Each of ``names`` as it appears in a hash payload: ``"name":value`` in canonical JSON, UTF-8
    (a tuple as a list, ``time`` as integer microseconds, UTC). UnicodeEncodeError for a value that
    is not text (a lone surrogate)."""
    parts = {}
    for name in names:
        value = row[name]
        if name == "time":
            value = micros(value)
        elif isinstance(value, tuple):
            value = list(value)
        parts[name] = f"{canonical_json(name)}:{canonical_json(value)}".encode("utf-8")
    return parts


def joined_payload(parts: Mapping[str, bytes], *, legacy: bool) -> bytes:
    """The canonical JSON object of ``parts`` (keys sorted, as ``canonical_json`` spells a dict),
    after the hash domain."""
    body = b",".join(parts[name] for name in sorted(parts))
    return (_HASH_DOMAIN if legacy else _HASH_DOMAIN_CHAINED) + b"{" + body + b"}"


def hash_payload(row: Mapping[str, Any]) -> bytes:
    """Canonical bytes of the ``CHAINED`` fields; ``time`` as integer microseconds (UTC)."""
    legacy = not row.get("chain")
    return joined_payload(payload_parts(row, LEGACY_CHAINED if legacy else CHAINED), legacy=legacy)


UNPLACED = tuple(name for name in CHAINED if name not in PLACED)
"""What of a receipt's hash payload is known before the log places it (all but its chain, seq,
id, time and previous hash)."""


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A receipt readied for the log on its caller's thread: its table columns and its part of the
    hash payload, so the commit (one at a time) only places and chains it."""

    receipt: Receipt
    columns: dict[str, Any]
    parts: dict[str, bytes]
    receipt_id: str  # drawn here: drawing it reads the system's randomness, which gives up the lock

    @classmethod
    def of(cls, receipt: Receipt) -> Prepared:
        """Refuses, on the caller's own thread, a receipt whose payload is not UTF-8 text (a lone
        surrogate in ``details``), so it fails alone rather than the batch committed with it."""
        columns = columns_of(receipt)
        try:
            parts = payload_parts(columns, UNPLACED)
        except UnicodeEncodeError as exc:
            raise InvalidRequestError(
                f"receipt is not valid Unicode text ({exc.reason} at {exc.start}); it was not recorded"
            ) from None
        return cls(receipt=receipt, columns=columns, parts=parts, receipt_id=str(uuid.uuid4()))


def checkpoint_payload(root: str, moment: datetime, receipts: int, heads: Sequence[ChainHead]) -> bytes:
    body = {"root": root, "time": micros(moment), "receipts": receipts, "heads": [list(head) for head in heads]}
    return _CHECKPOINT_DOMAIN + canonical_json(body).encode("utf-8")


def place(chain: str, seq: int | str) -> str:
    """How a problem names a receipt: ``seq N`` in the legacy chain, ``chain C seq N`` elsewhere."""
    return f"seq {seq}" if chain == LEGACY_CHAIN else f"chain {chain} seq {seq}"


def link_digest(seq: int, digest: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seq}:{digest}".encode("utf-8", "surrogatepass")).digest(), "big")


@dataclass(kw_only=True)
class ChainTally:
    """What one streamed pass keeps of a chain, whatever its length: enough to tell whether its
    links are complete (the receipts' (seq, hash) pairs and their (seq - 1, prev_hash) claims are
    equal multisets, summed as hashes) and where it ends."""

    count: int = 0
    low: int = 0
    head: tuple[int, str] = (0, GENESIS_HASH)
    have: int = 0
    want: int = 0
    genesis_ok: bool = True
    start: tuple[int, str] = (0, GENESIS_HASH)
    """Where the chain starts: before it, genesis; after a retention seal, the head the seal binds
    (the receipts up to it were archived, and the first one kept links to it)."""

    def add(self, seq: int, digest: str, prev: str) -> None:
        self.count += 1
        self.low = seq if self.count == 1 else min(self.low, seq)
        if seq > self.head[0]:
            self.head = (seq, digest)
        self.have += link_digest(seq, digest)
        if seq == 1:
            self.genesis_ok = self.genesis_ok and prev == GENESIS_HASH
        else:
            self.want += link_digest(seq - 1, prev)

    def intact(self) -> bool:
        first, from_hash = self.start
        if first == 0:
            return (
                self.genesis_ok and self.low == 1 and self.count == self.head[0]
                and self.have - link_digest(*self.head) == self.want
            )  # fmt: skip
        return (
            self.low == first + 1 and self.count == self.head[0] - first
            and self.have - link_digest(*self.head) + link_digest(first, from_hash) == self.want
        )  # fmt: skip


@dataclass(frozen=True)
class ReceiptHasher:
    """The hash rule with its key: sha256 over a receipt's canonical payload, or HMAC-sha256 when
    the log has a key; and the check value of the key that the table records (so a writer with
    another key, or none, is refused)."""

    key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.key is not None and (not isinstance(self.key, bytes) or not self.key):
            raise ConfigurationError("the audit HMAC key must be non-empty bytes")

    @property
    def key_check(self) -> str:
        if self.key is None:
            return "none"
        return hmac.new(self.key, b"ragwarden audit key check", hashlib.sha256).hexdigest()

    def key_problem(self, recorded: str | None) -> str | None:
        """What is wrong with this key for a table that recorded ``recorded`` (None: nothing)."""
        if recorded is None or recorded == self.key_check:
            return None
        if recorded == "none":
            return "the audit log was created without an HMAC key, but this one was given a key"
        if self.key is None:
            return "the audit log was created with an HMAC key, but this one was given none"
        return "the audit log was created with a different HMAC key than the one given"

    def digest(self, payload: bytes) -> str:
        digest = hashlib.sha256() if self.key is None else hmac.new(self.key, digestmod=hashlib.sha256)
        for start in range(0, len(payload), HASH_PIECE):  # pieces short enough to keep the lock
            digest.update(payload[start : start + HASH_PIECE])
        return digest.hexdigest()

    def hash(self, row: Mapping[str, Any]) -> str:
        return self.digest(hash_payload(row))

    def intact(self, checkpoint: Checkpoint) -> bool:
        """Whether a checkpoint's root and hash still match its heads."""
        payload = checkpoint_payload(checkpoint.root, checkpoint.time, checkpoint.receipts, checkpoint.heads)
        return merkle_root(checkpoint.heads) == checkpoint.root and self.digest(payload) == checkpoint.hash

    def checkpoint(self, heads: Mapping[str, tuple[int, str]], moment: datetime) -> Checkpoint:
        """The checkpoint binding ``heads`` at ``moment``."""
        listed = tuple(sorted((chain, seq, digest) for chain, (seq, digest) in heads.items()))
        root = merkle_root(listed)
        receipts = sum(seq for _, seq, _ in listed)
        digest = self.digest(checkpoint_payload(root, moment, receipts, listed))
        return Checkpoint(root=root, time=moment, receipts=receipts, heads=listed, hash=digest)


@dataclass(frozen=True)
class KeyRing:
    """The audit key writers hash with (``current``) and the keys rotated out (``retired``), which
    only verify: the chains written under them stay verifiable after a rotation. Each chain is
    one writer's, hashed under one key for its whole length; verify finds that key from the
    chain's receipts. ``seal``, the root of a checkpoint taken once every writer ran the current
    key, fences the retired keys: a chain under one of them must be bound by that checkpoint and
    end at the head it binds, so a retired key that leaks can neither start a chain nor extend one."""

    current: ReceiptHasher
    retired: tuple[ReceiptHasher, ...] = ()
    seal: str | None = None

    @classmethod
    def of(cls, key: bytes | None, retired: Iterable[bytes] = (), seal: str | None = None) -> KeyRing:
        ring = cls(current=ReceiptHasher(key), retired=tuple(ReceiptHasher(old) for old in retired), seal=seal)
        checks = [hasher.key_check for hasher in ring.hashers]
        if len(set(checks)) != len(checks):
            raise ConfigurationError("an audit key is listed twice (as the key and a retired key, or twice retired)")
        if seal is not None and not HEX64.fullmatch(seal):
            raise ConfigurationError(f"the audit key seal {seal!r} is not a checkpoint root (64 lowercase hex digits)")
        return ring

    @property
    def hashers(self) -> tuple[ReceiptHasher, ...]:
        return (self.current, *self.retired)

    def key_problem(self, recorded: str | None) -> str | None:
        """What is wrong with this ring for a table that recorded ``recorded`` (None: nothing):
        the table's key must be the current key or one retired."""
        if recorded is None or any(recorded == hasher.key_check for hasher in self.hashers):
            return None
        problem = self.current.key_problem(recorded)
        return f"{problem} (nor any retired key)" if self.retired else problem

    def key_of(self, row: Mapping[str, Any]) -> ReceiptHasher | None:
        """The key ``row``'s hash was made with, of this ring; None when no key gives it."""
        for hasher in self.hashers:
            try:
                if hasher.hash(row) == row["hash"]:
                    return hasher
            except (TypeError, ValueError, KeyError):
                return None
        return None

    def intact(self, checkpoint: Checkpoint) -> bool:
        """Whether a checkpoint's root and hash match its heads, under any key of the ring."""
        return any(hasher.intact(checkpoint) for hasher in self.hashers)

    def sealed_problems(self, retired_heads: Mapping[str, tuple[int, str]], checkpoints: Sequence[Checkpoint]) -> list[str]:
        """What breaks the seal: a chain under a retired key that the seal's checkpoint does not
        bind, or that no longer ends at the head it binds. No seal configured: nothing."""
        if self.seal is None or not retired_heads:
            return []
        found = [c for c in checkpoints if c.root == self.seal and merkle_root(c.heads) == c.root]
        if not found:
            return [f"audit key seal {self.seal[:16]}: no checkpoint of that root is in the log"]
        bound = {chain: (seq, digest) for chain, seq, digest in found[-1].heads}
        problems = []
        for chain, head in sorted(retired_heads.items()):
            if chain not in bound:
                problems.append(f"chain {chain}: hashed with a retired audit key but not bound by the seal "
                                "(started after the rotation: written with a retired key)")  # fmt: skip
            elif bound[chain] != head:
                problems.append(f"chain {chain}: hashed with a retired audit key and changed since the seal "
                                f"(the seal binds seq {bound[chain][0]}, the chain ends at seq {head[0]})")  # fmt: skip
        return problems


class ChainPass:
    """One streamed pass over receipts, by ``verify`` and ``verify_archive`` alike: each receipt's
    hash recomputed under its chain's key (found from the chain's receipts, of ``keys``, then held
    for the chain's whole length), and each chain's links tallied from where it starts (``starts``:
    a retention seal's heads; genesis otherwise)."""

    def __init__(self, keys: KeyRing, starts: Mapping[str, tuple[int, str]] | None = None) -> None:
        self.keys = keys
        self.starts = dict(starts or {})
        self.tallies: dict[str, ChainTally] = {}
        self.chain_keys: dict[str, ReceiptHasher] = {}

    def add(self, row: Mapping[str, Any], problems: list[str]) -> None:
        """Check one receipt's hash (a mismatch goes to ``problems``) and tally its link."""
        chain, seq = row["chain"] or LEGACY_CHAIN, row["seq"]
        if chain not in self.chain_keys and (found := self.keys.key_of(row)) is not None:
            self.chain_keys[chain] = found
        try:
            computed = self.chain_keys.get(chain, self.keys.current).hash(row)
        except (TypeError, ValueError, KeyError) as exc:
            computed = f"<cannot hash: {exc}>"
        if computed != row["hash"]:
            problems.append(f"{place(chain, seq)}: hash does not match the receipt's content (edited or forged)")
        self.tallies.setdefault(chain, ChainTally(start=self.start(chain))).add(seq, row["hash"], row["prev_hash"])

    def start(self, chain: str) -> tuple[int, str]:
        return self.starts.get(chain, (0, GENESIS_HASH))

    def retired_heads(self) -> dict[str, tuple[int, str]]:
        """The heads of the chains hashed under a retired key (for the seal's check)."""
        return {chain: self.tallies[chain].head for chain, hasher in self.chain_keys.items() if hasher is not self.keys.current}


@dataclass(frozen=True, kw_only=True)
class ArchiveReport:
    """What an archive of the audit log moved out: how many receipts of how many chains, and the
    seal that binds each chain's last archived receipt (record its root outside)."""

    seal: Checkpoint
    receipts: int
    chains: int


def checkpoint_of(row: Mapping[str, Any]) -> Checkpoint:
    """A checkpoint as the table stores it (``heads`` as canonical JSON)."""
    try:
        heads = tuple((str(chain), int(seq), str(digest)) for chain, seq, digest in json.loads(row["heads"]))
    except (TypeError, ValueError) as exc:
        heads = ()
        log.warning("audit checkpoint %s has malformed heads: %s", row.get("root"), exc)
    return Checkpoint(root=row["root"], time=row["time"].astimezone(timezone.utc), receipts=row["receipts"],
                      heads=heads, hash=row["hash"])  # fmt: skip


def checkpoint_row(checkpoint: Checkpoint) -> dict[str, Any]:
    """A checkpoint as the table stores it."""
    stored = canonical_json([list(head) for head in checkpoint.heads])
    return {"root": checkpoint.root, "time": checkpoint.time, "receipts": checkpoint.receipts, "heads": stored,
            "hash": checkpoint.hash}  # fmt: skip


def stored_receipt(row: Mapping[str, Any]) -> StoredReceipt:
    """A receipt as the table stores it; ``WarehouseError`` for a row that is not one."""
    try:
        values = {name: row[name] for name in RECEIPT_FIELDS}
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


def broken_links(chain: str, links: Iterable[Mapping[str, Any]], start: tuple[int, str] = (0, GENESIS_HASH)) -> list[str]:
    """What exactly is wrong with the links of a chain (``links``: its rows' seq, hash and
    prev_hash, in seq order) that a streamed pass found broken; ``start``, the head a retention
    seal binds for it (its receipts up to that one archived)."""
    problems: list[str] = []
    expected_seq, expected_prev, prev_seq = start[0] + 1, start[1], None
    for row in (row for row in links if row["seq"] > start[0]):
        seq = row["seq"]
        if seq < expected_seq:
            problems.append(f"{place(chain, seq)}: appears more than once (a receipt was inserted or renumbered)")
        elif seq > expected_seq:
            missing = f"{expected_seq}" if seq == expected_seq + 1 else f"{expected_seq}..{seq - 1}"
            problems.append(f"{place(chain, missing)}: missing (deleted or renumbered)")
        if row["prev_hash"] != expected_prev:
            if prev_seq is None:
                problems.append(f"{place(chain, seq)}: first receipt's prev_hash is not "
                                + ("the genesis value (64 zeros)" if start[0] == 0 else f"the sealed head (seq {start[0]})"))  # fmt: skip
            else:
                problems.append(f"{place(chain, seq)}: prev_hash is not the hash of the receipt before it (seq {prev_seq})")
        expected_seq, expected_prev, prev_seq = seq + 1, row["hash"], seq
    return problems or [f"chain {chain or '(legacy)'}: its links do not add up (a receipt was inserted or renumbered)"]


def probe_ids(item_id: object) -> tuple[str, ...]:
    """The id a probe asked about, as a receipt can hold it (none if it is not text a receipt can
    hold): receipts of explain and of a refused get name it with ``allowed`` saying what came of it."""
    asked = str(item_id)[:256]
    return (asked,) if asked and "\x00" not in asked and asked.isprintable() else ()
