"""A derived row is visible exactly to the subjects who can see every one of its parents (DESIGN §4).

For random policies (nested groups per tenant, label allow and deny rules, classification grants,
rules for ``everyone``, one or two tenants; names holding quotes, commas, SQL and LIKE characters
and look-alike unicode) and one to four random parent rows in one tenant (some of them derived
rows themselves, carrying several ACL clauses), the parents are written to a real LanceDB
``chunks`` table, read back, and the row derived from them by ``propagate`` is written to the same
table with its clauses registered. For random subjects, the compiled prefilter returns the derived
row, and ``check_row`` allows it, exactly when ``check_row`` allows every parent. Parents from two
tenants are refused.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import lancedb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.policy_worlds import World, look_alike_worlds

from ragwarden.governance.compiler import SubjectView, compile_filter
from ragwarden.governance.policy import Policy
from ragwarden.governance.propagation import propagate
from ragwarden.governance.tags import EVERYONE, GovernanceTags
from ragwarden.governance.visibility import check_row
from ragwarden.state import chunks_schema


def parent_tags(world: World, tenant: str, friend: str | None = None) -> st.SearchStrategy[GovernanceTags]:
    """Tags of one parent row in ``tenant``: a chunk of one source (one ACL clause), or, about a
    third of the time, a row already derived from two or three sources (several clauses).

    With a ``friend`` (a subject), every allow list also names the friend, ``everyone`` or a group
    the friend joins directly, and denies, labels and levels above public are rarer: such parents
    are often all visible to the friend, which random tags of four parents seldom are."""
    principals = world.principals
    # "unruled" is a label no rule names: nobody is cleared for it
    label_pool = [*world.labels, "unruled"]
    joined = sorted({g for member, g, where in world.memberships if member == friend and where == tenant})
    # a die for each of a deny, labels and a level above public: one face in 11 with a friend, one
    # in 3 without (sampled_from, since one_of does not weigh repeated branches evenly); it
    # shrinks towards none of them
    spoil = st.sampled_from([False] * (10 if friend else 2) + [True])

    @st.composite
    def source(draw: st.DrawFn) -> GovernanceTags:
        if friend:
            allow = draw(st.lists(st.sampled_from(principals), max_size=2))
            allow.append(draw(st.sampled_from([friend, EVERYONE, *joined])))
        elif draw(st.booleans()):
            allow = [EVERYONE]
        else:
            allow = draw(st.lists(st.sampled_from(principals), min_size=1, max_size=3))
        deny = draw(st.lists(st.sampled_from(principals), min_size=1, max_size=2)) if draw(spoil) else []
        labels = draw(st.lists(st.sampled_from(label_pool), min_size=1, max_size=2)) if draw(spoil) else []
        level = draw(st.sampled_from([1, 2, 3])) if draw(spoil) else 0
        return GovernanceTags.for_source(tenant=tenant, allow=allow, deny=deny, labels=labels, classification=level)

    return st.sampled_from(["chunk", "chunk", "derived"]).flatmap(
        lambda kind: source() if kind == "chunk" else st.lists(source(), min_size=2, max_size=3).map(propagate)
    )


@st.composite
def derivations(draw: st.DrawFn) -> tuple[World, list[GovernanceTags], list[tuple[str, str]]]:
    """A policy, one to four parents in one of its tenants, and one to three (subject, tenant)
    questions, asked mostly in the parents' tenant; about half the time the parents are drawn with
    a friend (see ``parent_tags``), who asks the first question, in the parents' tenant."""
    world = draw(look_alike_worlds())
    tenant = draw(st.sampled_from(world.tenants))
    ask = st.tuples(
        st.sampled_from([*world.users, "user:stranger"]), st.sampled_from([*world.tenants, tenant, tenant])
    )
    friend = draw(st.sampled_from(world.users)) if draw(st.booleans()) else None
    first = (friend, tenant) if friend else draw(ask)
    count = draw(st.sampled_from([1, 2, 3, 4]))  # evenly: hypothesis would favour short lists
    parents = draw(st.lists(parent_tags(world, tenant, friend), min_size=count, max_size=count))
    return world, parents, [first, *draw(st.lists(ask, max_size=2))]


