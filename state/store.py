"""The warehouse: opening it, its format check, and one freshness check per request (``pinned``);
each table is reached through a door of its own.

``Store`` opens the tables, refuses a warehouse that lost one, brings an earlier release's tables to
the current schema, and hands out doors: ``chunks`` (``ChunkReads`` for retrieval, ``Chunks`` with
writes for ingest), ``sources``, ``registries`` (ACL clauses and labels), ``policies``,
``maintenance`` (optimize, purge, history, damage, over every table), and the audit log's, API
keys', directory's and lineage spool's tables. Nothing outside ``state`` holds a Lance table, and
every failure to read or write the files leaves as a ``WarehouseError``
(``tables.names_storage_failures``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import WarehouseError, WarehouseFormatError
from .api_keys import ApiKeysTable
from .audit_journal import ReceiptJournal
from .audit_table import AuditTable
from .chunks import ChunkReads, Chunks
from .commit_retry import retrying_conflicts
from .directory import DirectoryTable
from .erasures import Erasures
from .files import RESIDENT_INDEX, WarehouseFiles, warehouse_files
from .freshness import SingleFlight, Versions
from .home import Home
from .lineage_spool import TableSpool
from .maintenance import Log, Maintenance
from .policies import Policies
from .registries import RegistryReads, RegistryTables
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
    chunks_schema,
)
from .sources import Sources
from .tables import connect, declare_primary_key, local_path, names_storage_failures, open_table
from .warehouse_format import WRITES, Migration, record_format, recorded_format, refusal

DIRECTORY_KEY = b"ragwarden:directory"

_PINNED: ContextVar[tuple[int, Versions] | None] = ContextVar("ragwarden_pinned_versions", default=None)
"""The versions one request reads at (``Store.pinned``), with the id of the store they belong to."""


@dataclass(frozen=True, kw_only=True)
class ReadDoors:
    """What retrieval is handed: the chunks to read, the registries to compile against, and the
    folder of the serving index's artifacts (derived from the rows, never the source of truth)."""

    chunks: ChunkReads
    registries: RegistryReads
    artifacts: WarehouseFiles | None


@dataclass(frozen=True, kw_only=True)
class WriteDoors:
    """What ingest and the lifecycle are handed: chunks and source records to write, the
    registries a writer registers in before it commits, and maintenance (optimize after a write,
    purge after an erasure)."""

    chunks: Chunks
    sources: Sources
    registries: RegistryTables
    maintenance: Maintenance
    erasures: Erasures


