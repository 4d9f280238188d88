"""The receipts' journal: each group commit of receipts durable before it is in the ``audit``
table, then folded into the table in bulk.

Why: a Lance commit costs milliseconds and leaves a table version, and a search answers only once
its receipt is durable. In a local folder a writer appends each group commit to its own segment,
a file mapped into memory (``journal_segments``: no system call, nothing that waits for the
interpreter lock); on object storage each group commit is one small Arrow IPC file, one PUT, a new
object appearing whole or not at all. A writer folds what it journaled into the table every
thousand receipts or second (``AuditTable.fold``), one commit for all of it. Readers read the
journal and then the table, so a receipt is in the log from the moment it is journaled, and one
folded meanwhile is found in one place or the other, never in neither.

An Arrow file's name says whose receipts it holds: ``<chain>-<first seq>-<last seq>-<unix ms>.arrow``;
a segment's, when it was started (``<unix ms>-<token>.receipts``).
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyarrow import ipc

from ..errors import InvalidValueError
from .files import WarehouseFiles, warehouse_files
from .journal_segments import SEGMENT_BYTES, JournalSegment, OpenSegment, decode, in_use, now_ms, to_table
from .schema import AUDIT_SCHEMA
from .tables import local_path

JOURNAL = "audit_journal"
"""The journal's folder in the warehouse, beside the tables."""

_NAME = re.compile(r"(?P<chain>[0-9a-f]{1,64})-(?P<first>\d{12})-(?P<last>\d{12})-(?P<written>\d{13})\.arrow")


@dataclass(frozen=True, kw_only=True)
class JournalFile:
    """One journal file: the receipts ``first``..``last`` of ``chain``, written at ``written_ms``."""

    chain: str
    first: int
    last: int
    written_ms: int

    @property
    def name(self) -> str:
        return f"{self.chain}-{self.first:012d}-{self.last:012d}-{self.written_ms:013d}.arrow"

    @classmethod
    def parse(cls, name: str) -> JournalFile | None:
        """The file a name describes; None for anything else (a temporary file, a stray)."""
        found = _NAME.fullmatch(name)
        if found is None:
            return None
        return cls(chain=found["chain"], first=int(found["first"]), last=int(found["last"]),
                   written_ms=int(found["written"]))  # fmt: skip

    def age_s(self, now: int | None = None) -> float:
        return ((now if now is not None else now_ms()) - self.written_ms) / 1000


@dataclass(frozen=True, kw_only=True)
class JournalRead:
    """What reading journal files found: their receipts, and a problem for each file that could not
    be read as receipts (gone files are not problems: they were folded meanwhile)."""

    rows: pa.Table
    read: tuple[Journaled, ...]
    problems: tuple[str, ...]


Journaled = JournalFile | JournalSegment
"""A file of the journal: an Arrow file of one group commit, or a writer's segment."""


