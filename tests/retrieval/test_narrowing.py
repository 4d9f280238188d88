"""Narrowing filters: what a filter matches is what a plain reading of it says (an oracle in
Python, over metadata full of quotes, SQL and JSON look-alikes), a search under one returns the
exact top-k of the rows both visible and matching on every plan, and nothing a filter says can
widen what the caller may read."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.appended_rows import group_of, new_rows
from support.raw_tables import raw_table

from ragwarden.bench.world import TENANT, World, append_rows, generate, write_warehouse
from ragwarden.config import Settings
from ragwarden.errors import InvalidRequestError
from ragwarden.governance.caller import Caller
from ragwarden.governance.visibility import check_row
from ragwarden.retrieval.narrowing import narrowing
from ragwarden.retrieval.search import Searcher
from ragwarden.retrieval.visible_fields import FIELD_COLUMNS, VisibleFields
from ragwarden.warehouse import Warehouse

HOSTILE_TEXT = ["", "O'Brien", "' OR 1=1 --", "') OR ('1'='1", '"quoted"', "back\\slash", "é ü 中", "line\nbreak",
                "%_", "2020", "true", "null", "$eq", "\u2028", "a''b", "*/ DROP TABLE chunks; /*"]  # fmt: skip
NUMBERS = [0, -1, 1.5, 2020, 2020.0, 1e300, -2.5e-8, 9_007_199_254_740_993]
STORED = [*HOSTILE_TEXT, *NUMBERS, True, False, None, [1, "x"], {"a": 1}]
FIELDS = ["year", "title", "tag", "with space.dot", "é", "labels", "doc_id"]
"""Metadata keys; the last two are reached as ``metadata.labels`` and ``metadata.doc_id``."""
START = datetime(2026, 1, 1, tzinfo=UTC)
K = 10


def _metadata(rng: np.random.Generator) -> dict[str, Any]:
    return {key: STORED[rng.integers(len(STORED))] for key in FIELDS if rng.random() < 0.6}


@pytest.fixture(scope="module")
def world() -> World:
    return generate(3_000, seed=11)


@pytest.fixture(scope="module")
def hostile_metadata_warehouse(world: World, tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    """A world whose rows carry metadata drawn from values built to break quoting (and a
    ``created_at`` an hour apart each), indexed as a large table is."""
    folder: Path = tmp_path_factory.mktemp("narrowing") / "wh"
    store = write_warehouse(world, folder)
    rng = np.random.default_rng(5)
    ids = world.rows.ids
    schema = store.chunks.schema
    store.chunks.replace_columns(
        pa.table({
            "chunk_id": ids,
            "metadata": [json.dumps(_metadata(rng)) for _ in ids],
            "created_at": [START + timedelta(hours=i) for i in range(len(ids))],
        }, schema=pa.schema([schema.field(name) for name in ("chunk_id", "metadata", "created_at")]))
    )  # fmt: skip
    store.maintenance.optimize(vector_index_min_rows=1_000)
    return Warehouse(Settings(warehouse=str(folder)), embedder=None)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def stored_rows(hostile_metadata_warehouse: Warehouse) -> list[dict[str, Any]]:
    rows = raw_table(hostile_metadata_warehouse.store).to_arrow().to_pylist()
    for row in rows:
        row["metadata"] = json.loads(row["metadata"])
    return rows


# -- the oracle: a filter read plainly ------------------------------------------------------------


def _same(stored: object, given: object) -> bool:
    """Typed equality, as JSON sees values: a string is never a number, nor a boolean a number."""
    if isinstance(given, bool) or isinstance(stored, bool):
        return isinstance(given, bool) and isinstance(stored, bool) and stored == given
    if isinstance(given, (int, float)):
        return isinstance(stored, (int, float)) and float(stored) == float(given)
    return isinstance(stored, str) and stored == given


def _ordered(stored: object, operator: str, given: object) -> bool:
    if isinstance(stored, bool) or not isinstance(stored, (int, float, str, datetime)):
        return False
    if isinstance(given, (int, float)) != isinstance(stored, (int, float)):
        return False
    a, b = (float(stored), float(given)) if isinstance(given, (int, float)) else (stored, given)  # type: ignore[arg-type]
    return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[operator]  # type: ignore[operator]


def _value(row: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    if name in ("doc_id", "source_uri", "kind", "created_at"):
        return row[name] is not None, row[name]
    key = name.removeprefix("metadata.")
    return key in row["metadata"], row["metadata"].get(key)


def _time(value: str) -> datetime:
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _holds(operator: str, value: Any, present: bool, stored: Any, *, timed: bool) -> bool:
    """One comparison of a stored field (``present`` or not) with a filter's value."""
    if timed:
        value = [_time(v) for v in value] if isinstance(value, list) else _time(value)

    def equal(v: Any) -> bool:
        return present and (stored == v if timed else _same(stored, v))

    if operator == "$eq":
        return equal(value)
    if operator == "$ne":
        return present and not equal(value)
    if operator == "$in":
        return any(equal(v) for v in value)
    if operator == "$nin":
        return present and not any(equal(v) for v in value)
    return present and _ordered(stored, operator, value)