def _write_parents(
    folder: str, parents: list[GovernanceTags], make_row: Callable[..., dict[str, Any]]
) -> tuple[Any, list[dict[str, Any]]]:
    """A real ``chunks`` table holding the parents, and the parent rows as read back from it."""
    rows = [
        make_row(f"p{index}", tags, kind="chunk" if len(tags.acl_clauses) == 1 else "summary")
        for index, tags in enumerate(parents)
    ]
    table = lancedb.connect(folder).create_table("chunks", pa.Table.from_pylist(rows, schema=chunks_schema(2)))
    stored = {row["chunk_id"]: row for row in table.to_arrow().to_pylist()}
    return table, [stored[row["chunk_id"]] for row in rows]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(derivation=derivations())
def test_derived_row_is_visible_exactly_to_subjects_who_see_every_parent(
    derivation: tuple[World, list[GovernanceTags], list[tuple[str, str]]],
    make_row: Callable[..., dict[str, Any]],
    make_registry: Callable[[Iterable[GovernanceTags]], dict[str, list[str]]],
) -> None:
    world, parents, questions = derivation
    policy = Policy.from_text(world.csv_text())
    registry = make_registry(parents)

    with tempfile.TemporaryDirectory() as folder:
        table, parent_rows = _write_parents(folder, parents, make_row)

        # derive from the stored rows, as the writer does, and store the derived row too
        derived = propagate([GovernanceTags.from_row(row, registry) for row in parent_rows])
        registry.update(derived.clauses_by_token)
        ids = [row["chunk_id"] for row in parent_rows]
        table.add(
            pa.Table.from_pylist(
                [make_row("derived", derived, kind="summary", doc_id="doc-derived", parents=ids)],
                schema=chunks_schema(2),
            )
        )
        stored = {row["chunk_id"]: row for row in table.to_arrow().to_pylist()}
        derived_row = stored["derived"]
        # the stored tags round-trip (compared by fingerprint: clause order in the tuple may differ)
        assert GovernanceTags.from_row(derived_row, registry).fingerprint() == derived.fingerprint()

        for subject, tenant in questions:
            seen = [check_row(policy, subject, tenant, row, registry).allowed for row in parent_rows]
            sees_every_parent = all(seen)
            decision = check_row(policy, subject, tenant, derived_row, registry)

            view = SubjectView.of(policy, subject, tenant)
            where = compile_filter(view, view.satisfied_clauses(registry))
            found = table.search().where(where, prefilter=True).select(["chunk_id"]).limit(None).to_arrow()
            filtered = set(found["chunk_id"].to_pylist())

            assert decision.allowed == sees_every_parent, (
                f"check_row says {decision.allowed} ({decision.reason}) for {subject!r} in {tenant!r}, "
                f"but the subject sees every parent: {sees_every_parent}"
            )
            assert ("derived" in filtered) == sees_every_parent, (
                f"the compiled filter {'returns' if 'derived' in filtered else 'hides'} the derived row for "
                f"{subject!r} in {tenant!r}, but the subject sees every parent: {sees_every_parent}; {where}"
            )
            event(f"subject sees {'all' if all(seen) else 'some' if any(seen) else 'none'} of {len(seen)} parent(s)")
            if sees_every_parent and (derived.acl_deny or derived.labels or derived.classification):
                event("a derived row with denies, labels or a level above public is visible")
        event("derived row carries " + ("one ACL clause" if len(derived.acl_clauses) == 1 else "several ACL clauses"))


@st.composite
def parents_in_two_tenants(draw: st.DrawFn) -> list[GovernanceTags]:
    """Two to four parents, at least one in each of two tenants, in any order."""
    world = draw(look_alike_worlds(min_tenants=2))
    first, second = world.tenants
    parents = [draw(parent_tags(world, first)), draw(parent_tags(world, second))]
    parents += draw(st.lists(st.sampled_from(world.tenants).flatmap(lambda t: parent_tags(world, t)), max_size=2))
    return draw(st.permutations(parents))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(parents=parents_in_two_tenants())
def test_propagation_refuses_parents_from_two_tenants(
    parents: list[GovernanceTags],
    make_row: Callable[..., dict[str, Any]],
    make_registry: Callable[[Iterable[GovernanceTags]], dict[str, list[str]]],
) -> None:
    registry = make_registry(parents)
    with tempfile.TemporaryDirectory() as folder:
        _, parent_rows = _write_parents(folder, parents, make_row)
        tags = [GovernanceTags.from_row(row, registry) for row in parent_rows]
        with pytest.raises(ValueError, match="several tenants"):
            propagate(tags)
