"""The ``chunks`` table's door: ``ChunkReads`` for what retrieval asks (nearest rows, rows at a
version, counts, rows by id), ``Chunks`` for what ingest and the lifecycle also do (conditional
writes planned from a snapshot, re-tags, deletes, and loading benchmark worlds).

Retrieval is handed a ``ChunkReads`` and never writes chunks (``tests/test_layout.py``). Every
version a read is asked at, or answers with, is the request's pinned one inside ``Store.pinned``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import WarehouseError
from ..governance.sql import sql_in_list
from ..stages import work
from .commit_retry import SnapshotPurged, is_commit_conflict, is_missing_file, retrying_conflicts
from .home import Door, Home
from .indexing import has_vector_index
from .registries import RegistryTables
from .schema import chunks_schema
from .snapshot import ChunksSnapshot, ChunkWrite, DocumentKey
from .tables import names_storage_failures, rows_where_in

T = TypeVar("T")
EMBEDDING_MODEL_KEY = b"ragwarden:embedding_model"
IN_LIST_MAX_IDS = 2_000
"""Rows read by id with an IN list up to this many ids; past it, every admitted row is read once
and filtered (a filter of thousands of literals costs more than the scan)."""


DATASETS_KEPT = 4
"""Datasets at a version a ``ChunkReads`` keeps open."""


@names_storage_failures
class ChunkReads(Door):
    """Reads of ``chunks``: what a search, a review or a lineage query asks."""

    def __init__(self, home: Home, table: Any, *, dimension: int) -> None:
        super().__init__(home)
        self._table = table
        self.dimension = dimension
        self._datasets: OrderedDict[int, Any] = OrderedDict()  # version -> dataset, the last few opened
        self._datasets_lock = threading.Lock()

    # -- versions and what the table records ---------------------------------------------

    @property
    def version(self) -> int:
        """The latest committed version (every read sees the latest commit), or the one the
        request's freshness check read (``Store.pinned``)."""
        pin = self._home.pinned()
        return pin.chunks if pin is not None else int(self._table.version)

    def latest_version(self) -> int:
        """The latest committed version, read now even inside ``Store.pinned``."""
        return int(self._table.version)

    def require_version(self, min_version: int | None) -> None:
        """Refuse to serve from a table older than ``min_version`` (read-your-writes)."""
        if min_version is None or self._table.version >= min_version:
            return
        self._table.checkout_latest()
        if self._table.version < min_version:
            raise WarehouseError(
                f"chunks table is at version {self._table.version}, older than the {min_version} asked for; retry shortly"
            )

    @property
    def embedding_model(self) -> str | None:
        """The model whose vectors this warehouse holds, as recorded (None: not yet recorded)."""
        recorded = (self._table.schema.metadata or {}).get(EMBEDDING_MODEL_KEY)
        return recorded.decode("utf-8") if recorded else None

    @property
    def schema(self) -> pa.Schema:
        """The schema rows are written in (``metadata`` as JSON text, which Lance stores in its
        binary JSON form; a ``large_binary`` of text would be stored unconverted)."""
        return chunks_schema(self.dimension)

    def has_vector_index(self) -> bool:
        return has_vector_index(self._table)

    # -- reads under a filter ------------------------------------------------------------

    def count(self, where: str | None = None) -> int:
        """Rows that ``where`` admits (every row for None)."""
        return int(self._table.count_rows(where or None))

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
        builder = self._table.search(vector, vector_column_name="vector").distance_type("cosine")
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
        across them fall back to scanning through Lance at once."""
        dataset = self._table.to_lance()
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

    # -- fragments: what a commit changed ----------------------------------------------------

    def commit_kinds(self, since: int, until: int) -> list[str] | None:
        """What each commit after ``since`` up to ``until`` was, as Lance records it (``Update``
        with its mode, ``Append``, ``Delete``, ``Rewrite``...); None when a record is gone."""
        dataset = self._at(until)
        if dataset is None:
            return None
        try:
            found = dataset.delta(begin_version=since, end_version=until).list_transactions()
        except (OSError, pa.ArrowException, ValueError) as exc:
            if is_missing_file(exc) or "not found" in str(exc).lower():
                return None
            raise
        kinds = []
        for transaction in found:
            operation = transaction.operation
            mode = getattr(operation, "update_mode", None)
            kinds.append(type(operation).__name__ + (f":{mode}" if mode else ""))
        return kinds

    def fragments_at(self, version: int) -> dict[int, tuple[str, str, int]] | None:
        """Each data fragment of the table at ``version``: the names of its data files, of the
        file marking its removed rows ("" for none), and how many rows that file marks. Lance writes a commit's new rows in
        fragments of their own, marks the rows it removes in a new deletion file, and rewrites a
        fragment's data files when it updates columns in place, so two versions' maps say which
        fragments a commit added, rewrote, or removed rows from. None when that version is gone
        (a purge removed it)."""
        dataset = self._at(version)
        if dataset is None:
            return None
        return {
            fragment.fragment_id: (" ".join(f.path for f in fragment.data_files()), fragment.deletion_file() or "",
                                   fragment.num_deletions)
            for fragment in dataset.get_fragments()
        }  # fmt: skip

    def physical_rows(self, version: int, fragment_ids: Sequence[int]) -> int | None:
        """How many rows ``fragment_ids`` were written with at ``version`` (the manifest's count,
        removed rows included; nothing read); None when that version is gone."""
        dataset = self._at(version)
        if dataset is None:
            return None
        return sum(dataset.get_fragment(f).metadata.physical_rows for f in fragment_ids)

    def fragment_rows(self, version: int, fragment_ids: Sequence[int], columns: Sequence[str]) -> pa.Table | None:
        """The live rows of ``fragment_ids`` at ``version`` with ``columns`` and ``_rowaddr``
        (fragment id in the high 32 bits, the row's offset in it in the low); None when that
        version is gone."""
        dataset = self._at(version)
        if dataset is None:
            return None
        try:
            tables = [dataset.get_fragment(f).to_table(columns=list(columns), with_row_address=True) for f in fragment_ids]
        except (OSError, pa.ArrowException) as exc:
            if is_missing_file(exc):
                return None
            raise
        found = pa.concat_tables(tables) if tables else None
        if found is None:
            empty = dataset.schema.empty_table().select(list(columns))
            found = empty.append_column("_rowaddr", pa.array([], pa.uint64()))
        work("rows_read", found.num_rows)
        return found

    def _at(self, version: int) -> Any:
        """The dataset at ``version``, or None when that version is gone. The last few opened are
        kept (a version never changes): moving a reader to a new version reads its fragments, their
        rows and the rows' content, and opening a dataset costs about a millisecond each time."""
        with self._datasets_lock:
            held = self._datasets.get(version)
        if held is not None:
            return held
        dataset = self._table.to_lance()
        if dataset.version != version:
            try:
                dataset = dataset.checkout_version(version)
            except (OSError, pa.ArrowException, ValueError) as exc:
                if is_missing_file(exc) or "not found" in str(exc).lower():
                    return None
                raise
        with self._datasets_lock:
            self._datasets[version] = dataset
            while len(self._datasets) > DATASETS_KEPT:
                self._datasets.popitem(last=False)
        return dataset

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
        dataset = self._table.to_lance()
        return dataset.version, dataset.to_table(columns=list(columns))

    def rows_where(self, where: str, columns: Sequence[str]) -> list[dict[str, Any]]:
        """Every row that ``where`` admits, with ``columns``."""
        return self._table.search().where(where).select(list(columns)).limit(None).to_list()

    # -- rows by id and by lineage -------------------------------------------------------

    @property
    def _columns_but_vector(self) -> list[str]:
        return [name for name in self._table.schema.names if name != "vector"]

    def rows(self, chunk_ids: Iterable[str], columns: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Rows by chunk id (all columns but the vector unless ``columns``); ids not present are absent."""
        wanted = columns or self._columns_but_vector
        found = {r["chunk_id"]: r for r in rows_where_in(self._table, "chunk_id", chunk_ids, wanted)}
        work("rows_read", len(found))
        return found

    def vectors_of(self, chunk_ids: Iterable[str]) -> dict[str, list[float]]:
        """Stored vectors of chunks that already exist, so unchanged text is never re-embedded."""
        rows = rows_where_in(self._table, "chunk_id", chunk_ids, ["chunk_id", "vector"])
        return {row["chunk_id"]: row["vector"] for row in rows}

    def chunk_ids_of(self, doc_id: str, tenant: str | None = None) -> list[str]:
        """The source chunks of document ``doc_id`` in ``tenant`` (None: in any tenant)."""
        if tenant is not None:
            return self.chunk_ids_of_documents([(tenant, doc_id)])
        rows = rows_where_in(self._table, "doc_id", [doc_id], ["chunk_id", "kind"])
        return sorted(r["chunk_id"] for r in rows if r["kind"] == "chunk")

    def chunk_ids_of_documents(self, keys: Iterable[DocumentKey]) -> list[str]:
        """The source chunks of the documents ``keys``, at the latest version."""
        return self._latest().chunk_ids_of_documents(keys)

    def derived_from(self, chunk_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Every row derived, directly or through other derived rows, from ``chunk_ids``, at the
        latest version (without vectors)."""
        return self._latest().derived_from(chunk_ids, self._columns_but_vector)

    def row_tenant(self, chunk_id: str) -> str | None:
        """The tenant of a derived row (a summary, note or memory), or None if there is no such row."""
        row = self.rows([chunk_id], ["chunk_id", "tenant", "kind"]).get(chunk_id)
        return row["tenant"] if row is not None and row["kind"] != "chunk" else None

    def tenants_holding(self, doc_id: str) -> set[str]:
        """The tenants holding source chunks of a document called ``doc_id``."""
        return {r["tenant"] for r in rows_where_in(self._table, "doc_id", [doc_id], ["tenant", "kind"]) if r["kind"] == "chunk"}

    def labels_in_rows(self) -> set[str]:
        """Every label a row carries (a warehouse written before the label registry existed)."""
        if self._table.count_rows() == 0:
            return set()
        column = self._table.to_lance().to_table(columns=["labels"]).column("labels")
        return {label for label in pc.list_flatten(column).to_pylist() if label is not None}

    def _latest(self) -> ChunksSnapshot:
        return ChunksSnapshot(self._table.to_lance())


@names_storage_failures
class Chunks(ChunkReads):
    """Reads and writes of ``chunks``: what ingest and the lifecycle (derive, sync, forget) do.
    Labels a write carries are registered (``RegistryTables``) before it commits."""

    def __init__(self, home: Home, table: Any, *, dimension: int, registries: RegistryTables) -> None:
        super().__init__(home, table, dimension=dimension)
        self._registries = registries

    def snapshot(self, version: int | None = None) -> ChunksSnapshot:
        """The table pinned at ``version`` (None: its latest), to plan a write from."""
        dataset = self._table.to_lance()
        return ChunksSnapshot(dataset if version is None else dataset.checkout_version(version))

    def write(self, plan: Callable[[ChunksSnapshot], tuple[ChunkWrite, T]], *, what: str) -> tuple[T, int]:
        """Plan a write from a snapshot and commit it on that snapshot, planning again from a fresh
        one whenever a concurrent commit touched a row the plan wrote, read or deleted (see
        ``snapshot``). Returns the plan's result and the version the commit made."""

        def attempt() -> tuple[T, int]:
            snapshot = self.snapshot()
            try:
                write, result = plan(snapshot)
                self._registries.register_labels(label for label in write.labels() if label)
                return result, snapshot.commit(write)
            except Exception as exc:
                if is_missing_file(exc) and not is_commit_conflict(exc) and self._table.version != snapshot.version:
                    raise SnapshotPurged(what, snapshot.version) from exc  # a forget's purge: plan again
                raise

        return retrying_conflicts(attempt, what=what)

    def delete(self, chunk_ids: Iterable[str]) -> int:
        """Delete rows; returns the version of the deletion (their source record is the caller's to
        forget after: no row outlives the record of where it came from)."""
        doomed = sorted(set(chunk_ids))
        _, version = self.write(lambda _: (ChunkWrite(delete=doomed), None), what="deleting rows")
        return version

    def record_embedding_model(self, model: str) -> None:
        """Record ``model`` as the model of this warehouse's vectors (once: a warehouse of an
        earlier release gains the record at its next open)."""
        retrying_conflicts(
            lambda: self._table.to_lance().update_schema_metadata({EMBEDDING_MODEL_KEY.decode(): model}),
            what="recording the embedding model",
        )
        self._table.checkout_latest()

    def load_rows(self, rows: pa.Table) -> int:
        """Append whole rows as they are, unplanned (synthetic benchmark worlds, whose tags were
        computed with their clause tokens registered); returns the new version."""
        self._table.add(rows.cast(self.schema))
        return self.version

    def replace_columns(self, rows: pa.Table) -> int:
        """Overwrite, by ``chunk_id``, the columns ``rows`` holds (a benchmark giving a world
        texts); returns the new version."""
        retrying_conflicts(
            lambda: self._table.merge_insert("chunk_id").when_matched_update_all().execute(rows),
            what="replacing columns",
        )
        return self.version
