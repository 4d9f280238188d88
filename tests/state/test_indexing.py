"""Optimize after a small ingest costs what the ingest wrote, not what the table holds: only the tail
of small fragments is merged, and only once enough are due; the large old ones are left as they are
(deleted rows aside); new rows are searched before they are folded into the indexes; and no
full-text index is kept that no search reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from lancedb.index import FTS, BTree, IvfHnswSq
from support.raw_tables import raw_table

from ragwarden.state.indexing import BATCHED_MERGE_FRAGMENTS, FRAGMENT_ROWS_MAX, compact, merge_tail
from ragwarden.warehouse import Warehouse

PUBLIC = {"tenant": "acme", "acl": {"allow": ["everyone"]}, "labels": [], "classification": "public"}


@pytest.mark.parametrize(
    ("rows", "start"),
    [
        ([], 0),  # nothing to merge
        ([500], 1),  # one fragment: nothing to merge it with
        ([500, 10], 2),  # the new fragment is small beside the old one: both left
        ([500, 10, 10], 1),  # two small ones: merged with each other, not with the large one
        ([600, 100, 30], 1),  # 100 < 4 x 30, 600 >= 4 x 130: the tail grows by one fragment
        ([500, 200], 0),  # 500 < 4 x 200: the large one joins
        ([100, 500, 10, 10], 0),  # a small fragment before larger ones: all merged
        ([1000, 64, 64, 64, 8], 1),  # a bulk ingest's commits, after a large fragment: merged among themselves
        ([FRAGMENT_ROWS_MAX, FRAGMENT_ROWS_MAX - 1, 900_000], 1),  # a full-sized fragment is never merged again
    ],
)
def test_the_merged_tail_starts_at_the_first_fragment_holding_under_four_times_the_rows_after_it(rows: list[int], start: int):
    assert merge_tail(rows) == start


def test_a_batched_merge_waits_until_enough_fragments_are_due():
    assert merge_tail([500, 10, 10, 10], at_least=4) == 4
    assert merge_tail([500, 10, 10, 10, 10], at_least=4) == 1


def _records(prefix: str, count: int) -> list[dict[str, Any]]:
    return [{**PUBLIC, "id": f"{prefix}-{n}", "text": f"Note {prefix} {n}: the {n}th reading of gauge {prefix}."}
            for n in range(count)]  # fmt: skip


def _fragments(warehouse: Warehouse) -> list[Any]:
    return [fragment.metadata for fragment in raw_table(warehouse.store).to_lance().get_fragments()]


@pytest.fixture
def large_table_warehouse(demo_policy_warehouse: Warehouse) -> Warehouse:
    """A warehouse whose chunks are one fragment of 200 rows, every one indexed."""
    assert demo_policy_warehouse.ingest_records(_records("bulk", 200)).ok
    demo_policy_warehouse.store.maintenance.optimize()
    assert [fragment.num_rows for fragment in _fragments(demo_policy_warehouse)] == [200]
    return demo_policy_warehouse


def _unindexed(warehouse: Warehouse) -> dict[str, int]:
    chunks = raw_table(warehouse.store)
    return {index.name: chunks.index_stats(index.name).num_unindexed_rows for index in chunks.list_indices()}


def test_small_ingests_leave_the_large_fragment_unwritten_and_make_about_one_version_each(
    large_table_warehouse: Warehouse,
):
    (large,) = _fragments(large_table_warehouse)
    before = large_table_warehouse.store.chunks.latest_version()
    for n in range(10):
        assert large_table_warehouse.ingest_records(_records(f"small{n}", 3)).ok
    fragments = _fragments(large_table_warehouse)
    assert fragments[0].id == large.id and fragments[0].files == large.files  # never rewritten
    assert sum(fragment.num_rows for fragment in fragments) == 230
    assert [fragment.num_rows for fragment in fragments] == [200, 3 * BATCHED_MERGE_FRAGMENTS, 3, 3]  # merged once eight were due
    assert large_table_warehouse.store.chunks.latest_version() - before <= 10 + 3  # one merge: fold, rewrite, remap
    assert set(_unindexed(large_table_warehouse).values()) == {6}  # folded with the merge; the two ingests since are not
    for question, k in (("reading of gauge small9", 3), ("Note small9 2", 1)):
        for mode in ("fts", "vector"):
            hits = large_table_warehouse.search(question, subject="user:dave", tenant="acme", k=k, mode=mode)
            assert {hit.doc_id for hit in hits} <= {"small9-0", "small9-1", "small9-2"} and hits, (question, mode)


def test_an_explicit_optimize_folds_every_row_into_the_indexes_and_merges_the_small_fragments(
    large_table_warehouse: Warehouse,
):
    for n in range(3):
        assert large_table_warehouse.ingest_records(_records(f"small{n}", 3)).ok
    assert len(_fragments(large_table_warehouse)) == 4
    large_table_warehouse.store.maintenance.optimize()
    assert [fragment.num_rows for fragment in _fragments(large_table_warehouse)] == [200, 9]
    assert set(_unindexed(large_table_warehouse).values()) == {0}


def test_a_large_fragment_with_a_tenth_of_its_rows_replaced_is_rewritten_without_them(large_table_warehouse: Warehouse):
    (large,) = _fragments(large_table_warehouse)
    changed = [{**record, "text": record["text"] + " Revised."} for record in _records("bulk", 200)[:30]]
    assert large_table_warehouse.ingest_records(changed).ok  # their old chunks deleted from the large fragment
    fragments = _fragments(large_table_warehouse)
    assert all(fragment.num_deletions == 0 for fragment in fragments)
    assert large.id not in {fragment.id for fragment in fragments}
    assert sum(fragment.num_rows for fragment in fragments) == 200


def test_ingest_builds_no_text_index_and_optimize_drops_one_an_older_warehouse_built(large_table_warehouse: Warehouse):
    chunks = raw_table(large_table_warehouse.store)
    assert [index.index_type for index in chunks.list_indices() if index.index_type == "FTS"] == []
    chunks.create_index("text", config=FTS())  # as warehouses written before this release hold one
    large_table_warehouse.store.maintenance.optimize()
    assert [index.index_type for index in raw_table(large_table_warehouse.store).list_indices() if index.index_type == "FTS"] == []
    hits = large_table_warehouse.search("reading of gauge bulk", subject="user:dave", tenant="acme", k=3, mode="fts")
    assert len(hits) == 3  # full-text search never needed it


@pytest.fixture
def vector_indexed_table(tmp_path: Path) -> Any:
    """A bare table of 2,000 rows, one fragment, with a vector index and a BTREE on the ids."""
    rng = np.random.default_rng(3)
    table = lancedb.connect(tmp_path).create_table("rows", _rows(rng, "old", 2_000))
    table.create_index("vector", config=IvfHnswSq(distance_type="cosine", num_partitions=4))
    table.create_index("id", config=BTree())
    return table


def _rows(rng: np.random.Generator, prefix: str, count: int) -> pa.Table:
    vectors = rng.standard_normal((count, 8)).astype(np.float32)
    return pa.table({"id": [f"{prefix}-{n}" for n in range(count)],
                     "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 8)})  # fmt: skip


def test_batched_ingests_into_a_vector_indexed_table_keep_few_fragments_and_one_index_segment(vector_indexed_table: Any):
    """Lance merges only fragments the same index segments cover, and a fold of the vector index
    adds a segment: unless each fold merges them back, merges stop and fragments pile up."""
    rng = np.random.default_rng(4)
    before = vector_indexed_table.version
    for n in range(60):
        vector_indexed_table.add(_rows(rng, f"new{n}", 8))
        compact(vector_indexed_table, batched=True)
    fragments = [fragment.metadata.num_rows for fragment in vector_indexed_table.to_lance().get_fragments()]
    assert fragments[0] == 2_000 and sum(fragments) == 2_480
    assert len(fragments) <= 1 + 2 + BATCHED_MERGE_FRAGMENTS  # the large one, merged tails, the ones not yet due
    assert {len(index.segments) for index in vector_indexed_table.to_lance().describe_indices()} == {1}
    assert vector_indexed_table.version - before <= 60 + 4 * 60 // BATCHED_MERGE_FRAGMENTS  # a merge: two folds, rewrite, remap
