"""The maintenance door, over every table: bring indexes up to date (``optimize``), physically
remove erased rows (``purge_history``), say how much history is left, and find damaged files.

It is the one door that reaches every table, because each of these is about all of them; the
wings reach it only for what an operation asks (ingest optimizes after writing, forget purges).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol

from .commit_retry import retrying_conflicts
from .files import PURGE_MARKS, RESIDENT_INDEX, WarehouseFiles
from .history import EmptiedMark, drop_superseded_content, prune_records, versions_left
from .home import Door, Home
from .indexing import (
    VECTOR_INDEX_MIN_ROWS,
    IndexReport,
    compact,
    drop_text_index,
    ensure_scalar_indexes,
    ensure_vector_index,
    has_vector_index,
)
from .schema import CHUNKS, SOURCES
from .tables import damaged_files, local_path, names_storage_failures


class Log(Protocol):
    """An append-only table kept apart from the rows (the audit log, the API keys, the directory)."""

    def compact(self) -> Any: ...
    def damaged_files(self) -> list[str]: ...


@names_storage_failures
class Maintenance(Door):
    """Optimize, purge, history and damage, for every table."""

    def __init__(
        self,
        home: Home,
        tables: Mapping[str, Any],
        *,
        logs: Callable[[bool], Sequence[tuple[str, Log]]],
        files: Callable[[str], WarehouseFiles | None],
    ) -> None:
        super().__init__(home)
        self._tables = dict(tables)
        self._chunks = self._tables[CHUNKS]
        self._logs = logs  # (open those present: bool) -> the logs, by name
        self._files = files

    def damaged_files(self) -> list[str]:
        """Data files a table's current version names that are missing or not the size it recorded
        (local warehouses; for diagnosis after a failed read, so it never raises)."""
        found = damaged_files(local_path(self.uri), self._tables)
        return found + [path for _, log in self._logs(False) for path in log.damaged_files()]

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
        chunks = self._chunks
        rows = chunks.count_rows()
        fragments_before = len(chunks.to_lance().get_fragments())
        if rows == 0:
            return IndexReport(rows=0, scalar_indexes=(), vector_index=None, fragments_before=fragments_before,
                               fragments_after=fragments_before, seconds=seconds)  # fmt: skip
        retrying_conflicts(lambda: drop_text_index(chunks), what="dropping the text index")
        retrying_conflicts(lambda: compact(chunks, batched=batched), what="compacting")
        seconds["compact"] = time.perf_counter() - started - sum(seconds.values())
        scalar = retrying_conflicts(lambda: ensure_scalar_indexes(chunks), what="building scalar indexes")
        seconds["scalar_indexes"] = time.perf_counter() - started - sum(seconds.values())
        vector = retrying_conflicts(
            lambda: ensure_vector_index(chunks, rows=rows, rebuild=rebuild_vector_index, min_rows=vector_index_min_rows),
            what="building the vector index",
        )
        seconds["vector_index"] = time.perf_counter() - started - sum(seconds.values())
        return IndexReport(
            rows=rows,
            scalar_indexes=scalar,
            vector_index=vector,
            fragments_before=fragments_before,
            fragments_after=len(chunks.to_lance().get_fragments()),
            seconds=seconds,
        )

    def _tidy_logs(self) -> None:
        """Merge the small files of the append-only tables (``audit``, ``api_keys``) and drop their
        versions older than ``tables.VERSIONS_KEPT``: neither ever deletes a row, so an old version
        holds nothing the latest does not (a reader still on one keeps its files for that long).
        The ``directory`` too (it deletes rows, but a version from before a deletion is of no use
        to any reader once older than that)."""
        for name, log in self._logs(True):
            retrying_conflicts(log.compact, what=f"compacting the {name}")

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
        for name in (CHUNKS, SOURCES):
            table = self._tables[name]
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
        artifacts = self._files(RESIDENT_INDEX)  # serving-index artifacts hold every row's vector
        for name in artifacts.names() if artifacts is not None else []:
            artifacts.remove(name)
        return removed

    def versions_left(self) -> dict[str, int]:
        """How many versions of each table that holds row content still hold rows the latest does
        not show, the latest included (after a purge: one each, unless writers committed since)."""
        left: dict[str, int] = {}
        for name in (CHUNKS, SOURCES):
            folder = self._table_folder(name)
            latest = self._tables[name].to_lance()
            left[name] = versions_left(latest, *folder) if folder is not None else len(latest.versions())
        return left

    def _table_folder(self, name: str) -> tuple[Callable[[str], WarehouseFiles], EmptiedMark] | None:
        """The folders under table ``name``'s own and the mark of its last purge, on a store whose
        files can be listed and removed."""
        marks = self._files(PURGE_MARKS)
        if marks is None:
            return None

        @functools.cache
        def folder(path: str) -> WarehouseFiles:
            files = self._files(f"{name}.lance/{path}")
            assert files is not None  # the same store as the marks' folder
            return files

        return folder, EmptiedMark(marks, name)
