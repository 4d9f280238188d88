"""The receipts' journal: each group commit of receipts as one small Arrow file, durable before
it is in the ``audit`` table, then folded into the table in bulk.

Why: a Lance commit costs 3 to 10 ms and leaves a table version, and a search answers only once
its receipt is durable. Writing the batch as one Arrow IPC file under ``audit_journal/`` costs
about a quarter of a millisecond locally (written, then renamed into place) and one PUT on object
storage, where a new object appears whole or not at all. A writer folds its files into the
table every few hundred receipts or second (``AuditTable.fold``), one commit for all of them.
Readers read the journal and then the table, so a receipt is in the log from the moment its file
exists, and one folded meanwhile is found in one place or the other, never in neither.

A file's name says whose receipts it holds: ``<chain>-<first seq>-<last seq>-<unix ms>.arrow``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyarrow import ipc

from .files import WarehouseFiles, warehouse_files
from .schema import AUDIT_SCHEMA

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

    def age_s(self, now_ms: int | None = None) -> float:
        return ((now_ms if now_ms is not None else _now_ms()) - self.written_ms) / 1000


@dataclass(frozen=True, kw_only=True)
class JournalRead:
    """What reading journal files found: their receipts, and a problem for each file that could not
    be read as receipts (gone files are not problems: they were folded meanwhile)."""

    rows: pa.Table
    read: tuple[JournalFile, ...]
    problems: tuple[str, ...]


class ReceiptJournal:
    """The journal of one warehouse: write a batch of receipts, list, read and remove files."""

    def __init__(self, files: WarehouseFiles) -> None:
        self._files = files

    @classmethod
    def of(cls, uri: str, storage_options: Mapping[str, str]) -> ReceiptJournal | None:
        """The journal of the warehouse at ``uri``: a folder locally, a prefix on S3; None for other
        stores, whose receipts then go straight to the table (one commit per group commit)."""
        files = warehouse_files(uri, storage_options, JOURNAL)
        return None if files is None else cls(files)

    def write(self, rows: pa.Table, *, chain: str, first: int, last: int) -> JournalFile:
        """Store ``rows`` (receipts ``first``..``last`` of ``chain``) as one file, durable on return."""
        written = JournalFile(chain=chain, first=first, last=last, written_ms=_now_ms())
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, AUDIT_SCHEMA) as out:
            out.write_table(rows)
        self._files.put(written.name, sink.getvalue().to_pybytes())
        return written

    def files(self) -> list[JournalFile]:
        """Every journal file now present, oldest first."""
        found = [parsed for name in self._files.names() if (parsed := JournalFile.parse(name)) is not None]
        return sorted(found, key=lambda file: (file.written_ms, file.chain, file.first))

    def read(self, files: Sequence[JournalFile]) -> JournalRead:
        """The receipts of ``files``; a file that is gone (folded meanwhile) is skipped."""
        tables: list[pa.Table] = []
        read: list[JournalFile] = []
        problems: list[str] = []
        for file in files:
            data = self._files.get(file.name)
            if data is None:
                continue
            try:
                table = ipc.open_file(pa.BufferReader(data)).read_all()
                if not table.schema.equals(AUDIT_SCHEMA, check_metadata=False):
                    raise ValueError(f"its schema is {table.schema}, not the receipts'")
            except (pa.ArrowException, ValueError) as exc:
                problems.append(f"journal file {file.name}: cannot be read as receipts ({str(exc).splitlines()[0]})")
                continue
            tables.append(table.cast(AUDIT_SCHEMA))
            read.append(file)
        rows = pa.concat_tables(tables) if tables else AUDIT_SCHEMA.empty_table()
        return JournalRead(rows=rows, read=tuple(read), problems=tuple(problems))

    def remove(self, files: Sequence[JournalFile]) -> None:
        for file in files:
            self._files.remove(file.name)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
