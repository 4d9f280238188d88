"""The warehouse's tables and the typed operations on them: the one object that owns storage.

Nothing outside ``state`` holds a Lance table: callers ask for rows, counts, nearest rows under a
filter, and conditional writes, and every failure to read or write the files leaves as a
``WarehouseError`` (``tables.names_storage_failures``).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import WarehouseError
from ..governance.sql import sql_documents, sql_in_list
from ..governance.tags import GovernanceTags
from ..stages import work
from .api_keys import ApiKeysTable
from .audit_journal import ReceiptJournal
from .audit_table import AuditTable
from .commit_retry import SnapshotPurged, is_commit_conflict, is_missing_file, retrying_conflicts
from .directory import DirectoryTable
from .files import PURGE_MARKS, RESIDENT_INDEX, WarehouseFiles, warehouse_files
from .freshness import SingleFlight, Versions
from .history import EmptiedMark, drop_superseded_content, prune_records, versions_left
from .indexing import (
    VECTOR_INDEX_MIN_ROWS,
    IndexReport,
    compact,
    drop_text_index,
    ensure_scalar_indexes,
    ensure_vector_index,
    has_vector_index,
)
from .lineage_spool import TableSpool
from .schema import (
    API_KEYS,
    AUDIT,
    CHUNKS,
    CLAUSES,
    CLAUSES_SCHEMA,
    DIRECTORY,
    LABELS,
    LABELS_SCHEMA,
    POLICIES,
    POLICIES_SCHEMA,
    SOURCES,
    SOURCES_SCHEMA,
    TAG_COLUMNS,
    chunks_schema,
)
from .snapshot import ChunksSnapshot, ChunkWrite
from .tables import connect, damaged_files, declare_primary_key, local_path, names_storage_failures, open_table

T = TypeVar("T")
DOCUMENT_KEY = ("tenant", "doc_id")
EMBEDDING_MODEL_KEY = b"ragwarden:embedding_model"
DIRECTORY_KEY = b"ragwarden:directory"
IN_LIST_MAX_IDS = 2_000
"""Rows read by id with an IN list up to this many ids; past it, every admitted row is read once
and filtered (a filter of thousands of literals costs more than the scan)."""
DocumentKey = tuple[str, str]
"""(tenant, doc id): a document id names a document only within its tenant, so one tenant's ids
tell nothing of another's (two tenants may each hold a document ``report-1``)."""


@dataclass(frozen=True, kw_only=True)
class SourceState:
    """What the warehouse holds of one source document."""

    doc_id: str
    tenant: str
    doc_version: str
    tags_fingerprint: str
    uri: str | None
    metadata: str | None


_PINNED: ContextVar[tuple[int, Versions] | None] = ContextVar("ragwarden_pinned_versions", default=None)
"""The versions one request reads at (``Store.pinned``), with the id of the store they belong to."""


def _registry_version(clauses: int, labels: int) -> str:
    return f"{clauses}.{labels}"


@dataclass(frozen=True, kw_only=True)
class Registries:
    """What a search compiles and checks against: the clause and label registries' version
    (``Store.registry_version``) and the clause registry at it."""

    version: str
    clauses: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True, kw_only=True)
class InstalledPolicy:
    """One installed policy as the ``policies`` table holds it: its commit order, version and text."""

    seq: int
    version: str
    source: str | None
    text: str


class PolicyText(Protocol):
    """A policy as the ``policies`` table stores it (``governance.policy.Policy`` is one)."""

    @property
    def version(self) -> str: ...
    @property
    def source(self) -> str | None: ...
    @property
    def stored_text(self) -> str: ...


