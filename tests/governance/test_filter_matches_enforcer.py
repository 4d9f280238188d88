"""The compiled prefilter, the enforcer's per-row check and the rule of DESIGN §4 agree, always.

For random policies (nested groups per tenant, allow and deny label rules, classification grants
and denies (a deny capping the clearance below its level, down to nothing at all), rules for
``everyone``, several tenants; names full of quotes, backslashes, SQL comment and LIKE
characters and look-alike unicode) and random rows written to a real LanceDB ``chunks`` table,
the rows the compiled filter returns to a subject are exactly the rows ``check_row`` allows, and
exactly the rows an independent oracle (DESIGN §4 in plain Python, reading the generated rules,
not the Policy) calls visible.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import lancedb
import pyarrow as pa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.oracle import oracle_clearance, oracle_principals, oracle_visible
from support.policy_worlds import World, hostile_worlds

from ragwarden.governance.compiler import SubjectView, compile_filter
from ragwarden.governance.policy import Policy
from ragwarden.governance.propagation import propagate
from ragwarden.governance.tags import EVERYONE, GovernanceTags
from ragwarden.governance.visibility import check_row
from ragwarden.state import chunks_schema

UNKNOWN_TOKEN = "c-not-in-the-registry"


Parts = tuple[list[str], list[str], list[str], int]  # allow, deny, labels, classification of one source


def row_strategy(world: World) -> st.SearchStrategy[tuple[str, list[Parts], bool]]:
    """One row of ``world``: its tenant, the tag parts of its one to three parent sources (one for
    a chunk, several for a derived row), and whether it also carries a clause token the registry
    does not know. Weighted so that rows are often visible to someone: ``everyone`` on about half
    the allow lists, no deny and no labels on about two thirds each, a deny for ``everyone`` on
    about a sixth, and mostly public rows. Built once per world: strategies are costly to build."""
    principals = world.principals
    # a label the policy never names is possible too: such a label is readable by nobody
    labels = [*world.labels, "unruled"]
    allow = st.one_of(st.just([EVERYONE]), st.lists(st.sampled_from(principals), min_size=1, max_size=3))
    named = st.lists(st.sampled_from(principals[:-1]), max_size=2)
    denied_all = st.lists(st.sampled_from(principals[:-1]), max_size=1).map(lambda deny: [*deny, EVERYONE])
    deny = st.one_of(st.just([]), st.just([]), named, denied_all)
    some_labels = st.one_of(st.just([]), st.just([]), st.lists(st.sampled_from(labels), min_size=1, max_size=2))
    source = st.tuples(allow, deny, some_labels, st.sampled_from([0, 0, 0, 1, 2, 3]))
    one_parent = st.lists(source, min_size=1, max_size=1)
    # two thirds single-parent rows (chunks), one third derived rows with several clauses
    parents = st.sampled_from([1, 1, 2]).flatmap(
        lambda n: one_parent if n == 1 else st.lists(source, min_size=2, max_size=3)
    )
    orphan = st.integers(min_value=0, max_value=39).map(lambda n: n == 0)
    return st.tuples(st.sampled_from(world.tenants), parents, orphan)


def row_tags(tenant: str, parents: list[Parts]) -> GovernanceTags:
    """The tags the writer gives a row of these parents, by the propagation rule."""
    return propagate(
        [
            GovernanceTags.for_source(tenant=tenant, allow=allow, deny=deny, labels=labels, classification=level)
            for allow, deny, labels, level in parents
        ]
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[World, list[tuple[GovernanceTags, bool]], list[tuple[str, str]]]:
    world = draw(hostile_worlds())
    rows = [
        (row_tags(tenant, parents), orphan)
        for tenant, parents, orphan in draw(st.lists(row_strategy(world), min_size=3, max_size=25))
    ]
    subjects = draw(
        st.lists(
            # a subject asks in any tenant, but mostly in one picked like a row's, so that most
            # questions are about some rows
            st.tuples(
                st.sampled_from([*world.users, "user:stranger"]),
                st.sampled_from([*world.tenants, *(one.tenant for one, _ in rows)]),
            ),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    return world, rows, subjects


# -- the property ---------------------------------------------------------------------------


def _stored_rows(
    tags: list[tuple[GovernanceTags, bool]], make_row: Callable[..., dict[str, Any]]
) -> list[dict[str, Any]]:
    rows = []
    for index, (one, orphan) in enumerate(tags):
        row = make_row(f"r{index}", one)
        if orphan:
            row["acl_clauses"] = sorted([*row["acl_clauses"], UNKNOWN_TOKEN])
        rows.append(row)
    return rows


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(scenario=scenarios())
def test_compiled_filter_returns_exactly_the_rows_the_enforcer_and_the_rule_allow(
    scenario: tuple[World, list[tuple[GovernanceTags, bool]], list[tuple[str, str]]],
    make_row: Callable[..., dict[str, Any]],
    make_registry: Callable[[Iterable[GovernanceTags]], dict[str, list[str]]],
) -> None:
    world, tags, subjects = scenario
    policy = Policy.from_text(world.csv_text())
    registry = make_registry(one for one, _ in tags)
    assert UNKNOWN_TOKEN not in registry

    with tempfile.TemporaryDirectory() as folder:
        table = lancedb.connect(folder).create_table(
            "chunks", pa.Table.from_pylist(_stored_rows(tags, make_row), schema=chunks_schema(2))
        )
        stored = table.to_arrow().to_pylist()
        for subject, tenant in subjects:
            view = SubjectView.of(policy, subject, tenant)
            assert view.principals == oracle_principals(world, subject, tenant)
            assert view.clearance == oracle_clearance(world, set(view.principals), tenant)
            capped = policy.clearance_of(subject, tenant).cap
            event("clearance: " + ("as granted" if capped is None else "none" if view.clearance is None else "capped"))

            where = compile_filter(view, view.satisfied_clauses(registry))
            found = table.search().where(where, prefilter=True).limit(None).select(["chunk_id"]).to_arrow()
            filtered = found["chunk_id"].to_pylist()
            assert len(filtered) == len(set(filtered))

            checked = {row["chunk_id"] for row in stored if check_row(policy, subject, tenant, row, registry).allowed}
            expected = oracle_visible(world, subject, tenant, stored, registry)

            assert set(filtered) == checked, f"filter and check_row disagree for {subject!r} in {tenant!r}: {where}"
            assert checked == expected, f"check_row and DESIGN §4 disagree for {subject!r} in {tenant!r}"
            event("visible rows: " + ("none" if not expected else "all" if len(expected) == len(stored) else "some"))
