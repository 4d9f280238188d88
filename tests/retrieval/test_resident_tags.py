"""The resident tags: every row's governance tags held as codes, moved by each commit's delta.

Checked against Lance itself: for every subject of the synthetic world (two tenants, nested groups,
labels, deny lists, every classification), the rows the resident mask admits are exactly the rows
the compiled filter admits in SQL; after each kind of commit (append, a re-tag rewriting rows, an
in-place column update, a delete, a compaction) the state moved by the delta equals one built
afresh at the new version, and moving it read only what the commit wrote.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from support.appended_rows import group_of, new_rows
from support.bm25 import bm25_ranking

from ragwarden.bench.world import TENANT, World, append_rows
from ragwarden.governance.caller import Caller
from ragwarden.governance.compiler import SubjectView, compile_filter
from ragwarden.retrieval import patched
from ragwarden.retrieval.lexical import query_terms
from ragwarden.retrieval.resident_state import ResidentState, advanced
from ragwarden.retrieval.resident_tags import TAG_READ_COLUMNS
from ragwarden.retrieval.search import Searcher
from ragwarden.stages import counting
from ragwarden.state import TAG_COLUMNS, ChunkWrite
from ragwarden.warehouse import Warehouse

OTHER_TENANT = "globex"


def _resident_searcher(warehouse: Warehouse) -> Searcher:
    searcher = Searcher(warehouse.store.read_doors(), None, flat_max_rows=-1, resident_index_bytes=2**28, resident_min_rows=0)  # type: ignore[arg-type]
    searcher.serving.build_now()
    return searcher


def _views(warehouse: Warehouse, world: World) -> list[SubjectView]:
    policy = warehouse.policy
    assert policy is not None
    subjects = sorted({*world.subjects.values(), "user:nobody"})
    return [SubjectView.of(policy, subject, tenant) for subject in subjects for tenant in (TENANT, OTHER_TENANT)]


def _admitted(state: ResidentState, view: SubjectView, clauses: dict[str, list[str]]) -> set[str]:
    """The chunk ids of the slots the resident mask admits for ``view``."""
    mask = state.visible(view, view.satisfied_clauses(clauses)).mask
    slots = np.flatnonzero(mask)
    held = slots[slots < state.index.rows]
    ids = set(state.index.chunk_ids.take(pa.array(held)).to_pylist())
    fresh = slots[slots >= state.index.rows] - state.index.rows
    return ids | set(state.fresh.column("chunk_id").take(pa.array(fresh)).to_pylist())


def _filtered(warehouse: Warehouse, view: SubjectView, clauses: dict[str, list[str]]) -> set[str]:
    """The chunk ids the compiled filter admits, read by Lance."""
    where = compile_filter(view, view.satisfied_clauses(clauses))
    return set(warehouse.store.chunks.read_at(None, where, ["chunk_id"]).column("chunk_id").to_pylist())


def _tags_by_id(state: ResidentState) -> dict[str, dict]:
    live = np.flatnonzero(state.tags.row_sets.dense() >= 0)
    ids = [state.index.chunk_ids[int(s)].as_py() if s < state.index.rows else state.fresh.column("chunk_id")[int(s) - state.index.rows].as_py()
           for s in live]  # fmt: skip
    return dict(zip(ids, state.tags.current(live), strict=True))


def _table_tags(warehouse: Warehouse) -> dict[str, dict]:
    rows = warehouse.store.chunks.read_at(None, "TRUE", TAG_READ_COLUMNS).to_pylist()
    return {row.pop("chunk_id"): row for row in rows}


def _assert_same_as_lance(warehouse: Warehouse, world: World, state: ResidentState) -> None:
    clauses = warehouse.store.registries.clauses()
    for view in _views(warehouse, world):
        assert _admitted(state, view, clauses) == _filtered(warehouse, view, clauses), (view.subject, view.tenant)
    assert _tags_by_id(state) == _table_tags(warehouse)
    _assert_bm25_over_what_lance_admits(warehouse, world, state)


def _assert_bm25_over_what_lance_admits(warehouse: Warehouse, world: World, state: ResidentState) -> None:
    """The resident terms score BM25 over exactly the rows the compiled filter admits, with N and
    the average length over them: asked for words a few rows each hold (every 40th row's last
    word, and the first 40 rows' that the commits rewrite or delete), for every reader of the tenant."""
    clauses = warehouse.store.registries.clauses()
    texts = warehouse.store.chunks.read_at(None, "TRUE", ["chunk_id", "text"]).sort_by("chunk_id").column("text").to_pylist()
    query = " ".join(text.rsplit(" ", 1)[-1] for text in texts[:40] + texts[::40])
    views = [view for view in _views(warehouse, world) if view.tenant == TENANT]
    for view in views:
        where = compile_filter(view, view.satisfied_clauses(clauses))
        rows = warehouse.store.chunks.read_at(None, where, ["chunk_id", "text"]).to_pylist()
        expected = bm25_ranking(rows, query, 1_000)
        ranked = state.lexical(state.visible(view, view.satisfied_clauses(clauses)), query_terms(query), 1_000)
        assert [row["chunk_id"] for row, _ in ranked] == [chunk_id for chunk_id, _ in expected], view.subject
        assert [score for _, score in ranked] == pytest.approx([score for _, score in expected], rel=0, abs=1e-6)


def test_the_resident_mask_admits_exactly_the_rows_the_compiled_filter_admits(indexed_warehouse: Warehouse, small_world: World):
    state = _resident_searcher(indexed_warehouse).serving.state(indexed_warehouse.store.chunks.version)
    assert state is not None and state.tags.live == small_world.rows.vectors.shape[0]
    assert len(state.tags.catalog.sets().rows) < state.tags.live / 5, "rows are grouped into far fewer tag sets"
    _assert_same_as_lance(indexed_warehouse, small_world, state)


def _retag(warehouse: Warehouse, ids: list[str], allow: list[str], labels: list[str]) -> None:
    """Rewrite rows with new tags as the lifecycle does (their old rows removed in the same commit)."""
    def plan(snapshot):  # type: ignore[no-untyped-def]
        rows = [{**row, "acl_allow": allow, "labels": labels} for row in snapshot.rows(ids).values()]
        return ChunkWrite(rows=rows), None

    warehouse.store.chunks.write(plan, what="re-tagging rows for a test")


@pytest.mark.parametrize("fold_min", [patched.FOLD_MIN, 1], ids=["patched", "folded"])
@pytest.mark.parametrize("commit", ["append", "retag", "retag to a reader", "column update", "delete", "compaction", "retag then delete",
                                    "duplicate appended then retag"])
def test_a_state_moved_by_a_commits_delta_equals_one_built_afresh(
    indexed_warehouse: Warehouse, small_world: World, commit: str, fold_min: int, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(patched, "FOLD_MIN", fold_min)  # the per-row arrays' changes kept as patches, or folded at once
    monkeypatch.setattr(patched, "FOLD_SHARE", patched.FOLD_SHARE if fold_min > 1 else 0.0)
    store = indexed_warehouse.store
    searcher = _resident_searcher(indexed_warehouse)
    before = searcher.serving.state(store.chunks.version)
    assert before is not None
    reader = small_world.subjects[0.5]
    some = sorted(before.index.chunk_ids.to_pylist())[:40]
    if commit == "append":
        append_rows(store, new_rows(small_world, 25, group_of(indexed_warehouse, reader)))
    elif commit == "retag":
        _retag(indexed_warehouse, some, [group_of(indexed_warehouse, reader)], ["hr"])
    elif commit == "retag to a reader":  # rows that reader could not read take the tags of one it reads
        view = SubjectView.of(indexed_warehouse.policy, reader, TENANT)  # type: ignore[arg-type]
        readable = before.visible(view, view.satisfied_clauses(store.registries.clauses())).mask
        template = before.tags.current([int(np.flatnonzero(readable)[0])])[0]
        hidden = [c for c, ok in zip(some, readable[before.index.positions(pa.array(some))], strict=True) if not ok]
        assert hidden, "rows the reader cannot read yet"
        store.chunks.write(lambda snapshot: (ChunkWrite(rows=[{**row, **{c: template[c] for c in TAG_COLUMNS}}
                                                              for row in snapshot.rows(hidden).values()]), None),
                           what="widening rows for a test")  # fmt: skip
    elif commit == "column update":
        fields = pa.schema([store.chunks.schema.field(name) for name in ("chunk_id", "metadata", "acl_allow")])
        store.chunks.replace_columns(pa.table({"chunk_id": some, "metadata": [json.dumps({"n": i}) for i in range(40)],
                                               "acl_allow": [["user:nobody"]] * 40}, schema=fields))  # fmt: skip
    elif commit == "delete":
        store.chunks.delete(some)
    elif commit == "retag then delete":  # two commits, one delta: rows rewritten, others removed
        _retag(indexed_warehouse, some[:20], [group_of(indexed_warehouse, reader)], ["hr"])
        store.chunks.delete(some[20:])
    elif commit == "duplicate appended then retag":  # an append that removes nothing beside a merge
        fields = store.chunks.schema
        duplicate = store.chunks.read_at(None, f"chunk_id = '{some[0]}'", fields.names).cast(fields)
        store.chunks.load_rows(duplicate)
        _retag(indexed_warehouse, some[1:10], [group_of(indexed_warehouse, reader)], ["hr"])
    else:
        append_rows(store, new_rows(small_world, 25, group_of(indexed_warehouse, reader)))
        store.chunks.delete(some[:5])
        store.maintenance.optimize(vector_index_min_rows=1_000)
    moved = searcher.serving.state(store.chunks.latest_version())
    assert moved is not None and moved.version == store.chunks.latest_version() > before.version
    _assert_same_as_lance(indexed_warehouse, small_world, moved)


def test_moving_the_state_past_an_append_reads_the_rows_written_and_no_others(indexed_warehouse: Warehouse, small_world: World):
    store = indexed_warehouse.store
    state = _resident_searcher(indexed_warehouse).serving.state(store.chunks.version)
    append_rows(store, new_rows(small_world, 100, group_of(indexed_warehouse, small_world.subjects[0.5])))
    with counting() as measured:
        moved = advanced(state, store.chunks, store.chunks.latest_version())  # type: ignore[arg-type]
    assert moved is not None and moved.fresh_rows == 100
    assert measured["rows_read"] == 100, "the new rows, tags, content and vectors in one read: nothing else"


def test_a_narrowing_retag_is_applied_by_the_very_next_search(indexed_warehouse: Warehouse, small_world: World):
    searcher = _resident_searcher(indexed_warehouse)
    reader = small_world.subjects[0.5]
    caller, policy = Caller(subject=reader, tenant=TENANT), indexed_warehouse.policy
    query = small_world.rows.vectors[0]
    first = searcher.search("q", policy=policy, caller=caller, k=10, vector=query).hits
    assert first
    _retag(indexed_warehouse, [h.chunk_id for h in first], ["user:nobody"], [])
    again = searcher.search("q", policy=policy, caller=caller, k=10, vector=query)
    assert not {h.chunk_id for h in first} & {h.chunk_id for h in again.hits}
    assert again.withheld == 0 and again.table_version == indexed_warehouse.store.chunks.latest_version()


def test_callers_never_seen_leave_nothing_held_per_caller(indexed_warehouse: Warehouse, small_world: World):
    """The resident plan keeps one state per process; a caller's mask lives for its search."""
    searcher = _resident_searcher(indexed_warehouse)
    state = searcher.serving.state(indexed_warehouse.store.chunks.version)
    query = small_world.rows.vectors[3]
    for subject in sorted(set(small_world.subjects.values())):
        for mode in ("vector", "fts", "hybrid"):
            found = searcher.search("synthetic row", policy=indexed_warehouse.policy, caller=Caller(subject=subject, tenant=TENANT),
                                    k=10, vector=query, mode=mode)  # fmt: skip
            assert found.table_version == state.version  # type: ignore[union-attr]
    assert searcher.visible.loads == 0, "no visible set, analysed rows or fields read and held for any caller"
    assert searcher.serving.state(indexed_warehouse.store.chunks.version) is state
