"""Exact scans from memory: the same answers as scanning the table, and never past a commit."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pytest
from support.appended_rows import group_of, new_rows
from support.raw_tables import raw_table

from ragwarden.bench.world import TENANT, World, append_rows
from ragwarden.config import Settings
from ragwarden.governance.caller import Caller
from ragwarden.governance.sql import sql_in_list
from ragwarden.retrieval.search import Searcher
from ragwarden.retrieval.visible_rows import VisibleRowCache, VisibleRows
from ragwarden.warehouse import Warehouse

K = 10


def _flat(warehouse: Warehouse, cache_bytes: int) -> Searcher:
    return Searcher(warehouse.store.read_doors(), None, flat_max_rows=10**9, flat_cache_bytes=cache_bytes)  # type: ignore[arg-type]


def _search(searcher: Searcher, warehouse: Warehouse, subject: str, vector: np.ndarray) -> list[tuple[str, float]]:
    found = searcher.search("q", policy=warehouse.policy, caller=Caller(subject=subject, tenant=TENANT), k=K, vector=vector)
    hits = found.hits
    return [(hit.chunk_id, hit.score) for hit in hits]


@pytest.mark.parametrize("share", [0.5, 0.01])
def test_a_held_scan_answers_as_the_table_scan_does(indexed_warehouse: Warehouse, small_world: World, share: float):
    held, read = _flat(indexed_warehouse, 64 * 2**20), _flat(indexed_warehouse, 0)
    subject = small_world.subjects[share]
    for vector in small_world.rows.vectors[:12]:
        from_memory, from_table = _search(held, indexed_warehouse, subject, vector), _search(read, indexed_warehouse, subject, vector)
        assert [c for c, _ in from_memory] == [c for c, _ in from_table]
        assert np.allclose([s for _, s in from_memory], [s for _, s in from_table], atol=1e-5)
    assert len(held.visible) == 1 and len(read.visible) == 0


def test_a_commit_is_seen_by_the_next_search(indexed_warehouse: Warehouse, small_world: World):
    searcher = _flat(indexed_warehouse, 64 * 2**20)
    reader = small_world.subjects[0.5]
    first = new_rows(small_world, 1, group_of(indexed_warehouse, reader), seed=5)
    append_rows(indexed_warehouse.store, first)
    assert _search(searcher, indexed_warehouse, reader, first.vectors[0])[0][0] == first.ids[0]

    indexed_warehouse.store.chunks.delete(first.ids)  # erased: gone from the very next search
    assert first.ids[0] not in {c for c, _ in _search(searcher, indexed_warehouse, reader, first.vectors[0])}

    second = new_rows(small_world, 1, group_of(indexed_warehouse, reader), seed=6)
    append_rows(indexed_warehouse.store, second)  # written: found by the very next search
    assert _search(searcher, indexed_warehouse, reader, second.vectors[0])[0][0] == second.ids[0]


def test_a_row_whose_vector_cannot_be_ranked_is_never_returned():
    vectors = pa.array([[1.0, 0.0], [0.0, 0.0], [float("nan"), 1.0], None, [0.6, 0.8]], type=pa.list_(pa.float32(), 2))
    rows = VisibleRows.from_arrow(pa.table({"chunk_id": ["a", "zero", "nan", "null", "b"], "vector": vectors}), 2)
    ranked = rows.top(np.array([1.0, 0.0], dtype=np.float32), 10)
    assert [(row["chunk_id"], round(score, 3)) for row, score in ranked] == [("a", 1.0), ("b", 0.6)]
    assert rows.top(np.zeros(2, dtype=np.float32), 10) == []


def _rows(count: int) -> VisibleRows:
    return VisibleRows(rows=pa.table({"chunk_id": [str(i) for i in range(count)]}), vectors=np.ones((count, 4), np.float32))


def test_the_cache_keeps_its_budget_evicting_the_least_recently_used():
    one = _rows(100)
    cache = VisibleRowCache(max_bytes=int(one.nbytes * 4.5))
    for name in "abcd":
        cache.get((name, 1), lambda: _rows(100))
    cache.get(("a", 1), lambda: pytest.fail("'a' was held"))  # now the most recently used
    cache.get(("e", 1), lambda: _rows(100))
    assert len(cache) == 4 and cache.nbytes <= cache.max_bytes
    cache.get(("a", 1), lambda: pytest.fail("'a' was evicted before 'b'"))
    assert cache.get(("b", 1), lambda: None) is None  # 'b' was the one evicted


def test_the_cache_holds_a_bounded_number_of_sets_however_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller sending a new filter at each search makes a small set each time: the count of sets
    held is bounded too, not only their bytes."""
    monkeypatch.setattr("ragwarden.retrieval.visible_rows.SETS_KEPT", 3)
    cache = VisibleRowCache(max_bytes=10**9)
    for name in "abcde":
        cache.get((name, 1), lambda: _rows(1))
    assert len(cache) == 3 and cache.get(("a", 1), lambda: None) is None, "the least recently used went first"


