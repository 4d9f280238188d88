"""The ``chunks`` table pinned at one committed version, and the conditional commit of a write
planned from it.

Why: a lifecycle write (ingest, sync, derive, forget) computes rows' tags from other rows' tags.
If it read one version and committed on top of a newer one, it could write tags computed from
what is no longer there (a derived row keeping a parent's old, wider ACL). So every such write
reads through one snapshot and commits *on that snapshot*: Lance then checks the commit against
every commit made since, row by row, and refuses it if any row it updates or deletes was updated
or deleted meanwhile, or a row it inserts was inserted meanwhile (``chunk_id`` is the table's
unenforced primary key). A plan rewrites, unchanged, every row whose tags it read without
changing them (a derived row's other parents), so a change to any of them conflicts too. A
refused commit is never replayed: the caller plans again from a fresh snapshot
(``commit_retry.retrying_conflicts``), as it does a plan older than ``tables.PLAN_LIFETIME``
(Lance could no longer be sure to see every commit made since).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidValueError
from ..governance.sql import sql_documents, sql_in_list, sql_list
from .tables import conditional_merge

DocumentKey = tuple[str, str]


@dataclass(frozen=True, kw_only=True)
class ChunkWrite:
    """One commit of the ``chunks`` table, planned from one snapshot.

    ``rows`` are written whole (new rows, re-tagged rows, and rows read and rewritten unchanged
    so that the commit depends on them); ``delete`` are ids of rows to remove. ``table``: new
    rows given as one Arrow table instead (a bulk load's, built a column at a time).
    """

    rows: Sequence[Mapping[str, Any]] = ()
    delete: Sequence[str] = ()
    table: pa.Table | None = None

    def __post_init__(self) -> None:
        if self.table is not None and self.rows:
            raise InvalidValueError("a chunk write gives its rows as dicts or as a table, not both")
        if self.table is not None:  # checked in Arrow: a bulk load's table holds 100,000 rows
            ids = self.table.column("chunk_id")
            twice = pc.count_distinct(ids).as_py() != len(ids)
            both = bool(self.delete) and pc.any(pc.is_in(ids, value_set=pa.array(list(self.delete), pa.string()))).as_py()
        else:
            listed = [str(row["chunk_id"]) for row in self.rows]
            twice, both = len(listed) != len(set(listed)), bool(set(listed) & set(self.delete))
        if twice:
            raise InvalidValueError("a chunk write names a row twice")
        if both:
            raise InvalidValueError("a chunk write both writes and deletes a row")

    @property
    def empty(self) -> bool:
        return not self.rows and not self.delete and (self.table is None or not self.table.num_rows)

    def labels(self) -> set[str]:
        """Every label a row written carries."""
        if self.table is not None:
            return set(pc.unique(pc.list_flatten(self.table.column("labels"))).to_pylist())
        return {label for row in self.rows for label in row["labels"]}


def _without_nul(values: Iterable[str]) -> list[str]:
    """Ids that can be SQL literals: one holding a NUL names no row."""
    return sorted({v for v in values if isinstance(v, str) and "\x00" not in v})


class ChunksSnapshot:
    """Reads of the ``chunks`` table at one version, and the one conditional commit on it."""

    def __init__(self, dataset: Any) -> None:
        self._dataset = dataset
        self.schema: pa.Schema = dataset.schema
        self.version: int = dataset.version
        self._taken = time.monotonic()

    def _where(self, predicate: str, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
        wanted = list(columns) if columns is not None else self.schema.names
        return self._dataset.to_table(columns=wanted, filter=predicate).to_pylist()

    def rows(self, chunk_ids: Iterable[str], columns: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """Whole rows (vectors included, so they can be rewritten) by id; missing ids are absent."""
        wanted = _without_nul(chunk_ids)
        if not wanted:
            return {}
        return {row["chunk_id"]: row for row in self._where(f"chunk_id IN {sql_in_list(wanted)}", columns)}

    def chunk_ids_of_documents(self, keys: Iterable[DocumentKey]) -> list[str]:
        """The source chunks of the documents ``keys`` ((tenant, doc id) pairs)."""
        wanted = {(t, d) for t, d in keys if "\x00" not in t and "\x00" not in d}
        if not wanted:
            return []
        rows = self._where(f"kind = 'chunk' AND ({sql_documents(wanted)})", ["chunk_id"])
        return sorted(row["chunk_id"] for row in rows)

    def derived_from(
        self, chunk_ids: Iterable[str], columns: Sequence[str] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Every derived row (whole, unless ``columns``) that derives, directly or through other
        derived rows, from ``chunk_ids``; source chunks, which name their document as parent, are
        never followed."""
        found: dict[str, dict[str, Any]] = {}
        frontier = _without_nul(chunk_ids)
        while frontier:
            rows = self._where(f"kind != 'chunk' AND array_has_any(parents, {sql_list(frontier)})", columns)
            frontier = sorted({row["chunk_id"] for row in rows} - found.keys())
            found.update((row["chunk_id"], row) for row in rows)
        return found

    def commit(self, write: ChunkWrite) -> int:
        """Commit ``write`` on this snapshot's version; raises Lance's conflict error (never retried
        here) when a commit since then touched a row it writes or deletes. Returns the new version."""
        if write.empty:
            return self.version
        table = write.table.select(self.schema.names).cast(self.schema) if write.table is not None else rows_table(write.rows, self.schema)
        merge = conditional_merge(
            self._dataset, "chunk_id", _without_nul(write.delete), planned_at=self._taken, what="a chunks write"
        )
        merge.execute(table)
        return int(self._dataset.version)


def rows_table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """``rows`` as a table of ``schema``. When every row's vector is a numpy array (records that
    brought theirs), the vectors become one column at once: pyarrow takes a numpy array row by row
    four times slower than a list, and a list of floats per row is what a bulk load must not make."""
    vectors = [row.get("vector") for row in rows]
    field = schema.field("vector") if "vector" in schema.names else None
    if (field is None or not rows or not all(isinstance(v, np.ndarray) and v.shape == (field.type.list_size,) for v in vectors)):
        return pa.Table.from_pylist([dict(row) for row in rows], schema=schema)  # (a wrong length is refused here, named)
    rest = pa.schema([f for f in schema if f.name != "vector"], metadata=schema.metadata)
    table = pa.Table.from_pylist([{k: v for k, v in row.items() if k != "vector"} for row in rows], schema=rest)
    flat = np.stack(vectors).astype(np.float32, copy=False).ravel()
    column = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), field.type.list_size)
    return table.append_column(field, column).select(schema.names)
