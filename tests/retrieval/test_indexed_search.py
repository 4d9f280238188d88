"""Search over a table with a vector index and scalar indexes: the planned, index-served path.

A past LanceDB bug class lost or mis-filtered rows appended after an index was built; the
index-served prefilter is exact only for registered labels, so the post-check and the exact
fallback must catch a row that slipped past it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.appended_rows import group_of, new_rows

from ragwarden.bench.world import TENANT, World, append_rows
from ragwarden.governance.caller import Caller
from ragwarden.retrieval.search import Searcher
from ragwarden.warehouse import Warehouse

K = 10


@pytest.mark.parametrize("plan", ["index", "flat", "resident"])
def test_rows_appended_after_the_index_was_built_are_found_and_filtered(
    indexed_warehouse: Warehouse, small_world: World, plan: str
) -> None:
    """Lance's vector index, the exact scan, and the serving index built before the rows came
    (which scores them exactly beside its graph)."""
    reader, outsider = small_world.subjects[0.5], small_world.subjects[0.001]
    searcher = planned_searcher(indexed_warehouse, plan)
    new = new_rows(small_world, 15, group_of(indexed_warehouse, reader))
    append_rows(indexed_warehouse.store, new)
    policy = indexed_warehouse.policy
    for chunk_id, vector in zip(new.ids, new.vectors, strict=True):
        found = searcher.search("q", policy=policy, caller=Caller(subject=reader, tenant=TENANT), k=K, vector=vector)
        hits = found.hits
        assert hits[0].chunk_id == chunk_id
        found = searcher.search("q", policy=policy, caller=Caller(subject=outsider, tenant=TENANT), k=K, vector=vector)
        hits = found.hits
        assert not any(h.chunk_id.startswith("appended-") for h in hits)
    if plan == "resident":
        assert searcher.serving.status().version < indexed_warehouse.store.chunks.version  # the graph itself is older


def planned_searcher(warehouse: Warehouse, plan: str) -> Searcher:
    """A searcher that takes one plan for every broad caller; "resident" has its index built."""
    if plan != "resident":
        return Searcher(warehouse.store.read_doors(), None, flat_max_rows=-1 if plan == "index" else 10**9)  # type: ignore[arg-type]
    searcher = Searcher(warehouse.store.read_doors(), None, flat_max_rows=-1, resident_index_bytes=2**28, resident_min_rows=0)  # type: ignore[arg-type]
    searcher.serving.build_now()
    return searcher


def test_a_row_whose_label_slipped_past_the_registry_is_withheld_and_k_still_filled(
    indexed_warehouse: Warehouse, small_world: World
) -> None:
    reader = small_world.subjects[0.5]
    secret = new_rows(small_world, 1, group_of(indexed_warehouse, reader), labels=["unregistered-secret"], seed=2)
    append_rows(indexed_warehouse.store, secret, register_labels=False)
    assert "unregistered-secret" not in indexed_warehouse.store.registries.labels()
    found = indexed_warehouse._searcher.search(
        "q", policy=indexed_warehouse.policy, caller=Caller(subject=reader, tenant=TENANT), k=K, vector=secret.vectors[0]
    )
    hits, withheld = found.hits, found.withheld
    assert withheld == 1  # the indexed prefilter let it through; the post-check did not
    assert len(hits) == K and secret.ids[0] not in {h.chunk_id for h in hits}


def test_labels_are_registered_before_rows_carrying_them_are_written(
    indexed_warehouse: Warehouse, small_world: World
) -> None:
    before = indexed_warehouse.store.registries.version()
    reader = small_world.subjects[0.5]
    append_rows(indexed_warehouse.store, new_rows(small_world, 2, group_of(indexed_warehouse, reader), labels=["fresh"]))
    assert "fresh" in indexed_warehouse.store.registries.labels()
    assert indexed_warehouse.store.registries.version() != before  # every cached filter is recompiled


def test_an_erased_row_is_gone_from_the_vector_index_and_every_version(indexed_warehouse: Warehouse, small_world: World):
    reader = small_world.subjects[0.5]
    victim = new_rows(small_world, 1, group_of(indexed_warehouse, reader), seed=9)
    append_rows(indexed_warehouse.store, victim)
    indexed_warehouse.store.maintenance.optimize(vector_index_min_rows=1_000)  # folded into the vector index
    for plan in ("index", "flat"):
        forced = Searcher(indexed_warehouse.store.read_doors(), None, flat_max_rows=-1 if plan == "index" else 10**9)  # type: ignore[arg-type]
        hits = forced.search("q", policy=indexed_warehouse.policy, caller=Caller(subject=reader, tenant=TENANT), k=K, vector=victim.vectors[0]).hits
        assert hits[0].chunk_id == victim.ids[0]
    raw = victim.vectors[0].tobytes()
    folder = indexed_warehouse.store.local_path
    assert folder is not None

    def files_holding_it() -> list[Path]:
        return [p for p in folder.rglob("*") if p.is_file() and raw in p.read_bytes()]

    assert files_holding_it(), "positive control: the vector's bytes are on disk before the erasure"
    indexed_warehouse.store.chunks.delete(victim.ids)
    indexed_warehouse.store.maintenance.purge_history()
    assert indexed_warehouse.store.maintenance.versions_left()["chunks"] == 1
    for plan in ("index", "flat"):
        forced = Searcher(indexed_warehouse.store.read_doors(), None, flat_max_rows=-1 if plan == "index" else 10**9)  # type: ignore[arg-type]
        hits = forced.search("q", policy=indexed_warehouse.policy, caller=Caller(subject=reader, tenant=TENANT), k=K, vector=victim.vectors[0]).hits
        assert victim.ids[0] not in {h.chunk_id for h in hits}
    assert files_holding_it() == []