@names_storage_failures
class Store:
    """One warehouse: its connection, its format, its doors; the one object that owns storage."""

    def __init__(
        self, uri: str, *, dimension: int, storage_options: Mapping[str, str] | None = None, create: bool = True,
        migrate: bool = False,
    ) -> None:  # fmt: skip
        """Open the warehouse at ``uri``, creating it when absent if ``create`` (else refusing
        a missing one, naming the path). A warehouse of a format this release does not serve is
        refused (``WarehouseFormatError``) before anything is read or written, unless ``migrate``:
        then it is brought to the format this release writes (``migration`` says how)."""
        self.uri = uri
        self.dimension = dimension
        self.storage_options: Mapping[str, str] = dict(storage_options or {})
        self._db = connect(uri, storage_options, create=create)
        self._audit: AuditTable | None = None
        self._api_keys: ApiKeysTable | None = None
        present = self._refuse_missing_tables()
        found = self._found_format(present)
        refused = None if found is None else refusal(uri, found)
        if refused is not None and not (migrate and found is not None and found < WRITES):
            raise refused
        steps = self._upgrade_tables(present) if migrate else []
        sources = self._table(SOURCES, SOURCES_SCHEMA)
        clauses = self._table(CLAUSES, CLAUSES_SCHEMA)
        policies = self._table(POLICIES, POLICIES_SCHEMA)
        chunks = self._table(CHUNKS, chunks_schema(dimension))  # last: its presence marks a complete warehouse
        for table, key in ((chunks, "chunk_id"), (policies, "seq")):
            declare_primary_key(table, key)
        present = set(self._db.list_tables().tables)
        backfill = LABELS not in present
        labels = self._table(LABELS, LABELS_SCHEMA)
        self._versioned = {CHUNKS: chunks, POLICIES: policies, CLAUSES: clauses, LABELS: labels}
        self._versions = SingleFlight(self._read_versions)
        self._registries_seen: tuple[int, int, int] | None = None  # (chunks, clauses, labels) versions
        self._version_pool: tuple[int, ThreadPoolExecutor] | None = None
        home = Home(uri=uri, damaged=self.damaged_files, pinned=self._pin)
        self.registries = RegistryTables(home, clauses=clauses, labels=labels)
        """The ACL clause and label registries."""
        self.chunks = Chunks(home, chunks, dimension=dimension, registries=self.registries)
        """The ``chunks`` table: hand ``ChunkReads`` to whoever only reads."""
        self.sources = Sources(home, sources, chunks=self.chunks, registries=self.registries)
        """The source records."""
        self.policies = Policies(home, policies)
        """The installed policies."""
        self._directory = self._open_directory(policies, had_one=DIRECTORY in present)  # read by every freshness check
        if found is None or (migrate and found != WRITES):
            record_format(policies, WRITES)
            steps.append(f"recorded format {WRITES}")
        self.format = WRITES if found is None or migrate else found
        """The format of the warehouse as opened (``state.warehouse_format``)."""
        self.migration = Migration(found=found or WRITES, now=self.format, steps=tuple(steps)) if migrate else None
        """What opening it with ``migrate`` did; None otherwise."""
        self._format_seen: tuple[int, WarehouseFormatError | None] = (int(policies.version), None)
        tables = {CHUNKS: chunks, SOURCES: sources, CLAUSES: clauses, POLICIES: policies, LABELS: labels}
        self.maintenance = Maintenance(home, tables, logs=self._logs, files=self.files)
        """Optimize, purge, history and damage checks, over every table."""
        self.erasures = Erasures(home, self._db)
        """The tombstones of erased documents."""
        if backfill:
            self.registries.register_labels(self.chunks.labels_in_rows())

    def read_doors(self) -> ReadDoors:
        """The doors a reader (retrieval) is handed."""
        return ReadDoors(chunks=self.chunks, registries=self.registries, artifacts=self.files(RESIDENT_INDEX))

    def write_doors(self) -> WriteDoors:
        """The doors a writer (ingest, the lifecycle) is handed."""
        return WriteDoors(chunks=self.chunks, sources=self.sources, registries=self.registries,
                          maintenance=self.maintenance, erasures=self.erasures)  # fmt: skip

    # -- the format ----------------------------------------------------------------------

    def _table(self, name: str, schema: pa.Schema) -> Any:
        return open_table(self._db, name, schema)

    def _open_directory(self, policies: Any, *, had_one: bool) -> DirectoryTable:
        """The ``directory`` table. Once made, its making is recorded on ``policies``: a directory
        that has gone is then an error naming it, never an empty one in its place (which would lift
        every deactivation the identity provider made)."""
        recorded = (policies.schema.metadata or {}).get(DIRECTORY_KEY)
        if recorded and not had_one:
            raise WarehouseError(
                f"warehouse {self.uri!r}: table {DIRECTORY!r} is missing from a warehouse that had one; restore "
                f"{DIRECTORY}.lance from a backup (it is not recreated empty: its deactivations would be lost)"
            )
        directory = DirectoryTable(self._db)
        if not recorded:
            retrying_conflicts(
                lambda: policies.to_lance().update_schema_metadata({DIRECTORY_KEY.decode(): "1"}),
                what="recording the directory",
            )
            policies.checkout_latest()
        return directory

    def _refuse_missing_tables(self) -> set[str]:
        """A table of a warehouse in use that has gone is an error naming it, never a fresh empty
        table in its place (which would lose its rows, or an ACL registry, in silence). The
        tables present, as listed for the check."""
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
        return present

    def _upgrade_tables(self, present: set[str]) -> list[str]:
        """Bring tables written by an earlier release to the current schema, in place: ``sources``
        gains its ``chunks_version`` stamp (0: older than any commit to come), ``chunks`` its
        ``metadata`` (each chunk its source record's, see ``_backfill_metadata``), and
        ``policies`` its commit order ``seq`` (the installs so far numbered by their install time,
        the only order they recorded). Each step runs only where its table lacks what it adds; the
        steps taken, said. ``present``: the tables, as listed when the warehouse was opened."""
        steps: list[str] = []
        if CHUNKS in present:
            chunks = self._db.open_table(CHUNKS)
            if "metadata" not in chunks.schema.names:
                field = chunks_schema(self.dimension).field("metadata")
                retrying_conflicts(lambda: chunks.add_columns(field), what="upgrading chunks")
                if SOURCES in present:
                    self._backfill_metadata(chunks, self._db.open_table(SOURCES))
                steps.append("chunks: metadata added, each chunk its source record's")
        if SOURCES in present:
            sources = self._db.open_table(SOURCES)
            if "chunks_version" not in sources.schema.names:
                retrying_conflicts(
                    lambda: sources.add_columns({"chunks_version": "CAST(0 AS BIGINT)"}), what="upgrading sources"
                )
                steps.append("sources: chunks_version added (0)")
        if POLICIES in present:
            policies = self._db.open_table(POLICIES)
            if "seq" not in policies.schema.names:
                rows = policies.to_arrow().sort_by([("installed_at", "ascending")]).to_pylist()
                numbered = [{**row, "seq": seq} for seq, row in enumerate(rows, start=1)]
                self._db.create_table(POLICIES, pa.Table.from_pylist(numbered, schema=POLICIES_SCHEMA), mode="overwrite")
                steps.append("policies: numbered by install time (seq)")
        return steps

    def _found_format(self, present: set[str]) -> int | None:
        """The format the warehouse records; None for a warehouse not made yet (no ``chunks``
        among the tables ``present``)."""
        return recorded_format(self._db.open_table(POLICIES)) if CHUNKS in present and POLICIES in present else None

    def still_served(self, policies_version: int) -> None:
        """Refuse (``WarehouseFormatError``) once the warehouse records a format this release does
        not serve (migrated by a newer release while this one serves): read from the ``policies``
        table once per version of it, the version a freshness check has just read."""
        seen, refused = self._format_seen
        if policies_version != seen:
            refused = refusal(self.uri, recorded_format(self._versioned[POLICIES]))
            self._format_seen = (policies_version, refused)
        if refused is not None:
            raise refused

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

    def damaged_files(self) -> list[str]:
        """Data files a table's current version names that are missing or damaged (see
        ``Maintenance.damaged_files``; for messages, so it never raises). None yet while the
        store is still opening its tables."""
        maintenance: Maintenance | None = getattr(self, "maintenance", None)
        return maintenance.damaged_files() if maintenance is not None else []

    # -- freshness -----------------------------------------------------------------------

    def versions(self) -> Versions:
        """The latest version of every table a read depends on, from one check that began after
        this call did (shared by the calls waiting for it: ``freshness.SingleFlight``)."""
        return self._versions.get()

    def _read_versions(self) -> Versions:
        tables = self._versioned
        if self.local_path is not None:  # a local read is CPU, not waiting: threads would not help
            chunks, policies = int(tables[CHUNKS].version), int(tables[POLICIES].version)
            # Registries matter only for rows that carry a new clause or label, and a writer registers
            # those before it commits the rows: while ``chunks`` has not moved, the registries read at
            # its version serve (read after ``chunks``, they include every registration before it).
            seen = self._registries_seen
            if seen is not None and seen[0] == chunks:
                clauses, labels = seen[1], seen[2]
            else:
                clauses, labels = int(tables[CLAUSES].version), int(tables[LABELS].version)
                self._registries_seen = (chunks, clauses, labels)
            return Versions(chunks=chunks, policies=policies, clauses=clauses, labels=labels,
                            directory=self._directory.version)  # fmt: skip
        others = (tables[POLICIES], tables[CLAUSES], tables[LABELS], self._directory)
        if self._version_pool is None or self._version_pool[0] != os.getpid():  # a forked child needs its own threads
            self._version_pool = (os.getpid(), ThreadPoolExecutor(max_workers=len(others), thread_name_prefix="versions"))
        pending = [self._version_pool[1].submit(lambda table=table: int(table.version)) for table in others]
        chunks = int(tables[CHUNKS].version)  # object storage: five round trips at once, about one's time
        policies, clauses, labels, directory = (future.result() for future in pending)
        return Versions(chunks=chunks, policies=policies, clauses=clauses, labels=labels, directory=directory)

    @contextmanager
    def pinned(self) -> Iterator[Versions]:
        """Hold one freshness check (``versions()``) for a read operation: every version a door is
        asked for inside answers from it. Never around a write, which must see its own commits."""
        held = _PINNED.get()
        if held is not None and held[0] == id(self):
            yield held[1]
            return
        versions = self.versions()
        self.still_served(versions.policies)
        token = _PINNED.set((id(self), versions))
        try:
            yield versions
        finally:
            _PINNED.reset(token)

    def _pin(self) -> Versions | None:
        held = _PINNED.get()
        return held[1] if held is not None and held[0] == id(self) else None

    # -- the logs, the directory and plain files -----------------------------------------

    @property
    def local_path(self) -> Path | None:
        """The warehouse folder, when the warehouse is on the local file system."""
        return local_path(self.uri)

    @property
    def directory(self) -> DirectoryTable:
        """The users and groups provisioned over SCIM (``state.directory``)."""
        return self._directory

    @property
    def directory_version(self) -> int:
        """The ``directory`` table's version: the request's freshness check's, inside ``pinned``."""
        pin = self._pin()
        return pin.directory if pin is not None else self._directory.version

    def audit_table(self, key_check: str) -> AuditTable:
        """The receipts' table, created recording ``key_check`` if absent (``state.audit_log.AuditLog``)."""
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

    def _logs(self, open_present: bool) -> Sequence[tuple[str, Log]]:
        """The append-only tables, by name, for ``Maintenance``: those opened so far, or (with
        ``open_present``) every one the warehouse holds, opened now."""
        if open_present:
            present = set(self._db.list_tables().tables)
            if AUDIT in present and self._audit is None:  # opened, never created (it is there): no key check
                self._audit = AuditTable(self._db, key_check="", journal=self._journal())
            if API_KEYS in present:
                self.api_keys  # noqa: B018 - opens it
        logs: list[tuple[str, Log]] = [(name, log) for name, log in (("audit log", self._audit), ("API keys", self._api_keys))
                                       if log is not None]  # fmt: skip
        return [*logs, ("directory", self._directory)] if open_present else logs

    def lineage_spool(self) -> TableSpool:
        """The warehouse's own lineage spool (its ``lineage_spool`` table, made on first use)."""
        return TableSpool(self._db, self.uri)

    def files(self, folder: str) -> WarehouseFiles | None:
        """Plain files of ``folder`` in the warehouse (None on a store with none: not a folder nor S3)."""
        return warehouse_files(self.uri, self.storage_options, folder)