@names_storage_failures
class Store:
    """The warehouse's tables (``chunks``, ``sources``, ``acl_clauses``, ``labels``, ``policies``,
    ``audit``, ``api_keys``, ``directory``) behind typed operations; the one object that owns storage."""

    def __init__(self, uri: str, *, dimension: int, storage_options: Mapping[str, str] | None = None) -> None:
        self.uri = uri
        self.dimension = dimension
        self.storage_options: Mapping[str, str] = dict(storage_options or {})
        self._db = connect(uri, storage_options)
        self._audit: AuditTable | None = None
        self._api_keys: ApiKeysTable | None = None
        self._refuse_missing_tables()
        self._upgrade_tables()
        self._sources = self._table(SOURCES, SOURCES_SCHEMA)
        self._clauses = self._table(CLAUSES, CLAUSES_SCHEMA)
        self._policies = self._table(POLICIES, POLICIES_SCHEMA)
        self._chunks = self._table(CHUNKS, chunks_schema(dimension))  # last: its presence marks a complete warehouse
        for table, key in ((self._chunks, "chunk_id"), (self._policies, "seq")):
            declare_primary_key(table, key)
        self._versions = SingleFlight(self._read_versions)
        self._registries_seen: tuple[int, int, int] | None = None  # (chunks, clauses, labels) versions
        self._version_pool: tuple[int, ThreadPoolExecutor] | None = None
        self._clause_cache: tuple[int, dict[str, tuple[str, ...]]] = (-1, {})
        self._label_cache: tuple[int, frozenset[str]] = (-1, frozenset())
        self._lock = threading.Lock()
        present = set(self._db.list_tables().tables)
        backfill = LABELS not in present
        self._labels = self._table(LABELS, LABELS_SCHEMA)
        self._directory = self._open_directory(had_one=DIRECTORY in present)  # every freshness check reads its version
        if backfill:
            self.register_labels(self._labels_in_rows())

    def _open_directory(self, *, had_one: bool) -> DirectoryTable:
        """The ``directory`` table. Once made, its making is recorded on ``policies``: a directory
        that has gone is then an error naming it, never an empty one in its place (which would lift
        every deactivation the identity provider made)."""
        recorded = (self._policies.schema.metadata or {}).get(DIRECTORY_KEY)
        if recorded and not had_one:
            raise WarehouseError(
                f"warehouse {self.uri!r}: table {DIRECTORY!r} is missing from a warehouse that had one; restore "
                f"{DIRECTORY}.lance from a backup (it is not recreated empty: its deactivations would be lost)"
            )
        directory = DirectoryTable(self._db)
        if not recorded:
            retrying_conflicts(
                lambda: self._policies.to_lance().update_schema_metadata({DIRECTORY_KEY.decode(): "1"}),
                what="recording the directory",
            )
            self._policies.checkout_latest()
        return directory

    def _table(self, name: str, schema: pa.Schema) -> Any:
        return open_table(self._db, name, schema)

    def damaged_files(self) -> list[str]:
        """Data files a table's current version names that are missing or not the size it recorded
        (local warehouses; for diagnosis after a failed read, so it never raises)."""
        tables = {CHUNKS: self._chunks, SOURCES: self._sources, CLAUSES: self._clauses, POLICIES: self._policies,
                  LABELS: self._labels}  # fmt: skip
        logs = [table.damaged_files() for table in (self._audit, self._api_keys) if table is not None]
        return damaged_files(self.local_path, tables) + [path for found in logs for path in found]

    def audit_table(self, key_check: str) -> AuditTable:
        """The receipts' table, created recording ``key_check`` if absent (``governance.audit.AuditLog``)."""
        if self._audit is None:
            self._audit = AuditTable(self._db, key_check=key_check, journal=self._journal())
        return self._audit

    def _journal(self) -> ReceiptJournal | None:
        return ReceiptJournal.of(self.uri, self.storage_options)

    @property
    def api_keys(self) -> ApiKeysTable:
        """The API keys' table (opened on first use: a warehouse without keys needs none)."""
        if self._api_keys is None:
            self._api_keys = ApiKeysTable(self._db)
        return self._api_keys

    def _upgrade_tables(self) -> None:
        """Bring tables written by an earlier release to the current schema, in place: ``sources``
        gains its ``chunks_version`` stamp (0: older than any commit to come), ``chunks`` its
        ``metadata`` (each chunk its source record's, see ``_backfill_metadata``), and
        ``policies`` its commit order ``seq`` (the installs so far numbered by their install time,
        the only order they recorded)."""
        present = set(self._db.list_tables().tables)
        if CHUNKS in present:
            chunks = self._db.open_table(CHUNKS)
            if "metadata" not in chunks.schema.names:
                field = chunks_schema(self.dimension).field("metadata")
                retrying_conflicts(lambda: chunks.add_columns(field), what="upgrading chunks")
                if SOURCES in present:
                    self._backfill_metadata(chunks, self._db.open_table(SOURCES))
        if SOURCES in present:
            sources = self._db.open_table(SOURCES)
            if "chunks_version" not in sources.schema.names:
                retrying_conflicts(
                    lambda: sources.add_columns({"chunks_version": "CAST(0 AS BIGINT)"}), what="upgrading sources"
                )
        if POLICIES in present:
            policies = self._db.open_table(POLICIES)
            if "seq" not in policies.schema.names:
                rows = policies.to_arrow().sort_by([("installed_at", "ascending")]).to_pylist()
                numbered = [{**row, "seq": seq} for seq, row in enumerate(rows, start=1)]
                self._db.create_table(POLICIES, pa.Table.from_pylist(numbered, schema=POLICIES_SCHEMA), mode="overwrite")

    def _backfill_metadata(self, chunks: Any, sources: Any) -> None:
        """Give the chunks of an upgraded warehouse their document's metadata, as its source
        record kept it (a re-ingest would find the document unchanged and never write it)."""
        if "metadata" not in sources.schema.names:
            return
        kept = sources.to_arrow().select(["tenant", "doc_id", "metadata"])
        kept = kept.filter(pc.and_(pc.is_valid(kept.column("metadata")), pc.not_equal(kept.column("metadata"), "{}")))
        if not kept.num_rows:
            return
        rows = chunks.to_lance().to_table(columns=["chunk_id", "tenant", "doc_id"], filter="kind = 'chunk'")
        joined = rows.join(kept, keys=["tenant", "doc_id"], join_type="inner")
        if not joined.num_rows:
            return
        schema = chunks_schema(self.dimension)
        table = pa.table({"chunk_id": joined.column("chunk_id"), "metadata": joined.column("metadata")},
                         schema=pa.schema([schema.field("chunk_id"), schema.field("metadata")]))  # fmt: skip
        retrying_conflicts(
            lambda: chunks.merge_insert("chunk_id").when_matched_update_all().execute(table), what="upgrading chunks"
        )

    def _refuse_missing_tables(self) -> None:
        """A table of a warehouse in use that has gone is an error naming it, never a fresh empty
        table in its place (which would lose its rows, or an ACL registry, in silence)."""
        present = set(self._db.list_tables().tables)
        core = (SOURCES, CLAUSES, POLICIES)
        if CHUNKS in present:
            missing = [name for name in core if name not in present]
        else:
            missing = [CHUNKS] if any(name in present and self._db.open_table(name).count_rows() for name in core) else []
        if missing:
            raise WarehouseError(
                f"warehouse {self.uri!r}: table {missing[0]!r} is missing from a warehouse in use; "
                f"restore {missing[0]}.lance from a backup (it is not recreated empty)"
            )

    # -- freshness ---------------------------------------------------------------------------

    def versions(self) -> Versions:
        """The latest version of every table a read depends on, from one check that began after
        this call did (shared by the calls waiting for it: ``freshness.SingleFlight``)."""
        return self._versions.get()

    def _read_versions(self) -> Versions:
        if self.local_path is not None:  # a local read is CPU, not waiting: threads would not help
            chunks, policies = int(self._chunks.version), int(self._policies.version)
            # Registries matter only for rows that carry a new clause or label, and a writer registers
            # those before it commits the rows: while ``chunks`` has not moved, the registries read at
            # its version serve (read after ``chunks``, they include every registration before it).
            seen = self._registries_seen
            if seen is not None and seen[0] == chunks:
                clauses, labels = seen[1], seen[2]
            else:
                clauses, labels = int(self._clauses.version), int(self._labels.version)
                self._registries_seen = (chunks, clauses, labels)
            return Versions(chunks=chunks, policies=policies, clauses=clauses, labels=labels,
                            directory=self._directory.version)  # fmt: skip
        others = (self._policies, self._clauses, self._labels, self._directory)
        if self._version_pool is None or self._version_pool[0] != os.getpid():  # a forked child needs its own threads
            self._version_pool = (os.getpid(), ThreadPoolExecutor(max_workers=len(others), thread_name_prefix="versions"))
        pending = [self._version_pool[1].submit(lambda table=table: int(table.version)) for table in others]
        chunks = int(self._chunks.version)  # object storage: five round trips at once, about one's time
        policies, clauses, labels, directory = (future.result() for future in pending)
        return Versions(chunks=chunks, policies=policies, clauses=clauses, labels=labels, directory=directory)

    @contextmanager
    def pinned(self) -> Iterator[Versions]:
        """Hold one freshness check (``versions()``) for a read operation: every version asked for
        inside answers from it. Never around a write, which must see its own commits."""
        held = _PINNED.get()
        if held is not None and held[0] == id(self):
            yield held[1]
            return
        versions = self.versions()
        token = _PINNED.set((id(self), versions))
        try:
            yield versions
        finally:
            _PINNED.reset(token)

    def _pin(self) -> Versions | None:
        held = _PINNED.get()
        return held[1] if held is not None and held[0] == id(self) else None

    @property
    def directory(self) -> DirectoryTable:
        """The users and groups provisioned over SCIM (``state.directory``)."""
        return self._directory

    @property
    def directory_version(self) -> int:
        """The ``directory`` table's version: the request's freshness check's, inside ``pinned``."""
        pin = self._pin()
        return pin.directory if pin is not None else self._directory.version

    def _clauses_version(self) -> int:
        pin = self._pin()
        return pin.clauses if pin is not None else int(self._clauses.version)

    def _labels_version(self) -> int:
        pin = self._pin()
        return pin.labels if pin is not None else int(self._labels.version)

    # -- ACL clause registry ---------------------------------------------------------------

    def clause_registry(self) -> dict[str, tuple[str, ...]]:
        """Clause token -> principals, re-read only when the registry has a new version."""
        return self._clauses_at(self._clauses_version())

    def registries(self) -> Registries:
        """The registries' version and the clause registry, read once for a whole search."""
        clauses, labels = self._clauses_version(), self._labels_version()
        return Registries(version=_registry_version(clauses, labels), clauses=self._clauses_at(clauses))

    def _clauses_at(self, version: int) -> dict[str, tuple[str, ...]]:
        with self._lock:
            if self._clause_cache[0] == version:
                return self._clause_cache[1]
        rows = self._clauses.to_arrow().to_pylist()
        registry = {row["token"]: tuple(row["principals"]) for row in rows}
        with self._lock:
            self._clause_cache = (version, registry)
        return registry

    def register_clauses(self, clauses: Mapping[str, Iterable[str]]) -> None:
        """Record new clause tokens; existing ones are left as they are (tokens are content hashes)."""
        known = self.clause_registry()
        new = [{"token": t, "principals": sorted(p)} for t, p in clauses.items() if t not in known]
        if new:
            rows = pa.Table.from_pylist(new, schema=CLAUSES_SCHEMA)
            merge = self._clauses.merge_insert("token").when_not_matched_insert_all()
            retrying_conflicts(lambda: merge.execute(rows), what="registering ACL clauses")

    def label_registry(self) -> frozenset[str]:
        """Every label a row has carried, re-read only when the registry has a new version."""
        version = self._labels_version()
        with self._lock:
            if self._label_cache[0] == version:
                return self._label_cache[1]
        labels = frozenset(self._labels.to_arrow().column("label").to_pylist())
        with self._lock:
            self._label_cache = (version, labels)
        return labels

    def register_labels(self, labels: Iterable[str]) -> None:
        """Record labels before any row carrying them is written, so a filter can name them."""
        new = sorted(set(labels) - self.label_registry())
        if new:
            rows = pa.Table.from_pydict({"label": new}, schema=LABELS_SCHEMA)
            merge = self._labels.merge_insert("label").when_not_matched_insert_all()
            retrying_conflicts(lambda: merge.execute(rows), what="registering labels")

    def registry_version(self) -> str:
        """Changes whenever a clause token or a label is registered (part of every filter cache key)."""
        return _registry_version(self._clauses_version(), self._labels_version())

    def _labels_in_rows(self) -> set[str]:
        """Labels already on rows of a warehouse written before the label registry existed."""
        if self._chunks.count_rows() == 0:
            return set()
        column = self._chunks.to_lance().to_table(columns=["labels"]).column("labels")
        return {label for label in pc.list_flatten(column).to_pylist() if label is not None}

    # -- documents ------------------------------------------------------------------------

    @staticmethod
    def _rows_where_in(table: Any, column: str, values: Iterable[str], columns: list[str]) -> list[dict[str, Any]]:
        """Rows whose ``column`` is one of ``values`` (quoted as data), with ``columns`` only.

        A value holding a NUL character cannot be an id (nor an SQL literal): it matches no row."""
        wanted = sorted(v for v in set(values) if "\x00" not in v)
        if not wanted:
            return []
        return table.search().where(f"{column} IN {sql_in_list(wanted)}").select(columns).limit(None).to_list()

    @staticmethod
    def _documents_rows(table: Any, keys: Iterable[DocumentKey], columns: list[str]) -> list[dict[str, Any]]:
        """Rows of the documents ``keys`` (quoted as data); a key holding a NUL matches nothing."""
        wanted = {(t, d) for t, d in keys if "\x00" not in t and "\x00" not in d}
        if not wanted:
            return []
        return table.search().where(sql_documents(wanted)).select(columns).limit(None).to_list()

    def source_states(self, keys: Iterable[DocumentKey]) -> dict[DocumentKey, SourceState]:
        """The stored state of each document in ``keys`` that exists."""
        fields = list(SourceState.__dataclass_fields__)
        rows = self._documents_rows(self._sources, keys, fields)
        return {(row["tenant"], row["doc_id"]): SourceState(**{k: row[k] for k in fields}) for row in rows}

    def document_tenants(self, doc_id: str) -> list[str]:
        """The tenants holding a document called ``doc_id`` (a source record or source chunks),
        for an operator who names no tenant."""
        sources = self._rows_where_in(self._sources, "doc_id", [doc_id], ["tenant"])
        chunks = self._rows_where_in(self._chunks, "doc_id", [doc_id], ["tenant", "kind"])
        return sorted({r["tenant"] for r in sources} | {r["tenant"] for r in chunks if r["kind"] == "chunk"})

    def tenants(self) -> list[str]:
        """Every tenant the warehouse holds a source record of."""
        found = self._sources.to_lance().to_table(columns=["tenant"])
        return sorted(set(found.column("tenant").to_pylist()))

    def source_tags(self, keys: Iterable[DocumentKey]) -> list[GovernanceTags]:
        """The current tags of source documents (for lineage summaries)."""
        rows = self._documents_rows(self._sources, keys, ["doc_id", *TAG_COLUMNS])
        registry = self.clause_registry()
        return [GovernanceTags.from_row(row, registry) for row in rows]

    @property
    def local_path(self) -> Path | None:
        """The warehouse folder, when the warehouse is on the local file system."""
        return local_path(self.uri)

    # -- reads for search -----------------------------------------------------------------

    @property
    def chunks_version(self) -> int:
        """The latest committed version of ``chunks`` (every read sees the latest commit), or the
        one the request's freshness check read (``pinned``)."""
        pin = self._pin()
        return pin.chunks if pin is not None else int(self._chunks.version)

    def latest_chunks_version(self) -> int:
        """The latest committed version of ``chunks``, read now even inside ``pinned``."""
        return int(self._chunks.version)

    @property
    def embedding_model(self) -> str | None:
        """The model whose vectors this warehouse holds, as recorded (None: not yet recorded)."""
        recorded = (self._chunks.schema.metadata or {}).get(EMBEDDING_MODEL_KEY)
        return recorded.decode("utf-8") if recorded else None

    def record_embedding_model(self, model: str) -> None:
        """Record ``model`` as the model of this warehouse's vectors (once: a warehouse of an
        earlier release gains the record at its next open)."""
        retrying_conflicts(
            lambda: self._chunks.to_lance().update_schema_metadata({EMBEDDING_MODEL_KEY.decode(): model}),
            what="recording the embedding model",
        )
        self._chunks.checkout_latest()

    @property
    def chunks_schema(self) -> pa.Schema:
        """The ``chunks`` schema rows are written in (``metadata`` as JSON text, which Lance stores
        in its binary JSON form; a ``large_binary`` of text would be stored unconverted)."""
        return chunks_schema(self.dimension)

    @property
    def policies_version(self) -> int:
        """Changes whenever a policy is installed (the pinned one inside ``pinned``)."""
        pin = self._pin()
        return pin.policies if pin is not None else int(self._policies.version)

    def count(self, where: str | None = None) -> int:
        """Rows of ``chunks`` that ``where`` admits (every row for None)."""
        return int(self._chunks.count_rows(where or None))

    def has_vector_index(self) -> bool:
        return has_vector_index(self._chunks)

    def nearest(
        self,
        vector: Sequence[float] | Any,
        *,
        where: str | None,
        limit: int,
        columns: Sequence[str],
        exact: bool,
        nprobes: int = 0,
        refine_factor: int = 1,
    ) -> list[dict[str, Any]]:
        """The ``limit`` rows nearest ``vector`` (cosine) among those ``where`` admits (a prefilter:
        ranking happens over admitted rows only), with ``columns`` and ``_distance``. ``exact``
        scans them all; else the vector index is searched, probing ``nprobes`` partitions and
        re-ranking ``refine_factor`` times ``limit`` candidates on full vectors. ``where`` None:
        every row (benchmarks' ungoverned baseline)."""
        builder = self._chunks.search(vector, vector_column_name="vector").distance_type("cosine")
        if where is not None:
            builder = builder.where(where, prefilter=True)
        builder = builder.select([*columns, "_distance"]).limit(limit)
        if exact:
            builder = builder.bypass_vector_index()
        else:
            builder = builder.nprobes(nprobes).refine_factor(refine_factor)
        found = builder.to_list()
        work("rows_read", len(found))
        return found

    def read_at(self, version: int | None, where: str, columns: Sequence[str]) -> pa.Table | None:
        """The rows ``where`` admits with ``columns`` at ``version`` (None: the latest), even when
        the table has moved on since; None if that version's files are gone (a purge removed them).
        Why: a search answers at the version its request checked, and one ingest is several commits
        (rows, indexes, compaction) in a second; reading only the latest made every search in flight
        across them fall back to scanning through Lance at once (stalls of a second at 64 clients)."""
        dataset = self._chunks.to_lance()
        if version is not None and dataset.version != version:
            try:
                dataset = dataset.checkout_version(version)
                table = dataset.to_table(columns=list(columns), filter=where)
            except (OSError, pa.ArrowException) as exc:  # its manifest, or the files it names (kept a while longer)
                if is_missing_file(exc):
                    return None
                raise
        else:
            table = dataset.to_table(columns=list(columns), filter=where)
        work("rows_read", table.num_rows)
        return table

    def read_rows_at(self, version: int, where: str, chunk_ids: Sequence[str], columns: Sequence[str]) -> pa.Table | None:
        """The rows of ``chunk_ids`` that ``where`` admits at ``version`` (None if that version is
        gone, ``read_at``): by an IN list, or past ``IN_LIST_MAX_IDS`` ids by reading every admitted
        row once."""
        if not chunk_ids:  # no rows, with the columns' types, and the version still checked
            return self.read_at(version, f"({where}) AND FALSE", columns)
        if len(chunk_ids) <= IN_LIST_MAX_IDS:
            return self.read_at(version, f"({where}) AND chunk_id IN {sql_in_list(chunk_ids)}", columns)
        table = self.read_at(version, where, columns)
        return None if table is None else table.filter(pc.is_in(table.column("chunk_id"), value_set=pa.array(chunk_ids)))

    def read_latest(self, columns: Sequence[str]) -> tuple[int, pa.Table]:
        """Every row's ``columns`` at the latest version, and that version (the serving index's
        source)."""
        dataset = self._chunks.to_lance()
        return dataset.version, dataset.to_table(columns=list(columns))

    def lineage_spool(self) -> TableSpool:
        """The warehouse's own lineage spool (its ``lineage_spool`` table, made on first use)."""
        return TableSpool(self._db, self.uri)

    def files(self, folder: str) -> WarehouseFiles | None:
        """Plain files of ``folder`` in the warehouse (None on a store with none: not a folder nor S3)."""
        return warehouse_files(self.uri, self.storage_options, folder)

    def load_rows(self, rows: pa.Table) -> int:
        """Append whole ``chunks`` rows as they are, unplanned (synthetic benchmark worlds, whose tags
        were computed with their clause tokens registered); returns the new version."""
        self._chunks.add(rows.cast(self.chunks_schema))
        return self.chunks_version

    def replace_columns(self, rows: pa.Table) -> int:
        """Overwrite, by ``chunk_id``, the columns ``rows`` holds (a benchmark giving a world texts);
        returns the new version."""
        retrying_conflicts(
            lambda: self._chunks.merge_insert("chunk_id").when_matched_update_all().execute(rows),
            what="replacing columns",
        )
        return self.chunks_version

    def rows_where(self, where: str, columns: Sequence[str]) -> list[dict[str, Any]]:
        """Every row of ``chunks`` that ``where`` admits, with ``columns``."""
        return self._chunks.search().where(where).select(list(columns)).limit(None).to_list()

    def vectors_of(self, chunk_ids: Iterable[str]) -> dict[str, list[float]]:
        """Stored vectors of chunks that already exist, so unchanged text is never re-embedded."""
        rows = self._rows_where_in(self._chunks, "chunk_id", chunk_ids, ["chunk_id", "vector"])
        return {row["chunk_id"]: row["vector"] for row in rows}

    def write_chunks(self, plan: Callable[[ChunksSnapshot], tuple[ChunkWrite, T]], *, what: str) -> tuple[T, int]:
        """Plan a write from a snapshot of ``chunks`` and commit it on that snapshot, planning again
        from a fresh one whenever a concurrent commit touched a row the plan wrote, read or deleted
        (see ``snapshot``). Returns the plan's result and the version the commit made."""

        def attempt() -> tuple[T, int]:
            snapshot = self.snapshot()
            try:
                write, result = plan(snapshot)
                self.register_labels(label for row in write.rows for label in row["labels"] if label)
                return result, snapshot.commit(write)
            except Exception as exc:
                if is_missing_file(exc) and not is_commit_conflict(exc) and self._chunks.version != snapshot.version:
                    raise SnapshotPurged(what, snapshot.version) from exc  # a forget's purge: plan again
                raise

        return retrying_conflicts(attempt, what=what)

    def record_sources(self, rows: Sequence[Mapping[str, Any]], *, chunks_version: int) -> None:
        """Write the source records of documents whose chunks were committed at ``chunks_version``
        (whole records of an ingest, or the tag columns of a sync). A record already stamped by a
        later commit is left as it is, so writers finishing out of order leave the latest state."""
        if not rows:
            return
        names = [name for name in SOURCES_SCHEMA.names if name in rows[0] or name == "chunks_version"]
        schema = pa.schema([SOURCES_SCHEMA.field(name) for name in names])
        table = pa.Table.from_pylist([{**row, "chunks_version": chunks_version} for row in rows], schema=schema)
        merge = self._sources.merge_insert(list(DOCUMENT_KEY)).when_matched_update_all(
            where="source.chunks_version > target.chunks_version"
        )
        if len(names) == len(SOURCES_SCHEMA.names):
            merge = merge.when_not_matched_insert_all()
        # A replay after a conflict re-checks the stamp against the newer version.
        retrying_conflicts(lambda: merge.execute(table), what="recording sources")
        self._drop_superseded_records([(str(row["tenant"]), str(row["doc_id"])) for row in rows])

    def _drop_superseded_records(self, keys: Sequence[DocumentKey]) -> None:
        """Delete every record of ``keys`` stamped before another record of the same document.
        Two writers recording a document that has none both insert (its two-column key cannot be
        the table's primary key, so Lance does not see them collide); the later of them, reading
        after its own commit, sees both, and only the latest record stays."""
        latest: dict[DocumentKey, int] = {}
        stale: set[DocumentKey] = set()
        for row in self._documents_rows(self._sources, keys, ["tenant", "doc_id", "chunks_version"]):
            key, stamp = (row["tenant"], row["doc_id"]), int(row["chunks_version"])
            if key in latest:
                stale.add(key)
            latest[key] = max(stamp, latest.get(key, stamp))
        for key in sorted(stale):
            where = f"({sql_documents([key])}) AND chunks_version < {latest[key]}"
            retrying_conflicts(lambda w=where: self._sources.delete(w), what="deleting a superseded source record")

    def forget_source(self, document: DocumentKey, *, chunks_version: int) -> None:
        """Delete a document's source record, unless a commit later than ``chunks_version`` (the
        erasure's) wrote it again."""
        where = f"({sql_documents([document])}) AND chunks_version <= {int(chunks_version)}"
        retrying_conflicts(lambda: self._sources.delete(where), what="deleting a source")

    @property
    def _columns_but_vector(self) -> list[str]:
        return [name for name in self._chunks.schema.names if name != "vector"]

    def rows(self, chunk_ids: Iterable[str], columns: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Rows by chunk id (all columns unless ``columns``); ids not present are simply absent."""
        wanted = columns or self._columns_but_vector
        found = {r["chunk_id"]: r for r in self._rows_where_in(self._chunks, "chunk_id", chunk_ids, wanted)}
        work("rows_read", len(found))
        return found

    def chunk_ids_of(self, doc_id: str, tenant: str | None = None) -> list[str]:
        """The source chunks of document ``doc_id`` in ``tenant`` (None: in any tenant)."""
        if tenant is not None:
            return self.chunk_ids_of_documents([(tenant, doc_id)])
        rows = self._rows_where_in(self._chunks, "doc_id", [doc_id], ["chunk_id", "kind"])
        return sorted(r["chunk_id"] for r in rows if r["kind"] == "chunk")

    def chunk_ids_of_documents(self, keys: Iterable[DocumentKey]) -> list[str]:
        """The source chunks of the documents ``keys``, at the latest version."""
        return self.snapshot().chunk_ids_of_documents(keys)

    def derived_from(self, chunk_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Every row derived, directly or through other derived rows, from ``chunk_ids``, at the
        latest version (without vectors)."""
        return self.snapshot().derived_from(chunk_ids, self._columns_but_vector)

    def snapshot(self, version: int | None = None) -> ChunksSnapshot:
        """The ``chunks`` table pinned at ``version`` (None: its latest)."""
        dataset = self._chunks.to_lance()
        return ChunksSnapshot(dataset if version is None else dataset.checkout_version(version))

    def delete(self, chunk_ids: Iterable[str], document: DocumentKey) -> int:
        """Delete rows, then their source record: no row ever outlives the record of where it came
        from. Returns the ``chunks`` version of the deletion."""
        doomed = sorted(set(chunk_ids))
        _, version = self.write_chunks(lambda _: (ChunkWrite(delete=doomed), None), what="deleting rows")
        self.forget_source(document, chunks_version=version)
        return version

    def purge_history(self) -> dict[str, int]:
        """Physically remove deleted rows: rewrite files holding them, rebuild the vector index and
        drop a text index an older warehouse built (both hold copies of what rows said), remove
        every older version's files and the serving index's artifacts (replicas rebuild them), so
        erased text and vectors are in no file under the warehouse. Returns, per table, how many
        older versions it pruned or emptied.

        The older versions' commit records stay until ``history.RECORDS_KEPT`` has passed: a
        writer that planned before the purge is still checked against every commit made since.
        Each step is retried when it loses a commit race (each converges).
        Files no version ever committed are left to Lance's own week-long grace: they may belong
        to another writer's commit in progress, and deleting those would leave its version naming
        missing files. On a store other than a local folder or S3 (whose files cannot be listed
        here) the records go at once with the files, and a writer that planned before the purge
        may miss a conflict."""
        removed: dict[str, int] = {}
        for name, table in ((CHUNKS, self._chunks), (SOURCES, self._sources)):
            retrying_conflicts(
                lambda t=table: t.to_lance().optimize.compact_files(materialize_deletions_threshold=0.0),
                what=f"rewriting {name} without erased rows",
            )
            table.checkout_latest()
            if name == CHUNKS:
                retrying_conflicts(lambda t=table: drop_text_index(t), what="dropping the text index")
                if has_vector_index(table):
                    retrying_conflicts(
                        lambda t=table: ensure_vector_index(t, rows=t.count_rows(), rebuild=True),
                        what="rebuilding the vector index",
                    )
            latest, folder = table.to_lance(), self._table_folder(name)
            if folder is None:  # a store whose files cannot be listed: records and files go at once
                removed[name] = prune_records(latest, older_than=timedelta(0))
            else:
                removed[name] = prune_records(latest) + drop_superseded_content(latest, *folder)
        artifacts = self.files(RESIDENT_INDEX)  # serving-index artifacts hold every row's vector
        for name in artifacts.names() if artifacts is not None else []:
            artifacts.remove(name)
        return removed

    def versions_left(self) -> dict[str, int]:
        """How many versions of each table that holds row content still hold rows the latest does
        not show, the latest included (after a purge: one each, unless writers committed since)."""
        left: dict[str, int] = {}
        for name, table in ((CHUNKS, self._chunks), (SOURCES, self._sources)):
            folder = self._table_folder(name)
            latest = table.to_lance()
            left[name] = versions_left(latest, *folder) if folder is not None else len(latest.versions())
        return left

    def _table_folder(self, name: str) -> tuple[Callable[[str], WarehouseFiles], EmptiedMark] | None:
        """The folders under table ``name``'s own and the mark of its last purge, on a store whose
        files can be listed and removed."""
        marks = self.files(PURGE_MARKS)
        if marks is None:
            return None

        @functools.cache
        def folder(path: str) -> WarehouseFiles:
            files = warehouse_files(self.uri, self.storage_options, f"{name}.lance/{path}")
            assert files is not None  # the same store as the marks' folder
            return files

        return folder, EmptiedMark(marks, name)

    def row_tenant(self, chunk_id: str) -> str | None:
        """The tenant of a derived row (a summary, note or memory), or None if there is no such row."""
        row = self.rows([chunk_id], ["chunk_id", "tenant", "kind"]).get(chunk_id)
        return row["tenant"] if row is not None and row["kind"] != "chunk" else None

    def require_version(self, min_version: int | None) -> None:
        """Refuse to serve from a ``chunks`` table older than ``min_version``."""
        if min_version is None or self._chunks.version >= min_version:
            return
        self._chunks.checkout_latest()
        if self._chunks.version < min_version:
            raise WarehouseError(
                f"chunks table is at version {self._chunks.version}, older than the {min_version} asked for; retry shortly"
            )

    def optimize(
        self,
        *,
        rebuild_vector_index: bool = False,
        vector_index_min_rows: int = VECTOR_INDEX_MIN_ROWS,
        batched: bool = False,
    ) -> IndexReport:
        """Bring the indexes up to date after writes: new rows are folded into the indexes there
        are and the small fragments merged (``indexing.compact``; ``batched``, as ingest runs it:
        only once enough is due); then any missing index is built (the scalar indexes the compiled
        filter uses, the vector index once the table is big enough). Compacting first means a new
        index is built once over the merged fragments, not remapped after them. Rows not yet
        indexed are still searched."""
        started = time.perf_counter()
        self._tidy_logs()
        seconds: dict[str, float] = {"logs": time.perf_counter() - started}
        rows = self._chunks.count_rows()
        fragments_before = len(self._chunks.to_lance().get_fragments())
        if rows == 0:
            return IndexReport(rows=0, scalar_indexes=(), vector_index=None, fragments_before=fragments_before,
                               fragments_after=fragments_before, seconds=seconds)  # fmt: skip
        retrying_conflicts(lambda: drop_text_index(self._chunks), what="dropping the text index")
        retrying_conflicts(lambda: compact(self._chunks, batched=batched), what="compacting")
        seconds["compact"] = time.perf_counter() - started - sum(seconds.values())
        scalar = retrying_conflicts(lambda: ensure_scalar_indexes(self._chunks), what="building scalar indexes")
        seconds["scalar_indexes"] = time.perf_counter() - started - sum(seconds.values())
        vector = retrying_conflicts(
            lambda: ensure_vector_index(self._chunks, rows=rows, rebuild=rebuild_vector_index, min_rows=vector_index_min_rows),
            what="building the vector index",
        )
        seconds["vector_index"] = time.perf_counter() - started - sum(seconds.values())
        return IndexReport(
            rows=rows,
            scalar_indexes=scalar,
            vector_index=vector,
            fragments_before=fragments_before,
            fragments_after=len(self._chunks.to_lance().get_fragments()),
            seconds=seconds,
        )

    def _tidy_logs(self) -> None:
        """Merge the small files of the append-only tables (``audit``, ``api_keys``) and drop their
        versions older than ``tables.VERSIONS_KEPT``: neither ever deletes a row, so an old version
        holds nothing the latest does not (a reader still on one keeps its files for that long).
        The ``directory`` too (it deletes rows, but a version from before a deletion is of no use
        to any reader once older than that)."""
        present = set(self._db.list_tables().tables)
        if AUDIT in present:
            if self._audit is None:  # opened, never created (it is there): its key check is not needed
                self._audit = AuditTable(self._db, key_check="", journal=self._journal())
            retrying_conflicts(self._audit.compact, what="compacting the audit log")
        if API_KEYS in present:
            retrying_conflicts(self.api_keys.compact, what="compacting the API keys")
        retrying_conflicts(self._directory.compact, what="compacting the directory")

    # -- policies -------------------------------------------------------------------------

    def install_policy(self, policy: PolicyText) -> int:
        """Append ``policy`` as the newest installed one; returns its ``seq``. Two replicas installing
        at once cannot take one ``seq`` (it is the table's primary key): the later re-reads and
        takes the next, so commit order, not any clock, decides which is in force."""

        def attempt() -> int:
            dataset = self._policies.to_lance()
            seqs = dataset.to_table(columns=["seq"]).column("seq")
            seq = (pc.max(seqs).as_py() or 0) + 1
            row = {"seq": seq, "version": policy.version, "source": policy.source, "text": policy.stored_text,
                   "installed_at": datetime.now(timezone.utc)}  # fmt: skip
            merge = dataset.merge_insert("seq").when_not_matched_insert_all().use_index(False).conflict_retries(0)
            merge.execute(pa.Table.from_pylist([row], schema=POLICIES_SCHEMA))
            return seq

        return retrying_conflicts(attempt, what="installing a policy")

    def installed_policy(self) -> InstalledPolicy | None:
        """The latest install (the highest ``seq``), or None if the warehouse has none."""
        if self._policies.count_rows() == 0:
            return None
        row = self._policies.to_arrow().sort_by([("seq", "descending")]).slice(0, 1).to_pylist()[0]
        return InstalledPolicy(seq=row["seq"], version=row["version"], source=row["source"], text=row["text"])
