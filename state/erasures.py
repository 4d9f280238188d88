"""The ``erasures`` table's door: one tombstone per erased document, so an erasure holds.

``forget`` removes a document's text and vectors from every file; what stays is this mark (tenant,
id, the source it came from, when), never content. Ingest reads the marks of the documents it is
about to write and refuses an erased one unless the operator asks to restore it, which lifts the
mark (and is receipted by the ingest that does it). The table is made by the first erasure: a
warehouse that never erased anything has none, and reads of it find no mark.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from ..governance.sql import sql_documents
from .commit_retry import retrying_conflicts
from .home import Door, Home
from .schema import ERASURES
from .snapshot import DocumentKey
from .tables import documents_rows, names_storage_failures, open_table

ERASURES_SCHEMA = pa.schema(
    [
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source_uri", pa.string()),
        pa.field("erased_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


@dataclass(frozen=True, kw_only=True)
class Erasure:
    """The mark an erased document leaves: where it came from and when it was erased."""

    tenant: str
    doc_id: str
    source_uri: str | None
    erased_at: datetime


@names_storage_failures
class Erasures(Door):
    """Tombstones of erased documents: written before the erasure, read by every ingest batch."""

    def __init__(self, home: Home, db: Any) -> None:
        super().__init__(home)
        self._db = db
        self._table: Any = None

    def _opened(self, *, create: bool) -> Any:
        """The table, opened once it exists (created first when ``create``); None while absent."""
        if self._table is None and (create or ERASURES in set(self._db.list_tables().tables)):
            self._table = open_table(self._db, ERASURES, ERASURES_SCHEMA)
        return self._table

    def record(self, document: DocumentKey, *, source_uri: str | None) -> None:
        """Mark ``document`` erased (before its rows go, so a crash mid-erasure still refuses it)."""
        table = self._opened(create=True)
        row = {"tenant": document[0], "doc_id": document[1], "source_uri": source_uri,
               "erased_at": datetime.now(timezone.utc)}  # fmt: skip
        retrying_conflicts(lambda: table.add(pa.Table.from_pylist([row], schema=ERASURES_SCHEMA)), what="marking an erasure")

    def of(self, keys: Iterable[DocumentKey]) -> dict[DocumentKey, Erasure]:
        """The latest mark of each document in ``keys`` that was erased (and not restored since)."""
        table = self._opened(create=False)
        if table is None:
            return {}
        marks: dict[DocumentKey, Erasure] = {}
        for row in documents_rows(table, keys, list(ERASURES_SCHEMA.names)):
            mark = Erasure(**row)
            key = (mark.tenant, mark.doc_id)
            if key not in marks or marks[key].erased_at < mark.erased_at:
                marks[key] = mark
        return marks

    def lift(self, documents: Sequence[DocumentKey]) -> None:
        """Remove the marks of ``documents``: they were restored on purpose."""
        table = self._opened(create=False)
        if table is not None and documents:
            retrying_conflicts(lambda: table.delete(sql_documents(documents)), what="lifting erasure marks")
