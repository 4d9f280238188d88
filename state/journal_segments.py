"""The receipts' journal in a local folder: each writer appends its group commits to a segment, a
file it maps into memory, one record per group commit.

Why: a search answers only once its receipt is durable, and under load every system call or Arrow
call the group commit makes hands the interpreter lock to another request thread and waits to get
it back: with one small Arrow file per group commit (four system calls, an IPC serialisation),
receipts were 18-20% of a search's time at 16 clients. Copying a record into a shared mapping
gives up nothing; the group commit runs start to end on its leader's thread (but for the first
after each fold, which starts a new segment). The record is then in the operating system's page
cache, as a written file is: a killed process loses nothing, and any reader of the file sees it.

A segment is ``<created unix ms>-<token>.receipts``: the magic ``MAGIC``, then records, each a
little-endian length and CRC-32 and that many bytes of JSON lines (the group commit's rows,
``time`` as integer microseconds), the rest zeros. The length is copied after the body, so a
record is either whole or, while it is being copied (or when its writer died copying it), ends
the segment. A writer seals its segment at each fold (and after ``SEAL_AFTER_S``, or when it is
full) and starts a new one at its next receipt. It holds a lock on each of its segments until it
has folded and removed it: a segment nobody holds is written no more (``in_use``), so damage found
in it, even to its last record, was done after the fact.
"""

from __future__ import annotations

import binascii
import fcntl
import json
import mmap
import os
import re
import struct
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson

from .files import open_new
from .schema import AUDIT_SCHEMA

MAGIC = b"RWRJ\x00\x00\x00\x01"
SEGMENT_BYTES = 1 << 20
"""A segment's size, allocated when it is made: about 1,500 search receipts. A busy writer folds
every 1,000 receipts or every second, sealing the segment each time; a full one is sealed early."""
SEAL_AFTER_S = 10.0
"""A writer never appends to a segment older than this."""

_HEADER = struct.Struct("<II")
_NAME = re.compile(r"(?P<written>\d{13})-(?P<token>[0-9a-f]{16})\.receipts")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True, kw_only=True)
class JournalSegment:
    """One writer's segment, created at ``written_ms``."""

    token: str
    written_ms: int

    @property
    def name(self) -> str:
        return f"{self.written_ms:013d}-{self.token}.receipts"

    @classmethod
    def parse(cls, name: str) -> JournalSegment | None:
        found = _NAME.fullmatch(name)
        return None if found is None else cls(token=found["token"], written_ms=int(found["written"]))

    def age_s(self, now: int | None = None) -> float:
        return ((now if now is not None else now_ms()) - self.written_ms) / 1000


def now_ms() -> int:
    """The time as journal names write it: unix milliseconds."""
    return time.time_ns() // 1_000_000


class OpenSegment:
    """The segment a writer appends to: created, mapped, and written with no system call after.
    Its writer holds a lock on it until the segment is folded and removed (or the writer dies),
    so no other writer ever takes it for a stopped writer's (``in_use``)."""

    def __init__(self, folder: Path, size: int) -> None:
        """Create it under a temporary name, its disk space allocated (a full disk is then an error
        here, not a fault when a page is first written) and its magic written, then give it its
        name: a reader never finds a segment without its magic."""
        self.file = JournalSegment(token=uuid.uuid4().hex[:16], written_ms=now_ms())
        self.pid = os.getpid()
        partial = folder / f".{self.file.name}.tmp"
        self._handle = open_new(partial, os.O_RDWR)
        try:
            fcntl.flock(self._handle, fcntl.LOCK_EX)
            os.posix_fallocate(self._handle, 0, size)
            self._map = mmap.mmap(self._handle, size)
            self._map[: len(MAGIC)] = MAGIC
            os.replace(partial, folder / self.file.name)  # the lock goes with the file
        except BaseException:
            os.close(self._handle)
            partial.unlink(missing_ok=True)
            raise
        self._end = len(MAGIC)
        self._sealed_at = time.monotonic() + SEAL_AFTER_S

    def takes(self, body: bytes) -> bool:
        """Whether ``body`` fits, in this process, before the segment is due to be sealed."""
        return (
            self.pid == os.getpid()
            and self._end + _HEADER.size + len(body) <= len(self._map)
            and time.monotonic() < self._sealed_at
        )

    def append(self, body: bytes) -> None:
        start = self._end + _HEADER.size
        self._map[start : start + len(body)] = body
        self._map[self._end : start] = _HEADER.pack(len(body), binascii.crc32(body))
        self._end = start + len(body)

    def release(self) -> None:
        """Unmap it and let the lock go (the segment was folded and removed, or this is a forked
        child's copy: the lock stays with the parent's descriptor). Once only."""
        if not self._map.closed:
            self._map.close()
            os.close(self._handle)


def in_use(path: Path) -> bool:
    """Whether a live writer still appends to the segment at ``path`` (holds its lock)."""
    try:
        handle = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(handle)
    return False


def encode(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """One group commit's rows as JSON lines, ``time`` as integer microseconds since the epoch:
    cheap to make in the commit, and turned into Arrow later without the interpreter lock."""
    return "".join(json.dumps({**row, "time": _micros(row["time"])}, separators=(",", ":")) + "\n" for row in rows).encode()


def to_table(bodies: Sequence[bytes]) -> pa.Table:
    """The receipts of ``encode``d group commits, as the ``audit`` table holds them (parsed in
    Arrow's own threads, so a fold of a second's receipts never stalls a search)."""
    if not bodies:
        return AUDIT_SCHEMA.empty_table()
    data = b"".join(bodies)  # one block: a line (a receipt) must not straddle two
    parsed = pajson.read_json(pa.BufferReader(data), read_options=pajson.ReadOptions(block_size=len(data) + 1),
                              parse_options=_PARSE)  # fmt: skip
    index = parsed.schema.get_field_index("time")
    return parsed.set_column(index, "time", parsed.column(index).cast(AUDIT_SCHEMA.field("time").type)).cast(AUDIT_SCHEMA)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


_PARSE = pajson.ParseOptions(
    explicit_schema=pa.schema([pa.field(f.name, pa.int64() if f.name == "time" else f.type) for f in AUDIT_SCHEMA]),
    unexpected_field_behavior="error",
)


def decode(data: bytes | memoryview, *, settled: bool) -> tuple[list[bytes], str | None]:
    """The bodies of a segment's whole records (``to_table`` reads them), up to a problem if it is
    not a segment or a record is damaged. A segment still written (not ``settled``) may end in a
    record being copied: a damaged last record there is one not yet written."""
    view = memoryview(data)
    if bytes(view[: len(MAGIC)]) != MAGIC:
        return [], "it is not a receipts segment"
    bodies: list[bytes] = []
    at = len(MAGIC)
    while at + _HEADER.size <= len(view):
        length, crc = _HEADER.unpack_from(view, at)
        end = at + _HEADER.size + length
        if length == 0 or len(view) < end or binascii.crc32(view[at + _HEADER.size : end]) != crc:
            rest = bytes(view[at:] if length == 0 else view[min(end, len(view)) :]).strip(b"\x00")
            if length == 0 and not rest:
                break  # the end of what was written
            if settled or (rest and length != 0):  # a record being copied has nothing after it
                return bodies, f"the record at byte {at} is damaged"
            break  # the last record, being copied (its body there, its length not yet, or torn)
        bodies.append(bytes(view[at + _HEADER.size : end]))
        at = end
    return bodies, None
