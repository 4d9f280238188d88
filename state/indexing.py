"""Indexes of the ``chunks`` table and when to build them: scalar indexes for the governance
columns the compiled filter reads, a vector index once a flat scan stops being cheap, and
compaction of the small fragments that many small commits leave.

Every index here only speeds a query up: rows written after an index was built are still
searched (unindexed) until the next optimize, and the search planner never trusts an index for
what a row may show — the filter and the post-check decide that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from lancedb.index import Bitmap, BTree, IvfHnswSq, LabelList

LABEL_LIST_COLUMNS = ("acl_allow", "acl_deny", "acl_clauses", "labels")
BITMAP_COLUMNS = ("tenant", "classification")
BTREE_COLUMNS = ("chunk_id", "doc_id")
VECTOR_INDEX_MIN_ROWS = 50_000
"""Below this a flat scan of the whole table is a few milliseconds: an index would only cost recall."""


@dataclass(frozen=True, kw_only=True)
class IndexReport:
    """What one optimize did, and how long each step took (seconds)."""

    rows: int
    scalar_indexes: tuple[str, ...]
    vector_index: str | None
    fragments_before: int
    fragments_after: int
    seconds: dict[str, float]


def _present(table: Any) -> dict[str, str]:
    """Indexed column -> index type."""
    return {index.columns[0]: index.index_type for index in table.list_indices()}


def ensure_scalar_indexes(table: Any) -> tuple[str, ...]:
    """LABEL_LIST on the list columns, BITMAP on tenant and classification, BTREE on the ids;
    built once, brought up to date by ``optimize`` afterwards."""
    present = _present(table)
    built: list[str] = []
    for columns, config in ((LABEL_LIST_COLUMNS, LabelList), (BITMAP_COLUMNS, Bitmap), (BTREE_COLUMNS, BTree)):
        for column in columns:
            if column not in present:
                table.create_index(column, config=config(), replace=True)
                built.append(column)
    return tuple(built)


def vector_index_partitions(rows: int) -> int:
    """About sqrt(N) IVF partitions (1,000 of 1,000 rows at a million)."""
    return max(1, min(4096, round(math.sqrt(rows))))


def has_vector_index(table: Any) -> bool:
    return "vector" in _present(table)


def ensure_vector_index(
    table: Any, *, rows: int, rebuild: bool = False, min_rows: int = VECTOR_INDEX_MIN_ROWS
) -> str | None:
    """Build the vector index once the table is big enough; None when a flat scan is the better plan.

    ``rebuild`` retrains it from the rows there now (after an erasure: the old one holds the
    erased rows' vectors), or drops it when the table has become too small to need one."""
    if rows < min_rows:
        if rebuild and has_vector_index(table):
            table.drop_index(next(index.name for index in table.list_indices() if index.columns == ["vector"]))
        return None
    if has_vector_index(table) and not rebuild:
        return _present(table)["vector"]
    table.create_index(
        "vector", config=IvfHnswSq(distance_type="cosine", num_partitions=vector_index_partitions(rows)), replace=True
    )
    return _present(table)["vector"]


def compact(table: Any) -> None:
    """Merge small fragments and fold new rows into existing indexes, keeping old versions
    (erasure purges those itself, on purpose)."""
    table.optimize(cleanup_older_than=timedelta(days=3650))


__all__ = [
    "IndexReport",
    "compact",
    "ensure_scalar_indexes",
    "ensure_vector_index",
    "has_vector_index",
    "vector_index_partitions",
]
