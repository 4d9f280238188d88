"""Indexes of the ``chunks`` table and when to build them: scalar indexes for the governance
columns the compiled filter reads, a vector index once a flat scan stops being cheap, and
compaction of the small fragments that many small commits leave.

Every index here only speeds a query up: rows written after an index was built are still
searched (unindexed) until the next optimize, and the search planner never trusts an index for
what a row may show — the filter and the post-check decide that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
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


MERGE_RATIO = 4
"""A fragment is left alone while it holds at least this many times the rows of all the fragments
after it: the table stays a few large old fragments, each much larger than the rest together."""
FRAGMENT_ROWS_MAX = 1024 * 1024
"""Lance's own target: a fragment this big is never merged again (only its deletions are)."""
DELETED_SHARE = 0.1
"""A fragment with more than this share of its rows deleted is rewritten without them (Lance's default)."""
BATCHED_MERGE_FRAGMENTS = 8
"""After an ingest, small fragments are merged once this many are due, not after every commit."""
BATCHED_UNINDEXED_SHARE, BATCHED_UNINDEXED_MIN = 0.01, 1_000
"""After an ingest, new rows are folded into the indexes once they are this share of the table
(and at least this many); until then a search scans them, as it does any row not yet indexed."""


def merge_tail(rows: Sequence[int], *, at_least: int = 2) -> int:
    """Where the fragments worth merging start (``len(rows)`` for none): at the first fragment
    holding fewer than ``MERGE_RATIO`` times the rows of all those after it, to the end, when that
    is ``at_least`` fragments. Merging keeps every fragment that many times larger than the rest,
    so a table of N rows has about log4(N) fragments (plus fewer than ``at_least``) and each row
    is rewritten about that many times over its life, not once per commit (merging everything
    after every small ingest rewrote the whole table each time)."""
    after = sum(rows)
    for start, count in enumerate(rows):
        after -= count
        if count < min(MERGE_RATIO * after, FRAGMENT_ROWS_MAX):
            return start if len(rows) - start >= max(2, at_least) else len(rows)
    return len(rows)


def compact(table: Any, *, batched: bool = False) -> None:
    """Fold new rows into the indexes, then merge the small fragments recent commits left
    (``merge_tail``) and any fragment with over a tenth of its rows deleted, keeping old versions
    (erasure purges those itself, on purpose). The large old fragments are not rewritten for a few
    new rows: a small ingest stays cheap however large the table grows, and a reader's cache of the
    old fragments stays valid.

    ``batched`` (after an ingest): fold and merge only once enough is due
    (``BATCHED_UNINDEXED_*``, ``BATCHED_MERGE_FRAGMENTS``). Each fold or merge is a commit, and
    each commit a new version every replica's searches must catch up with: folding and merging
    after every small ingest made four versions of one."""
    dataset = table.to_lance()
    fragments = [fragment.metadata for fragment in dataset.get_fragments()]
    rows = [fragment.num_rows for fragment in fragments]
    live = sum(rows)
    start = merge_tail(rows, at_least=BATCHED_MERGE_FRAGMENTS if batched else 2)
    kept = [
        fragment.id
        for fragment in fragments[:start]
        if fragment.num_deletions <= DELETED_SHARE * fragment.physical_rows
    ]
    merge = len(kept) < len(fragments)
    indexes = dataset.describe_indices()
    unindexed = live - min((index.num_rows_indexed for index in indexes), default=live)  # both count live rows
    segments = max((len(index.segments) for index in indexes), default=1)
    due = max(BATCHED_UNINDEXED_MIN, BATCHED_UNINDEXED_SHARE * live) if batched else 1
    if indexes and (unindexed >= due or (merge and (unindexed > 0 or segments > 1))):
        # every index back to one segment over every fragment: Lance merges only fragments that
        # the same segments cover, and a fold may add a segment (the vector index's do)
        dataset.optimize.optimize_indices(num_indices_to_merge=segments)
        table.checkout_latest()
    if merge:
        table.to_lance().optimize.compact_files(
            excluded_fragment_ids=kept,
            target_rows_per_fragment=FRAGMENT_ROWS_MAX,
            materialize_deletions_threshold=DELETED_SHARE,
        )
        table.checkout_latest()


def drop_text_index(table: Any) -> bool:
    """Drop a full-text index older warehouses built: no search reads it (full-text scores are
    BM25 over the caller's own rows, ``retrieval.lexical``), keeping it up to date was most of a
    small ingest's optimize, and it holds a copy of every text. Returns whether there was one."""
    names = [index.name for index in table.list_indices() if index.index_type == "FTS"]
    for name in names:
        table.drop_index(name)
    return bool(names)


__all__ = [
    "IndexReport",
    "compact",
    "drop_text_index",
    "ensure_scalar_indexes",
    "ensure_vector_index",
    "has_vector_index",
    "merge_tail",
    "vector_index_partitions",
]