class ReceiptJournal:
    """The journal of one warehouse: write a group commit of receipts, list, read and remove files."""

    def __init__(self, files: WarehouseFiles, segments: Path | None = None) -> None:
        """``segments``: the journal's local folder, where group commits go to segments; None on
        object storage, where each is a file."""
        self._files = files
        self._segments = segments
        self._open: OpenSegment | None = None
        self._held: dict[str, OpenSegment] = {}  # this writer's segments, locked until removed
        self._lock = threading.Lock()
        if segments is not None:
            _WRITING.add(self)

    @classmethod
    def of(cls, uri: str, storage_options: Mapping[str, str]) -> ReceiptJournal | None:
        """The journal of the warehouse at ``uri``: a folder locally, a prefix on S3; None for other
        stores, whose receipts then go straight to the table (one commit per group commit)."""
        files = warehouse_files(uri, storage_options, JOURNAL)
        root = local_path(uri)
        return None if files is None else cls(files, None if root is None else root / JOURNAL)

    def write(self, body: bytes, *, chain: str, first: int, last: int) -> Journaled:
        """Make ``body`` (receipts ``first``..``last`` of ``chain``, ``journal_segments.encode``d)
        durable, all or none; returns the file holding it."""
        if self._segments is None:
            return self._write_file(body, chain=chain, first=first, last=last)
        with self._lock:
            segment = self._open
            if segment is None or not segment.takes(body):
                segment = self._open = OpenSegment(self._segments, max(SEGMENT_BYTES, 4 * len(body)))
                self._held[segment.file.name] = segment
            segment.append(body)
            return segment.file

    def _write_file(self, body: bytes, *, chain: str, first: int, last: int) -> JournalFile:
        written = JournalFile(chain=chain, first=first, last=last, written_ms=now_ms())
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, AUDIT_SCHEMA) as out:
            out.write_table(to_table([body]))
        self._files.put(written.name, sink.getvalue().to_pybytes())
        return written

    def seal(self) -> None:
        """End this writer's segment: whatever was written before is in files no one writes again,
        so they can be folded and removed (each stays locked, as its writer's, until removed); the
        next write starts a new segment."""
        with self._lock:  # no system call here: a group commit may be waiting for the lock
            self._open = None

    def files(self) -> list[Journaled]:
        """Every journal file now present, oldest first."""
        found: list[Journaled] = []
        for name in self._files.names():
            parsed = JournalFile.parse(name) or JournalSegment.parse(name)
            if parsed is not None:
                found.append(parsed)
        return sorted(found, key=lambda file: (file.written_ms, file.name))

    def abandoned(self, file: Journaled) -> bool:
        """Whether no live writer appends to ``file`` any more (an Arrow file never changes)."""
        if not isinstance(file, JournalSegment):
            return True
        path = self._files.local(file.name)
        return path is None or not in_use(path)

    def read(self, files: Sequence[Journaled]) -> JournalRead:
        """The receipts of ``files``; a file that is gone (folded meanwhile) is skipped. A segment
        damaged part way gives its receipts before the damage, and stays (for verify to report)."""
        tables: list[pa.Table] = []
        read: list[Journaled] = []
        problems: list[str] = []
        for file in files:
            damage = None
            try:
                if isinstance(file, JournalSegment):
                    table, damage = self._read_segment(file)
                else:
                    table = self._read_file(file)
            except FileNotFoundError:
                continue
            except (pa.ArrowException, ValueError, TypeError, KeyError) as exc:
                damage, table = str(exc).splitlines()[0], None
            if damage is not None:
                problems.append(f"journal file {file.name}: cannot be read as receipts ({damage})")
            if table is not None:
                tables.append(table)
            if damage is None:
                read.append(file)
        rows = pa.concat_tables(tables) if tables else AUDIT_SCHEMA.empty_table()
        return JournalRead(rows=rows, read=tuple(read), problems=tuple(problems))

    def _read_file(self, file: JournalFile) -> pa.Table:
        data = self._files.get(file.name)
        if data is None:
            raise FileNotFoundError(file.name)
        table = ipc.open_file(pa.BufferReader(data)).read_all()
        if not table.schema.equals(AUDIT_SCHEMA, check_metadata=False):
            raise InvalidValueError(f"its schema is {table.schema}, not the receipts'")
        return table.cast(AUDIT_SCHEMA)

    def _read_segment(self, file: JournalSegment) -> tuple[pa.Table, str | None]:
        """Its receipts up to any damage, and the damage. Read, not mapped: a file cut short under
        a mapping faults the process."""
        path = self._files.local(file.name)
        if path is None:
            raise FileNotFoundError(file.name)
        settled = not in_use(path)  # no writer appends to it: a damaged last record is damage
        bodies, problem = decode(path.read_bytes(), settled=settled)
        return to_table(bodies), problem

    def remove(self, files: Sequence[Journaled]) -> None:
        for file in files:
            self._files.remove(file.name)
            with self._lock:
                held = None if self._open is not None and self._open.file == file else self._held.pop(file.name, None)
            if held is not None:
                held.release()


_WRITING: weakref.WeakSet[ReceiptJournal] = weakref.WeakSet()
"""Journals that may hold segments in this process."""


def _forget_in_children() -> None:
    """In a forked child, drop the parent's segments: the child never writes them, and its copies
    of their descriptors would keep the parent's locks alive after the parent died."""
    for journal in list(_WRITING):
        journal._lock = threading.Lock()
        held, journal._held, journal._open = journal._held, {}, None
        for segment in held.values():
            segment.release()


os.register_at_fork(after_in_child=_forget_in_children)