def test_a_set_over_a_quarter_of_the_budget_is_returned_but_not_held():
    big = _rows(1000)
    cache = VisibleRowCache(max_bytes=big.nbytes * 3)
    assert cache.get(("big", 1), lambda: big) is big
    assert len(cache) == 0 and not cache.fits(1000, 4)


def test_searches_that_miss_one_set_together_read_it_once():
    """After a commit, the searches arriving together share one read of the new version's rows."""
    cache = VisibleRowCache(max_bytes=10**9)
    reading = threading.Event()
    release = threading.Event()

    def slow_load() -> VisibleRows:
        reading.set()
        release.wait(10)
        return _rows(100)

    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(cache.get, ("new", 2), slow_load)
        assert reading.wait(10)
        others = [pool.submit(cache.get, ("new", 2), slow_load) for _ in range(7)]
        release.set()
        held = first.result(10)
        assert all(other.result(10) is held for other in others)
    assert cache.loads == 1


def test_a_failed_shared_read_is_tried_again_by_the_searches_that_waited_for_it():
    cache = VisibleRowCache(max_bytes=10**9)
    reading, release = threading.Event(), threading.Event()

    def failing() -> VisibleRows:
        reading.set()
        release.wait(10)
        raise OSError("connection reset")

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(cache.get, ("k", 1), failing)
        assert reading.wait(10)
        second = pool.submit(cache.get, ("k", 1), lambda: _rows(10))
        release.set()
        with pytest.raises(OSError, match="connection reset"):
            first.result(10)
        assert second.result(10).rows.num_rows == 10


def _retag(warehouse: Warehouse, chunk_ids: list[str], column: str, value: object) -> None:
    """A commit rewriting one column of the rows (a sync's tags, a re-ingest's uri), their text and vector untouched."""
    schema = warehouse.store.chunks.schema
    columns = pa.schema([schema.field("chunk_id"), schema.field(column)])
    warehouse.store.chunks.replace_columns(pa.table({"chunk_id": chunk_ids, column: [value] * len(chunk_ids)}, schema=columns))


