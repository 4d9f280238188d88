"""The ``sources`` table's door: one record per (tenant, doc id), with the document's tags, content
hash and the ``chunks`` version that wrote it, replaced only by a later commit."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import InvalidRequestError, NotFoundError
from ..governance.sql import sql_documents
from ..governance.tags import GovernanceTags
from .chunks import ChunkReads
from .commit_retry import retrying_conflicts
from .home import Door, Home
from .registries import RegistryReads
from .schema import SOURCES_SCHEMA, TAG_COLUMNS
from .snapshot import DocumentKey
from .tables import documents_rows, names_storage_failures, rows_where_in

DOCUMENT_KEY = ("tenant", "doc_id")


@dataclass(frozen=True, kw_only=True)
class SourceState:
    """What the warehouse holds of one source document."""

    doc_id: str
    tenant: str
    doc_version: str
    tags_fingerprint: str
    uri: str | None
    metadata: str | None


@names_storage_failures
class Sources(Door):
    """The source records: read by document, written after the chunks they describe."""

    def __init__(self, home: Home, table: Any, *, chunks: ChunkReads, registries: RegistryReads) -> None:
        super().__init__(home)
        self._table = table
        self._chunks = chunks
        self._registries = registries

    def states(self, keys: Iterable[DocumentKey]) -> dict[DocumentKey, SourceState]:
        """The stored state of each document in ``keys`` that exists."""
        fields = list(SourceState.__dataclass_fields__)
        rows = documents_rows(self._table, keys, fields)
        return {(row["tenant"], row["doc_id"]): SourceState(**{k: row[k] for k in fields}) for row in rows}

    def tags(self, keys: Iterable[DocumentKey]) -> list[GovernanceTags]:
        """The current tags of source documents."""
        rows = documents_rows(self._table, keys, ["doc_id", *TAG_COLUMNS])
        registry = self._registries.clauses()
        return [GovernanceTags.from_row(row, registry) for row in rows]

    def document_tenants(self, doc_id: str) -> list[str]:
        """The tenants holding a document called ``doc_id`` (a source record or source chunks),
        for an operator who names no tenant."""
        recorded = {r["tenant"] for r in rows_where_in(self._table, "doc_id", [doc_id], ["tenant"])}
        return sorted(recorded | self._chunks.tenants_holding(doc_id))

    def tenant_of(self, doc_id: str, tenant: str | None, holders: list[str] | None = None) -> str:
        """The tenant whose document ``doc_id`` is meant: ``tenant`` if named, else the only one
        holding such an id (the operator's case; ``holders`` if the caller read them already).
        ``NotFoundError`` when none does, ``InvalidRequestError`` when several do."""
        if tenant is not None:
            return tenant
        holders = self.document_tenants(doc_id) if holders is None else holders
        if not holders:
            raise NotFoundError(f"document {doc_id!r} not found")
        if len(holders) > 1:
            raise InvalidRequestError(
                f"document id {doc_id!r} is used in tenants {', '.join(map(repr, holders))}: name the tenant (--tenant)"
            )
        return holders[0]

    def count(self) -> int:
        """How many source documents the warehouse holds, in every tenant."""
        return int(self._table.count_rows())

    def tenants(self) -> list[str]:
        """Every tenant the warehouse holds a source record of."""
        found = self._table.to_lance().to_table(columns=["tenant"])
        return sorted(set(found.column("tenant").to_pylist()))

    def record(self, rows: Sequence[Mapping[str, Any]] | pa.Table, *, chunks_version: int, insert: bool) -> None:
        """Write the whole records of documents whose chunks were committed at ``chunks_version``
        (dicts, or one Arrow table: a bulk load's); ``insert``: also those of documents that have
        none (an ingest; not a re-tag, whose document may have been erased meanwhile). A record
        already stamped by a later commit is left as it is, so writers finishing out of order leave
        the latest state."""
        if not len(rows):
            return
        if isinstance(rows, pa.Table):
            stamps = pa.array(np.full(rows.num_rows, chunks_version, dtype=np.int64))
            table = rows.append_column("chunks_version", stamps).select(SOURCES_SCHEMA.names).cast(SOURCES_SCHEMA)
            keys = list(zip(table.column("tenant").to_pylist(), table.column("doc_id").to_pylist(), strict=True))
        else:
            table = pa.Table.from_pylist([{**row, "chunks_version": chunks_version} for row in rows], schema=SOURCES_SCHEMA)
            keys = [(str(row["tenant"]), str(row["doc_id"])) for row in rows]
        merge = self._table.merge_insert(list(DOCUMENT_KEY)).when_matched_update_all(
            where="source.chunks_version > target.chunks_version"
        )
        if insert:
            merge = merge.when_not_matched_insert_all()
        # A replay after a conflict re-checks the stamp against the newer version.
        before = self._table.version
        merged = retrying_conflicts(lambda: merge.execute(table), what="recording sources")
        if getattr(merged, "version", None) != before + 1:  # another commit came between: two may have inserted one document
            self._drop_superseded(keys)

    def _drop_superseded(self, keys: Sequence[DocumentKey]) -> None:
        """Delete every record of ``keys`` stamped before another record of the same document.
        Two writers recording a document that has none both insert (its two-column key cannot be
        the table's primary key, so Lance does not see them collide); the later of them, reading
        after its own commit, sees both, and only the latest record stays. A writer whose commit
        came right after the version it began from cannot be that later one: ``record`` skips
        this read for it (10 s of a 1M-row import)."""
        latest: dict[DocumentKey, int] = {}
        stale: set[DocumentKey] = set()
        for row in documents_rows(self._table, keys, ["tenant", "doc_id", "chunks_version"]):
            key, stamp = (row["tenant"], row["doc_id"]), int(row["chunks_version"])
            if key in latest:
                stale.add(key)
            latest[key] = max(stamp, latest.get(key, stamp))
        for key in sorted(stale):
            where = f"({sql_documents([key])}) AND chunks_version < {latest[key]}"
            retrying_conflicts(lambda w=where: self._table.delete(w), what="deleting a superseded source record")

    def forget(self, document: DocumentKey, *, chunks_version: int) -> None:
        """Delete a document's record, unless a commit later than ``chunks_version`` (the
        erasure's) wrote it again."""
        where = f"({sql_documents([document])}) AND chunks_version <= {int(chunks_version)}"
        retrying_conflicts(lambda: self._table.delete(where), what="deleting a source")
