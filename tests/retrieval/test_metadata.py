"""A record's metadata comes back on every hit, follows the record when it changes (even with the
text unchanged, which keeps the chunk ids), and goes into derived rows' lineage, never into their
governance."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from ragwarden.bench.world import TENANT, World
from ragwarden.governance.caller import Caller
from ragwarden.governance.tags import Classification
from ragwarden.ingest.records import MAX_METADATA_BYTES
from ragwarden.retrieval.search import Searcher
from ragwarden.warehouse import Warehouse

from .test_indexed_search import planned_searcher

ALICE = {"subject": "user:alice", "tenant": "acme"}
METADATA = {"title": "Q3 budget", "year": 2026, "tags": ["plan", "draft"], "owner": {"name": "Zoë O'Neil"}}


@pytest.fixture
def record_with_metadata(make_record: Any) -> dict[str, Any]:
    return make_record(id="budget-q3", metadata=METADATA)


def test_a_records_metadata_comes_back_on_every_hit(demo_policy_warehouse: Warehouse, record_with_metadata):
    assert demo_policy_warehouse.ingest_records([record_with_metadata]).ok
    (hit,) = demo_policy_warehouse.search("quarterly budget review", k=1, **ALICE)
    assert hit.metadata == METADATA and hit.as_dict()["metadata"] == METADATA
    assert demo_policy_warehouse.get_chunk(hit.chunk_id, **ALICE).metadata == METADATA
    for mode in ("fts", "hybrid"):
        assert demo_policy_warehouse.search("budget", k=1, mode=mode, **ALICE)[0].metadata == METADATA


def test_new_metadata_on_unchanged_text_is_written_and_returned(demo_policy_warehouse: Warehouse, record_with_metadata):
    """Same text, so the same chunk ids: the row is rewritten and a search that held it sees the new metadata."""
    demo_policy_warehouse.ingest_records([record_with_metadata])
    (before,) = demo_policy_warehouse.search("quarterly budget review", k=1, **ALICE)
    report = demo_policy_warehouse.ingest_records([{**record_with_metadata, "metadata": {"title": "Q3 budget, final"}}])
    assert report.documents == 1 and report.unchanged == 0
    (after,) = demo_policy_warehouse.search("quarterly budget review", k=1, **ALICE)
    assert after.chunk_id == before.chunk_id and after.metadata == {"title": "Q3 budget, final"}
    assert demo_policy_warehouse.ingest_records([{**record_with_metadata, "metadata": {"title": "Q3 budget, final"}}]).unchanged == 1


@pytest.mark.parametrize("plan", ["flat", "resident", "index"])
def test_held_rows_and_the_serving_index_take_a_rows_current_metadata(
    indexed_warehouse: Warehouse, small_world: World, plan: str
):
    """The held scan and the serving index keep what a chunk id fixes; metadata is not that."""
    searcher: Searcher = planned_searcher(indexed_warehouse, plan)
    caller, query = Caller(subject=small_world.subjects[0.5], tenant=TENANT), small_world.rows.vectors[0]

    def top() -> Any:
        return searcher.search("q", policy=indexed_warehouse.policy, caller=caller, k=1, vector=query).hits[0]

    first = top()
    assert first.metadata.keys() == {"bucket"}
    store = indexed_warehouse.store
    fields = pa.schema([store.chunks.schema.field(name) for name in ("chunk_id", "metadata")])
    store.chunks.replace_columns(pa.table({"chunk_id": [first.chunk_id], "metadata": [json.dumps({"title": "renamed"})]}, schema=fields))
    again = top()
    assert again.chunk_id == first.chunk_id and again.metadata == {"title": "renamed"}


def test_a_derived_row_cites_its_parents_metadata_and_takes_none_of_it_as_governance(
    demo_policy_warehouse: Warehouse, make_record: Any
):
    posing = {"labels": [], "acl": {"allow": ["group:everyone"]}, "classification": "public", "title": "Pay bands"}
    record = make_record(id="pay", text="Pay bands for 2026 by grade.", labels=["comp"], classification="confidential",
                         metadata=posing)  # fmt: skip
    demo_policy_warehouse.ingest_records([record])
    (parent,) = demo_policy_warehouse.search("pay bands", k=1, **ALICE)
    derived = demo_policy_warehouse.derive("Pay bands rise with grade.", parents=[parent.chunk_id], **ALICE)
    row = demo_policy_warehouse.get_chunk(derived.chunk_id, **ALICE)
    assert row.metadata == {"derived_from": [
        {"chunk_id": parent.chunk_id, "doc_id": "pay", "source_uri": parent.source_uri, "metadata": posing}
    ]}  # fmt: skip
    assert row.labels == ("comp",) and row.classification == Classification.CONFIDENTIAL
    assert list(derived.tags.acl_allow) == ["group:finance"]


@pytest.mark.parametrize(
    ("metadata", "named"),
    [
        ({"score": float("nan")}, "NaN or infinity"),
        ({1: "x"}, "keys must be strings"),
        ({"blob": "x" * MAX_METADATA_BYTES}, f"the limit is {MAX_METADATA_BYTES}"),
        (["title"], "metadata must be an object"),
    ],
)
def test_metadata_a_row_cannot_carry_is_refused_naming_the_record(
    fresh_warehouse: Warehouse, make_record: Any, metadata: Any, named: str
):
    report = fresh_warehouse.ingest_records([make_record(metadata=metadata)])
    (rejected,) = report.rejected
    assert report.documents == 0 and "doc-1" in rejected.source + rejected.reason and named in rejected.reason