@pytest.mark.parametrize("commit", ["append", "retag", "erase", "compact"])
def test_a_held_set_carried_past_a_commit_answers_as_a_fresh_read_does(
    indexed_warehouse: Warehouse, small_world: World, commit: str
):
    """After a commit the held rows keep their texts and vectors and take their current tags, and
    only rows new to the filter are read: the answers are a fresh read's, row for row."""
    held = _flat(indexed_warehouse, 64 * 2**20)
    reader = small_world.subjects[0.5]
    queries = small_world.rows.vectors[:6]
    before = [_search(held, indexed_warehouse, reader, vector) for vector in queries]
    top = [chunk_id for chunk_id, _ in before[0][:3]]
    if commit == "append":
        append_rows(indexed_warehouse.store, new_rows(small_world, 5, group_of(indexed_warehouse, reader), seed=7))
    elif commit == "retag":
        _retag(indexed_warehouse, top, "acl_allow", ["group:nobody"])
    elif commit == "erase":
        indexed_warehouse.store.chunks.delete(top)
    else:  # a tenth of the rows, none the reader's, deleted: optimize rewrites the fragment the rest are in
        principals = set(indexed_warehouse.policy.principals(reader, TENANT))
        rows = indexed_warehouse.store.chunks.rows_where("tenant IS NOT NULL", ["chunk_id", "acl_allow"])
        unseen = [row["chunk_id"] for row in rows if not principals & set(row["acl_allow"])][: len(rows) // 8]
        raw_table(indexed_warehouse.store).delete(f"chunk_id IN {sql_in_list(unseen)}")
        (fragment,) = raw_table(indexed_warehouse.store).to_lance().get_fragments()
        indexed_warehouse.store.maintenance.optimize(vector_index_min_rows=1_000)
        assert [f.fragment_id for f in raw_table(indexed_warehouse.store).to_lance().get_fragments()] != [fragment.fragment_id]
    after = [_search(held, indexed_warehouse, reader, vector) for vector in queries]
    fresh = _flat(indexed_warehouse, 64 * 2**20)
    assert after == [_search(fresh, indexed_warehouse, reader, vector) for vector in queries]
    if commit in ("retag", "erase"):
        assert not set(top) & {chunk_id for chunk_id, _ in after[0]}, "a row the reader lost came back"
    assert held.retags == 1 and held.visible.loads == 2


def test_a_row_given_back_to_the_reader_is_read_into_the_held_set(indexed_warehouse: Warehouse, small_world: World):
    held = _flat(indexed_warehouse, 64 * 2**20)
    reader = small_world.subjects[0.01]
    vector = small_world.rows.vectors[0]
    mine = _search(held, indexed_warehouse, reader, vector)[0][0]
    acl = small_world.rows.acl_allow[small_world.rows.ids.index(mine)]
    _retag(indexed_warehouse, [mine], "acl_allow", ["group:nobody"])
    assert mine not in {c for c, _ in _search(held, indexed_warehouse, reader, vector)}
    _retag(indexed_warehouse, [mine], "acl_allow", list(acl))
    assert _search(held, indexed_warehouse, reader, vector)[0][0] == mine and held.retags == 2


def test_a_held_row_whose_tags_changed_is_checked_and_shown_with_its_current_tags(
    indexed_warehouse: Warehouse, small_world: World
):
    held = _flat(indexed_warehouse, 64 * 2**20)
    reader = small_world.subjects[0.5]
    caller = Caller(subject=reader, tenant=TENANT)
    vector = small_world.rows.vectors[0]

    def top_hit():  # noqa: ANN202 - a Hit
        return held.search("q", policy=indexed_warehouse.policy, caller=caller, k=K, vector=vector).hits[0]

    first = top_hit()
    label = next(f"l{n}" for n in range(20) if (f"l{n}",) != first.labels)  # one the reader is cleared for
    _retag(indexed_warehouse, [first.chunk_id], "labels", [label])
    again = top_hit()
    assert again.chunk_id == first.chunk_id and held.retags == 1
    assert again.labels == (label,)


def test_many_rows_new_to_a_held_set_are_read_with_the_whole_set(
    indexed_warehouse: Warehouse, small_world: World, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr("ragwarden.state.chunks.IN_LIST_MAX_IDS", 2)  # past it: no IN list of the new ids
    held = _flat(indexed_warehouse, 64 * 2**20)
    reader = small_world.subjects[0.5]
    _search(held, indexed_warehouse, reader, small_world.rows.vectors[0])
    added = new_rows(small_world, 5, group_of(indexed_warehouse, reader), seed=9)
    append_rows(indexed_warehouse.store, added)
    fresh = _flat(indexed_warehouse, 64 * 2**20)
    for vector in added.vectors:
        assert _search(held, indexed_warehouse, reader, vector) == _search(fresh, indexed_warehouse, reader, vector)
    assert held.retags == 1


def test_a_held_row_whose_document_moved_shows_its_new_uri(indexed_warehouse: Warehouse, small_world: World):
    """A re-ingest under a new uri keeps the chunk ids (they hash the text) and rewrites source_uri."""
    held = _flat(indexed_warehouse, 64 * 2**20)
    reader = small_world.subjects[0.5]
    caller = Caller(subject=reader, tenant=TENANT)
    vector = small_world.rows.vectors[0]
    first = held.search("q", policy=indexed_warehouse.policy, caller=caller, k=K, vector=vector).hits[0]
    _retag(indexed_warehouse, [first.chunk_id], "source_uri", "s3://moved/elsewhere")
    again = held.search("q", policy=indexed_warehouse.policy, caller=caller, k=K, vector=vector).hits[0]
    assert again.chunk_id == first.chunk_id and again.source_uri == "s3://moved/elsewhere" and held.retags == 1


def test_a_search_answers_at_the_version_its_request_checked_though_another_writer_commits_before_it_reads(
    indexed_warehouse: Warehouse, small_world: World
):
    """One ingest is several commits in a second: searches in flight across them read their own
    version (held, exact) rather than each falling back to a scan through Lance at the latest."""
    searcher = _flat(indexed_warehouse, 64 * 2**20)
    reader = small_world.subjects[0.5]
    later = new_rows(small_world, 1, group_of(indexed_warehouse, reader), seed=7)
    replica = Warehouse(Settings(warehouse=indexed_warehouse.uri), embedder=None)  # type: ignore[arg-type]
    with indexed_warehouse.store.pinned() as versions:
        append_rows(replica.store, later)  # committed after this request's freshness check
        found = searcher.search("q", policy=indexed_warehouse.policy, caller=Caller(subject=reader, tenant=TENANT),
                                k=K, vector=later.vectors[0])  # fmt: skip
    assert indexed_warehouse.store.chunks.latest_version() > versions.chunks
    assert later.ids[0] not in {hit.chunk_id for hit in found.hits}
    assert {hit.table_version for hit in found.hits} == {versions.chunks}
    assert _search(searcher, indexed_warehouse, reader, later.vectors[0])[0][0] == later.ids[0]  # the next request