def matches(expression: Mapping[str, Any], row: Mapping[str, Any]) -> bool:
    for name, condition in expression.items():
        if name == "$and" and not all(matches(part, row) for part in condition):
            return False
        if name == "$or" and not any(matches(part, row) for part in condition):
            return False
        if name in ("$and", "$or"):
            continue
        present, stored = _value(row, name)
        for operator, value in (condition if isinstance(condition, Mapping) else {"$eq": condition}).items():
            held = _holds(operator, value, present, stored, timed=name == "created_at")
            if not held:
                return False
    return True


# -- filters as a user could write them -----------------------------------------------------------

_metadata_name = st.sampled_from([*FIELDS[:5], "metadata.labels", "metadata.doc_id", "absent"])
_scalar = st.sampled_from([*HOSTILE_TEXT, *NUMBERS, True, False]) | st.floats(-1e6, 1e6, allow_nan=False)
_number = st.sampled_from(NUMBERS) | st.floats(-3000, 3000, allow_nan=False) | st.integers(-5, 2025)


STORED_IDS = [f"r{i:07d}" for i in range(0, 3_000, 7)]  # ids the world writes (``bench.world``)


@st.composite
def _leaf(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["metadata", "metadata", "metadata", "text", "time"]))
    if kind == "metadata":
        name = draw(_metadata_name)
        operator = draw(st.sampled_from(["$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "bare"]))
        if operator in ("$in", "$nin"):
            value: Any = draw(st.lists(_scalar, min_size=1, max_size=4))
        else:
            value = draw(_number if operator.startswith(("$g", "$l")) else _scalar)
    elif kind == "text":
        name = draw(st.sampled_from(["doc_id", "source_uri", "kind"]))
        values = {"doc_id": STORED_IDS, "source_uri": [f"bench://{i}" for i in STORED_IDS], "kind": ["chunk", "summary"]}[name]
        pick = st.sampled_from(values) | st.sampled_from(HOSTILE_TEXT)
        operator = draw(st.sampled_from(["$eq", "$ne", "$in", "$nin", "$gt", "$lte", "bare"]))
        value = draw(st.lists(pick, min_size=1, max_size=4) if operator in ("$in", "$nin") else pick)
    else:
        name = "created_at"
        operator = draw(st.sampled_from(["$gt", "$gte", "$lt", "$lte", "$eq", "$in"]))
        hours = st.integers(-10, 3010).map(lambda h: (START + timedelta(hours=h)).isoformat())
        value = draw(st.lists(hours, min_size=1, max_size=3) if operator == "$in" else hours)
    return {name: value} if operator == "bare" else {name: {operator: value}}


FILTERS = st.recursive(
    _leaf(),
    lambda inner: st.builds(lambda op, parts: {op: parts}, st.sampled_from(["$and", "$or"]), st.lists(inner, min_size=1, max_size=3))
    | st.builds(lambda a, b: {**a, **b}, inner, inner),
    max_leaves=6,
)


# -- the properties -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_filter_matches_exactly_the_rows_its_plain_reading_says(
    hostile_metadata_warehouse: Warehouse, stored_rows: list[dict[str, Any]], data: st.DataObject
):
    expression = data.draw(FILTERS)
    compiled = narrowing(expression)
    assert compiled is not None
    found = {row["chunk_id"] for row in hostile_metadata_warehouse.store.chunks.rows_where(compiled.sql, ["chunk_id"])}
    assert found == {row["chunk_id"] for row in stored_rows if matches(expression, row)}, compiled.sql


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_filter_evaluated_in_memory_over_the_rows_matches_exactly_what_its_plain_reading_says(
    hostile_metadata_warehouse: Warehouse, stored_rows: list[dict[str, Any]], data: st.DataObject
):
    """The evaluation searches use (over the fields of the rows a caller may read), here over
    every row: the same rows as the SQL above and as the plain reading."""
    expression = data.draw(FILTERS)
    compiled = narrowing(expression)
    assert compiled is not None
    fields = VisibleFields.from_arrow(hostile_metadata_warehouse.store.chunks.read_at(None, "TRUE", FIELD_COLUMNS))
    found = set(fields.chunk_ids.filter(pa.array(compiled.mask(fields))).to_pylist())
    assert found == {row["chunk_id"] for row in stored_rows if matches(expression, row)}, expression


def test_the_oracle_and_the_data_can_tell_filters_apart(stored_rows: list[dict[str, Any]]):
    """Positive controls: the hostile values are stored, and typed equality separates look-alikes."""
    titles = [row["metadata"].get("title") for row in stored_rows]
    assert "' OR 1=1 --" in titles and "2020" in titles and 2020 in titles
    as_text = {row["chunk_id"] for row in stored_rows if matches({"title": "2020"}, row)}
    as_number = {row["chunk_id"] for row in stored_rows if matches({"title": 2020}, row)}
    assert as_text and as_number and not as_text & as_number


@pytest.mark.parametrize("plan", ["flat", "resident", "planned"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_filtered_search_returns_the_top_k_of_rows_visible_and_matching(
    hostile_metadata_warehouse: Warehouse, stored_rows: list[dict[str, Any]], world: World, plan: str, data: st.DataObject
):
    expression = data.draw(FILTERS)
    subject = data.draw(st.sampled_from([world.subjects[0.5], world.subjects[0.1]]))
    query = world.rows.vectors[data.draw(st.integers(0, len(world.rows.ids) - 1))]
    searcher = _searcher(hostile_metadata_warehouse, plan)
    policy = hostile_metadata_warehouse.policy
    found = searcher.search("q", policy=policy, caller=Caller(subject=subject, tenant=TENANT), k=K, vector=query,
                            narrowing=narrowing(expression))  # fmt: skip
    registry = hostile_metadata_warehouse.store.registries.clauses()
    eligible = [row for row in stored_rows
                if matches(expression, row) and check_row(policy, subject, TENANT, row, registry).allowed]  # fmt: skip
    scores = [float(np.dot(query, row["vector"]) / np.linalg.norm(row["vector"]) / np.linalg.norm(query)) for row in eligible]
    best = sorted(zip(scores, [row["chunk_id"] for row in eligible], strict=True), key=lambda item: (-item[0], item[1]))
    assert [hit.chunk_id for hit in found.hits] == [chunk_id for _, chunk_id in best[:K]]
    assert all(math.isclose(hit.score, score, abs_tol=1e-5) for hit, (score, _) in zip(found.hits, best, strict=False))


def _searcher(warehouse: Warehouse, plan: str) -> Searcher:
    if plan == "planned":
        return warehouse._searcher
    if plan == "flat":
        return Searcher(warehouse.store.read_doors(), None, flat_max_rows=10**9)  # type: ignore[arg-type]
    searcher = Searcher(warehouse.store.read_doors(), None, flat_max_rows=-1, resident_index_bytes=2**28, resident_min_rows=0)  # type: ignore[arg-type]
    searcher.serving.build_now()
    return searcher


def test_no_filter_widens_what_a_caller_may_read(hostile_metadata_warehouse: Warehouse, world: World):
    """A filter that matches every row, or tries to close the governance filter's parenthesis,
    returns what the caller may read and nothing more."""
    subject = world.subjects[0.001]
    searcher, policy = hostile_metadata_warehouse._searcher, hostile_metadata_warehouse.policy
    caller = Caller(subject=subject, tenant=TENANT)
    query = world.rows.vectors[0]
    plain = searcher.search("q", policy=policy, caller=caller, k=1000, vector=query).hits
    assert 0 < len(plain) < 100, "a narrow caller: the case a widening would show"
    for expression in ({"$or": [{"kind": "chunk"}, {"kind": {"$ne": "chunk"}}]},
                       {"title": {"$nin": ["x"]}, "$or": [{"doc_id": "') OR (1=1"}, {"doc_id": {"$gt": ""}}]},
                       {"doc_id": {"$in": world.rows.ids[:1000]}}):  # fmt: skip
        hits = searcher.search("q", policy=policy, caller=caller, k=1000, vector=query, narrowing=narrowing(expression)).hits
        assert {hit.chunk_id for hit in hits} <= {hit.chunk_id for hit in plain}
    everything = narrowing({"$or": [{"kind": "chunk"}, {"kind": {"$ne": "chunk"}}]})
    assert [h.chunk_id for h in searcher.search("q", policy=policy, caller=caller, k=1000, vector=query, narrowing=everything).hits] == [
        h.chunk_id for h in plain
    ]


@pytest.mark.parametrize(
    ("expression", "named"),
    [
        ({"tenant": "acme"}, "filter.tenant: 'tenant' governs who may read a row"),
        ({"labels": {"$in": ["pii"]}}, "filter.labels: 'labels' governs"),
        ({"$or": [{"year": 1}, {"acl_allow": {"$ne": "x"}}]}, "filter.$or[1].acl_allow: 'acl_allow' governs"),
        ({"classification": {"$lte": 1}}, "'classification' governs"),
        ({"acl": "user:mallory"}, "'acl' governs"),
        ({"parents": "x"}, "'parents' governs"),
        ({"text": "secret"}, "'text' cannot be filtered on"),
        ({"year": {"$regex": "20.*"}}, "operator '$regex' is not one of"),
        ({"$not": {"year": 1}}, "'$not' is not an operator here"),
        ({"year": {"$gt": "2020"}}, "a range on metadata compares numbers"),
        ({"year": float("nan")}, "not a finite number"),
        ({"year": [2020, 2021]}, "use $in"),
        ({"year": {"$in": []}}, "filter.year.$in must be a non-empty list"),
        ({"doc_id": 7}, "doc_id is text"),
        ({"created_at": {"$gt": "last week"}}, "ISO 8601"),
        ({'a"b': 1}, "holds a quote"),
        ({"doc_id": "nul\x00"}, "NUL"),
        ({"$and": []}, "filter.$and must be a non-empty list"),
    ],
)
def test_a_filter_that_cannot_be_honoured_is_refused_naming_its_part(
    demo_policy_warehouse: Warehouse, expression: dict[str, Any], named: str
):
    with pytest.raises(InvalidRequestError) as refused:
        demo_policy_warehouse.search("budget", subject="user:alice", tenant="acme", filter=expression)
    assert named in str(refused.value)


def test_a_metadata_field_named_like_a_governance_column_is_reached_through_its_prefix(
    hostile_metadata_warehouse: Warehouse, stored_rows: list[dict[str, Any]]
):
    compiled = narrowing({"metadata.labels": {"$in": HOSTILE_TEXT}})
    assert compiled is not None
    found = {row["chunk_id"] for row in hostile_metadata_warehouse.store.chunks.rows_where(compiled.sql, ["chunk_id"])}
    assert found and found == {row["chunk_id"] for row in stored_rows if row["metadata"].get("labels") in HOSTILE_TEXT}


def test_the_exact_rerun_after_a_withheld_row_keeps_the_filter(indexed_warehouse: Warehouse, small_world: World):
    """A row whose label slipped past the registry makes the search ask again with the exact
    filter: the filter goes with it, so every hit still matches it and k is still filled."""
    reader = small_world.subjects[0.5]
    secret = new_rows(small_world, 1, group_of(indexed_warehouse, reader), labels=["unregistered-secret"], seed=3)
    append_rows(indexed_warehouse.store, secret, register_labels=False)
    few = narrowing({"bucket": {"$in": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]}})
    found = indexed_warehouse._searcher.search(
        "q", policy=indexed_warehouse.policy, caller=Caller(subject=reader, tenant=TENANT), k=K,
        vector=secret.vectors[0], narrowing=few,
    )  # fmt: skip
    assert found.withheld == 1, "the indexed prefilter let the secret row through; the post-check did not"
    assert len(found.hits) == K and all(hit.metadata["bucket"] < 10 for hit in found.hits)


@pytest.mark.parametrize("mode", ["fts", "hybrid"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_filtered_text_search_ranks_what_both_filters_anded_in_lance_would(
    hostile_metadata_warehouse: Warehouse, world: World, mode: str, data: st.DataObject, monkeypatch: pytest.MonkeyPatch
):
    """The matches narrowing held rows give the answer of the plain route: both filters in Lance."""
    expression = data.draw(FILTERS)
    caller = Caller(subject=data.draw(st.sampled_from([world.subjects[0.5], world.subjects[0.1]])), tenant=TENANT)
    query, vector = "synthetic row", world.rows.vectors[data.draw(st.integers(0, len(world.rows.ids) - 1))]
    policy = hostile_metadata_warehouse.policy

    def answer(searcher: Searcher) -> list[tuple[str, float]]:
        found = searcher.search(query, policy=policy, caller=caller, k=K, mode=mode, vector=vector, narrowing=narrowing(expression))
        return [(hit.chunk_id, round(hit.score, 5)) for hit in found.hits]

    routed = answer(Searcher(hostile_metadata_warehouse.store.read_doors(), None))  # type: ignore[arg-type]
    plain = Searcher(hostile_metadata_warehouse.store.read_doors(), None)  # type: ignore[arg-type]
    monkeypatch.setattr(plain, "_visible_fields", lambda where, version: None)  # as if that version were gone: Lance
    assert routed == answer(plain)


@pytest.mark.parametrize(
    ("limits", "expression", "named"),
    [
        ({"filter_max_terms": 3}, {"a": 1, "b": 2, "$or": [{"c": 3}, {"d": 4}]}, "more than 3 conditions (setting filter_max_terms)"),
        ({"filter_max_values": 4}, {"year": {"$in": [1, 2, 3, 4, 5]}}, "lists 5 values; the limit is 4 (setting filter_max_values)"),
        ({"filter_max_depth": 2}, {"$or": [{"$and": [{"a": 1}]}]}, "nests deeper than 2 levels (setting filter_max_depth)"),
        ({"filter_max_bytes": 64}, {"title": "x" * 100}, "the limit is 64 (setting filter_max_bytes)"),
    ],
)
def test_a_filter_past_a_configured_limit_is_refused_naming_the_limit_and_its_setting(
    tmp_path: Path, limits: dict[str, int], expression: dict[str, Any], named: str
):
    warehouse = Warehouse(Settings(warehouse=str(tmp_path / "wh"), **limits), embedder=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError) as refused:
        warehouse.search("q", subject="user:alice", tenant="acme", vector=[0.0] * warehouse.store.dimension, filter=expression)
    assert named in str(refused.value)
    within = {name: value + 100 for name, value in limits.items()}
    assert narrowing(expression, Settings(**within).filter_limits) is not None, "within the limits it compiles"


def test_the_largest_filter_the_default_limits_admit_compiles_in_one_pass():
    """As many conditions and values as the limits allow (the bytes limit binds first): compiled to
    one SQL term per condition, each value written once."""
    values = list(range(400))
    expression = {"$or": [{f"field{i}": {"$in": values}} for i in range(24)]}
    compiled = narrowing(expression)
    assert compiled is not None and compiled.sql.count(" IN (") == 24
    assert compiled.sql.count("399.0") == 24
    with pytest.raises(InvalidRequestError, match="setting filter_max_bytes"):
        narrowing({"$or": [{f"field{i}": {"$in": values}} for i in range(64)]})


@pytest.mark.parametrize(
    "expression",
    [{"title": {"$ne": "x"}}, {"doc_id": {"$in": STORED_IDS[:50]}}, {"year": {"$gte": 0}, "source_uri": {"$gt": ""}},
     {"created_at": {"$gte": "2000-01-01"}}],  # fmt: skip
)
def test_where_lance_evaluates_a_filter_it_refines_only_the_rows_the_caller_may_read(
    hostile_metadata_warehouse: Warehouse, world: World, expression: dict[str, Any]
):
    """The route for a caller whose fields a process cannot hold: both filters in one Lance read.
    Lance's own plan shows the governance filter served by the scalar indexes and the narrowing
    applied to the rows they admitted alone (no index serves the narrowing's columns, ``doc_id``'s
    BTREE included, which would probe every reader's rows)."""
    searcher = hostile_metadata_warehouse._searcher
    view = searcher.view(hostile_metadata_warehouse.policy, Caller(subject=world.subjects[0.1], tenant=TENANT))
    where = searcher.prefilter(view)
    compiled = narrowing(expression)
    assert compiled is not None
    plan = raw_table(hostile_metadata_warehouse.store).to_lance().scanner(
        filter=f"({where}) AND ({compiled.within(TENANT).sql})", columns=["chunk_id"]
    ).analyze_plan()
    refining = next(line for line in plan.splitlines() if "refine_filter=" in line and "refine_filter=--" not in line)
    scanned = int(refining.split("rows_scanned=")[1].split(",")[0])
    assert scanned == hostile_metadata_warehouse.store.chunks.count(where) < len(world.rows.ids) / 5
    assert "ScalarIndexQuery" in plan and "doc_id_idx" not in plan
