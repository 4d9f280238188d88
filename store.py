"""The state layer: the warehouse's LanceDB tables and the few operations on them.

Every process opens the warehouse with ``read_consistency_interval=0`` so each read sees the
latest commit: a replica never serves a revoked ACL from a stale handle.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa
from lancedb.index import FTS

from .errors import WarehouseError
from .governance.policy import Policy
from .governance.sql import sql_in_list, sql_list, sql_string
from .governance.tags import GovernanceTags
from .schema import (
    CHUNKS,
    CLAUSES,
    CLAUSES_SCHEMA,
    POLICIES,
    POLICIES_SCHEMA,
    SOURCES,
    SOURCES_SCHEMA,
    TAG_COLUMNS,
    chunks_schema,
)


@dataclass(frozen=True, kw_only=True)
class SourceState:
    """What the warehouse holds of one source document."""

    doc_id: str
    tenant: str
    doc_version: str
    tags_fingerprint: str


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def connect(uri: str) -> Any:
    """A LanceDB connection to the warehouse (a local folder is created) that sees every commit at once."""
    if _is_local(uri):
        Path(uri.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    try:
        return lancedb.connect(uri, read_consistency_interval=timedelta(0))
    except Exception as exc:  # lancedb raises plain exceptions for bad URIs
        raise WarehouseError(f"cannot open warehouse {uri!r}: {exc}") from exc


def open_table(db: Any, name: str, schema: pa.Schema) -> Any:
    """Table ``name`` of the warehouse, created empty if absent; refused if its schema differs."""
    try:
        table = db.create_table(name, schema=schema, exist_ok=True)
    except Exception as exc:
        raise WarehouseError(f"warehouse {db.uri!r}: table {name!r} cannot be opened: {exc}") from exc
    if not table.schema.equals(schema, check_metadata=False):
        raise WarehouseError(
            f"warehouse {db.uri!r}: table {name!r} has schema {table.schema}, expected {schema}; "
            "it was written by another version or another embedding model"
        )
    return table


class Store:
    """The warehouse's tables: ``chunks``, ``sources``, ``acl_clauses`` and ``policies``."""

    def __init__(self, uri: str, *, dimension: int) -> None:
        self.uri = uri
        self.db = connect(uri)
        self.chunks = self._table(CHUNKS, chunks_schema(dimension))
        self.sources = self._table(SOURCES, SOURCES_SCHEMA)
        self.clauses = self._table(CLAUSES, CLAUSES_SCHEMA)
        self.policies = self._table(POLICIES, POLICIES_SCHEMA)
        self._clause_cache: tuple[int, dict[str, tuple[str, ...]]] = (-1, {})
        self._lock = threading.Lock()

    def _table(self, name: str, schema: pa.Schema) -> Any:
        return open_table(self.db, name, schema)

    # -- ACL clause registry ---------------------------------------------------------------

    def clause_registry(self) -> dict[str, tuple[str, ...]]:
        """Clause token -> principals, re-read only when the registry has a new version."""
        version = self.clauses.version
        with self._lock:
            if self._clause_cache[0] == version:
                return self._clause_cache[1]
        rows = self.clauses.to_arrow().to_pylist()
        registry = {row["token"]: tuple(row["principals"]) for row in rows}
        with self._lock:
            self._clause_cache = (version, registry)
        return registry

    def register_clauses(self, clauses: Mapping[str, Iterable[str]]) -> None:
        """Record new clause tokens; existing ones are left as they are (tokens are content hashes)."""
        known = self.clause_registry()
        new = [{"token": t, "principals": sorted(p)} for t, p in clauses.items() if t not in known]
        if new:
            (
                self.clauses.merge_insert("token")
                .when_not_matched_insert_all()
                .execute(pa.Table.from_pylist(new, schema=CLAUSES_SCHEMA))
            )

    # -- documents ------------------------------------------------------------------------

    @staticmethod
    def _rows_where_in(table: Any, column: str, values: Iterable[str], columns: list[str]) -> list[dict[str, Any]]:
        """Rows whose ``column`` is one of ``values`` (quoted as data), with ``columns`` only.

        A value holding a NUL character cannot be an id (nor an SQL literal): it matches no row."""
        wanted = sorted(v for v in set(values) if "\x00" not in v)
        if not wanted:
            return []
        return table.search().where(f"{column} IN {sql_in_list(wanted)}").select(columns).limit(None).to_list()

    def source_states(self, doc_ids: Iterable[str]) -> dict[str, SourceState]:
        fields = list(SourceState.__dataclass_fields__)
        rows = self._rows_where_in(self.sources, "doc_id", doc_ids, fields)
        return {row["doc_id"]: SourceState(**{k: row[k] for k in fields}) for row in rows}

    def source_tags(self, doc_ids: Iterable[str]) -> list[GovernanceTags]:
        """The current tags of source documents (for lineage summaries)."""
        rows = self._rows_where_in(self.sources, "doc_id", doc_ids, ["doc_id", *TAG_COLUMNS])
        registry = self.clause_registry()
        return [GovernanceTags.from_row(row, registry) for row in rows]

    @property
    def local_path(self) -> Path | None:
        """The warehouse folder, when the warehouse is on the local file system."""
        return Path(self.uri.removeprefix("file://")) if _is_local(self.uri) else None

    def vectors_of(self, chunk_ids: Iterable[str]) -> dict[str, list[float]]:
        """Stored vectors of chunks that already exist, so unchanged text is never re-embedded."""
        rows = self._rows_where_in(self.chunks, "chunk_id", chunk_ids, ["chunk_id", "vector"])
        return {row["chunk_id"]: row["vector"] for row in rows}

    def replace_documents(
        self, doc_ids: list[str], chunk_rows: pa.Table, source_rows: pa.Table, *, orphans: Sequence[str] = ()
    ) -> None:
        """Make ``chunk_rows`` the only chunks of ``doc_ids``, in one commit.

        Old chunks of those documents are deleted in the same commit that adds the new ones,
        so a reader sees the old version or the new one, never both or neither. ``chunk_rows``
        may also carry re-tagged derived rows, and ``orphans`` derived rows to delete with them.
        """
        if doc_ids:
            gone = f"doc_id IN {sql_in_list(doc_ids)}"
            if orphans:
                gone += f" OR chunk_id IN {sql_in_list(orphans)}"
            (
                self.chunks.merge_insert("chunk_id")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .when_not_matched_by_source_delete(gone)
                .execute(chunk_rows)
            )
        if source_rows.num_rows:
            self.sources.merge_insert("doc_id").when_matched_update_all().when_not_matched_insert_all().execute(
                source_rows
            )

    @property
    def _columns_but_vector(self) -> list[str]:
        return [name for name in self.chunks.schema.names if name != "vector"]

    def rows(self, chunk_ids: Iterable[str], columns: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Rows by chunk id (all columns unless ``columns``); ids not present are simply absent."""
        wanted = columns or self._columns_but_vector
        return {r["chunk_id"]: r for r in self._rows_where_in(self.chunks, "chunk_id", chunk_ids, wanted)}

    def chunk_ids_of(self, doc_id: str) -> list[str]:
        return self.chunk_ids_of_documents([doc_id])

    def chunk_ids_of_documents(self, doc_ids: Iterable[str]) -> list[str]:
        rows = self._rows_where_in(self.chunks, "doc_id", doc_ids, ["chunk_id"])
        return sorted(r["chunk_id"] for r in rows)

    def derived_from(self, chunk_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Every row derived, directly or through other derived rows, from ``chunk_ids``."""
        found: dict[str, dict[str, Any]] = {}
        frontier = sorted(set(chunk_ids))
        columns = self._columns_but_vector
        while frontier:
            rows = (
                self.chunks.search()
                .where(f"array_has_any(parents, {sql_list(frontier)})")
                .select(columns)
                .limit(None)
                .to_list()
            )
            frontier = sorted({r["chunk_id"] for r in rows} - found.keys())
            found.update((r["chunk_id"], r) for r in rows)
        return found

    def add_rows(self, rows: list[dict[str, Any]]) -> None:
        """Insert new rows (a derived row); an id already present is left as it is."""
        table = pa.Table.from_pylist(rows, schema=self.chunks.schema)
        self.chunks.merge_insert("chunk_id").when_not_matched_insert_all().execute(table)

    def update_tags(
        self, rows: list[dict[str, Any]], sources: list[dict[str, Any]], *, delete: Sequence[str] = ()
    ) -> None:
        """Rewrite governance columns of existing rows, and delete ``delete``, in one commit;
        vectors and text untouched."""
        if rows or delete:
            columns = ["chunk_id", *TAG_COLUMNS]
            schema = pa.schema([self.chunks.schema.field(c) for c in columns])
            table = pa.Table.from_pylist([{c: r[c] for c in columns} for r in rows], schema=schema)
            merge = self.chunks.merge_insert("chunk_id").when_matched_update_all()
            if delete:
                merge = merge.when_not_matched_by_source_delete(f"chunk_id IN {sql_in_list(delete)}")
            merge.execute(table)
        if sources:
            columns = ["doc_id", "tags_fingerprint", *TAG_COLUMNS]
            schema = pa.schema([self.sources.schema.field(c) for c in columns])
            table = pa.Table.from_pylist([{c: r[c] for c in columns} for r in sources], schema=schema)
            self.sources.merge_insert("doc_id").when_matched_update_all().execute(table)

    def delete(self, chunk_ids: Iterable[str], doc_id: str) -> None:
        """Delete rows, then their source record: no row ever outlives the record of where it came from."""
        ids = sorted(set(chunk_ids))
        if ids:
            self.chunks.delete(f"chunk_id IN {sql_in_list(ids)}")
        self.sources.delete(f"doc_id = {sql_string(doc_id)}")

    def purge_history(self) -> dict[str, int]:
        """Physically remove deleted rows: rewrite files holding them, rebuild the text index,
        and drop every old table version, so erased text is in no file under the warehouse."""
        removed: dict[str, int] = {}
        for name, table in ((CHUNKS, self.chunks), (SOURCES, self.sources)):
            table.to_lance().optimize.compact_files(materialize_deletions_threshold=0.0)
            table.checkout_latest()
            if name == CHUNKS and any(index.index_type == "FTS" for index in table.list_indices()):
                table.create_index("text", config=FTS(), replace=True)
            stats = table.to_lance().cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
            removed[name] = int(stats.old_versions)
        return removed

    def require_version(self, min_version: int | None) -> None:
        """Refuse to serve from a ``chunks`` table older than ``min_version``."""
        if min_version is None or self.chunks.version >= min_version:
            return
        self.chunks.checkout_latest()
        if self.chunks.version < min_version:
            raise WarehouseError(
                f"chunks table is at version {self.chunks.version}, older than the {min_version} asked for; retry shortly"
            )

    def ensure_text_index(self) -> None:
        """Build the full-text index once; later rows are searched unindexed until optimized."""
        if self.chunks.count_rows() == 0:
            return
        if not any(index.index_type == "FTS" for index in self.chunks.list_indices()):
            self.chunks.create_index("text", config=FTS(), replace=True)
        else:
            self.chunks.optimize()

    # -- policies -------------------------------------------------------------------------

    def install_policy(self, policy: Policy) -> None:
        row = {
            "version": policy.version,
            "source": policy.source,
            "text": policy.source_text if policy.source_text is not None else policy.text,
            "installed_at": datetime.now(timezone.utc),
        }
        self.policies.add(pa.Table.from_pylist([row], schema=POLICIES_SCHEMA))

    def installed_policy(self) -> Policy | None:
        """The most recently installed policy, or None if the warehouse has none."""
        if self.policies.count_rows() == 0:
            return None
        rows = self.policies.to_arrow().sort_by([("installed_at", "descending")]).slice(0, 1).to_pylist()
        row = rows[0]
        return Policy.from_text(row["text"], source=f"{self.uri} (policy {row['version']})")
