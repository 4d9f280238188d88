"""The compiled prefilter, run on real LanceDB tables, beside the per-row check of the enforcer.

Hostile strings are data, never SQL; rows that cannot be evaluated (unknown clause tokens, NULLs,
out-of-range levels) pass neither the filter nor ``check_row``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from ragwarden.governance.compiler import SubjectView, compile_filter, compile_prefilter
from ragwarden.governance.policy import Policy
from ragwarden.governance.tags import EVERYONE, Classification, GovernanceTags, clause_token
from ragwarden.governance.visibility import check_row

HOSTILE = [
    "x' OR '1'='1",
    "x') OR (1=1",
    "x' OR 1=1 --",
    "x\\' OR 1=1 --",
    "x\\",
    "x'; DROP TABLE chunks; --",
    "%",
    "_",
]


def _tags(tenant: str, allow: list[str], **kw: Any) -> GovernanceTags:
    return GovernanceTags.for_source(tenant=tenant, allow=allow, **kw)


def _check_ids(policy: Policy, subject: str, tenant: str, table: Any, registry: dict[str, list[str]]) -> set[str]:
    return {
        row["chunk_id"]
        for row in table.to_arrow().to_pylist()
        if check_row(policy, subject, tenant, row, registry).allowed
    }


# -- the filter string --------------------------------------------------------------------


def test_filter_is_deterministic_for_caching(nested_groups_policy: Policy) -> None:
    registry = {clause_token(["group:fpa"]): ["group:fpa"], clause_token(["user:bob"]): ["user:bob"]}
    first = SubjectView.of(nested_groups_policy, "user:alice", "acme")
    second = SubjectView.of(nested_groups_policy, "user:alice", "acme")
    assert first == second
    assert first.policy_version == nested_groups_policy.version
    assert compile_filter(first, first.satisfied_clauses(registry)) == compile_filter(
        second, second.satisfied_clauses(dict(reversed(registry.items())))
    )


def test_view_holds_what_the_policy_grants(nested_groups_policy: Policy) -> None:
    view = SubjectView.of(nested_groups_policy, "user:alice", "acme")
    assert view.principals == {"user:alice", EVERYONE, "group:fpa", "group:finance", "group:staff"}
    assert view.cleared_labels == {"finance"}
    assert view.clearance is Classification.CONFIDENTIAL


def test_satisfied_clauses_are_those_naming_a_held_principal(nested_groups_policy: Policy) -> None:
    view = SubjectView.of(nested_groups_policy, "user:alice", "acme")
    registry = {
        "c-staff": ["group:staff", "user:zed"],
        "c-everyone": [EVERYONE],
        "c-hr": ["group:hr"],
        "c-self": ["user:alice"],
        "c-empty": [],
    }
    assert view.satisfied_clauses(registry) == {"c-staff", "c-everyone", "c-self"}


def _skeleton(where: str) -> str:
    """The filter with every string literal replaced by a placeholder: its SQL structure."""
    return re.sub(r"'(?:[^']|'')*'", "<literal>", where)


def _view_filter(name: str) -> str:
    policy = Policy.from_text(
        f'"g", "user:{name}", "group:{name}", "{name}"\n'
        f'"p", "group:{name}", "{name}", "label:{name}", "read", "allow"\n'
    )
    view = SubjectView.of(policy, f"user:{name}", name)
    return compile_filter(view, frozenset({clause_token([f"group:{name}"])}))


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_values_reach_the_filter_only_as_quoted_literals(hostile: str) -> None:
    where = _view_filter(hostile)
    literal = "'" + hostile.replace("'", "''") + "'"
    assert f"tenant = {literal}" in where
    assert "'user:" + hostile.replace("'", "''") + "'" in where
    assert "'group:" + hostile.replace("'", "''") + "'" in where
    assert f"array_has_all([{literal}], labels)" in where
    # with the literals taken out, the filter has exactly the structure it has for a plain name
    assert _skeleton(where) == _skeleton(_view_filter("plain"))


# -- hostile strings on a real table ------------------------------------------------------


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_tenant_does_not_widen_results(
    hostile: str, make_chunks_table: Callable[..., Any], make_row: Callable[..., dict[str, Any]], filtered_ids: Any
) -> None:
    rows = {
        "own": _tags(hostile, [EVERYONE]),
        "acme": _tags("acme", [EVERYONE]),
        "x": _tags("x", [EVERYONE]),
        "empty-looking": _tags("1", [EVERYONE]),
    }
    table = make_chunks_table([make_row(name, tags) for name, tags in rows.items()])
    registry = {t: p for tags in rows.values() for t, p in tags.clauses_by_token.items()}
    policy = Policy.from_text(f'"p", "everyone", "{hostile}", "audit", "read", "allow"\n')
    assert filtered_ids(table, policy, "user:u", hostile, registry) == {"own"}
    assert _check_ids(policy, "user:u", hostile, table, registry) == {"own"}
    assert filtered_ids(table, policy, "user:u", "acme", registry) == {"acme"}


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_principal_does_not_widen_results(
    hostile: str, make_chunks_table: Callable[..., Any], make_row: Callable[..., dict[str, Any]], filtered_ids: Any
) -> None:
    subject = f"user:{hostile}"
    rows = {
        "mine": _tags("acme", [subject]),
        "group": _tags("acme", [f"group:{hostile}"]),
        "someone-else": _tags("acme", ["user:x"]),
        "denied": _tags("acme", [EVERYONE], deny=[subject]),
        "denied-group": _tags("acme", [EVERYONE], deny=[f"group:{hostile}"]),
        "public": _tags("acme", [EVERYONE]),
    }
    table = make_chunks_table([make_row(name, tags) for name, tags in rows.items()])
    registry = {t: p for tags in rows.values() for t, p in tags.clauses_by_token.items()}
    quoted = hostile.replace('"', '""')
    policy = Policy.from_text(f'"g", "user:{quoted}", "group:{quoted}", "acme"\n')
    expected = {"mine", "group", "public"}
    assert filtered_ids(table, policy, subject, "acme", registry) == expected
    assert _check_ids(policy, subject, "acme", table, registry) == expected
    # a bystander sees neither the hostile subject's rows nor anything the quotes might open up
    bystander = {"someone-else", "denied", "denied-group", "public"}
    assert filtered_ids(table, policy, "user:x", "acme", registry) == bystander


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_label_does_not_clear_other_labels(
    hostile: str, make_chunks_table: Callable[..., Any], make_row: Callable[..., dict[str, Any]], filtered_ids: Any
) -> None:
    rows = {
        "hostile": _tags("acme", [EVERYONE], labels=[hostile]),
        "pii": _tags("acme", [EVERYONE], labels=["pii"]),
        "both": _tags("acme", [EVERYONE], labels=[hostile, "pii"]),
        "x": _tags("acme", [EVERYONE], labels=["x"]),
        "unlabelled": _tags("acme", [EVERYONE]),
    }
    table = make_chunks_table([make_row(name, tags) for name, tags in rows.items()])
    registry = {t: p for tags in rows.values() for t, p in tags.clauses_by_token.items()}
    quoted = hostile.replace('"', '""')
    policy = Policy.from_text(f'"p", "user:u", "acme", "label:{quoted}", "read", "allow"\n')
    assert filtered_ids(table, policy, "user:u", "acme", registry) == {"hostile", "unlabelled"}
    assert _check_ids(policy, "user:u", "acme", table, registry) == {"hostile", "unlabelled"}


# -- empty grants -------------------------------------------------------------------------


def test_subject_with_no_cleared_labels_sees_only_unlabelled_rows(
    make_chunks_table: Callable[..., Any], make_row: Callable[..., dict[str, Any]], nested_groups_policy: Policy
) -> None:
    rows = {"labelled": _tags("acme", [EVERYONE], labels=["finance"]), "plain": _tags("acme", [EVERYONE])}
    table = make_chunks_table([make_row(name, tags) for name, tags in rows.items()])
    registry = {t: p for tags in rows.values() for t, p in tags.clauses_by_token.items()}
    view = SubjectView.of(nested_groups_policy, "user:bob", "acme")
    assert view.cleared_labels == frozenset()
    where = compile_filter(view, view.satisfied_clauses(registry))
    found = table.search().where(where, prefilter=True).limit(None).to_arrow()
    assert found["chunk_id"].to_pylist() == ["plain"]


def test_no_satisfied_clauses_returns_no_rows(
    make_chunks_table: Callable[..., Any], make_row: Callable[..., dict[str, Any]], nested_groups_policy: Policy
) -> None:
    rows = [make_row("finance", _tags("acme", ["group:finance"])), make_row("hr", _tags("acme", ["group:hr"]))]
    table = make_chunks_table(rows)
    view = SubjectView.of(nested_groups_policy, "user:carol", "acme")
    registry = {clause_token(["group:finance"]): ["group:finance"], clause_token(["group:hr"]): ["group:hr"]}
    assert view.satisfied_clauses(registry) == frozenset()
    where = compile_filter(view, frozenset())
    assert table.search().where(where, prefilter=True).limit(None).to_arrow().num_rows == 0
    assert table.count_rows() == 2


def test_derived_row_needs_every_parent_clause(
    make_chunks_table: Callable[..., Any],
    make_row: Callable[..., dict[str, Any]],
    filtered_ids: Any,
    nested_groups_policy: Policy,
) -> None:
    finance = _tags("acme", ["group:finance"])
    staff = _tags("acme", ["group:staff"])
    hr = _tags("acme", ["group:hr"])
    summary_fs = GovernanceTags(tenant="acme", acl_clauses=finance.acl_clauses + staff.acl_clauses)
    summary_fh = GovernanceTags(tenant="acme", acl_clauses=finance.acl_clauses + hr.acl_clauses)
    tags = {"fin": finance, "staff": staff, "hr": hr, "fin+staff": summary_fs, "fin+hr": summary_fh}
    table = make_chunks_table([make_row(name, one) for name, one in tags.items()])
    registry = {t: p for one in tags.values() for t, p in one.clauses_by_token.items()}
    expected = {
        "user:alice": {"fin", "staff", "fin+staff"},
        "user:bob": {"staff", "hr"},
        "user:carol": {"staff"},
    }
    for subject, ids in expected.items():
        assert filtered_ids(table, nested_groups_policy, subject, "acme", registry) == ids
        assert _check_ids(nested_groups_policy, subject, "acme", table, registry) == ids


@pytest.fixture
def one_row_per_level(
    make_chunks_table: Callable[..., Any], make_row: Callable[..., dict[str, Any]]
) -> tuple[Any, dict[str, list[str]]]:
    """A table of four rows everyone is allowed, one per classification (each named by its
    level), and their clause registry."""
    tags = [_tags("acme", [EVERYONE], classification=level) for level in Classification]
    table = make_chunks_table([make_row(one.classification.label, one) for one in tags])
    return table, {t: p for one in tags for t, p in one.clauses_by_token.items()}


def test_classification_above_clearance_is_filtered(
    one_row_per_level: tuple[Any, dict[str, list[str]]], filtered_ids: Any, nested_groups_policy: Policy
) -> None:
    table, registry = one_row_per_level
    assert filtered_ids(table, nested_groups_policy, "user:nobody", "acme", registry) == {"public"}
    assert filtered_ids(table, nested_groups_policy, "user:bob", "acme", registry) == {"public", "internal"}
    assert filtered_ids(table, nested_groups_policy, "user:alice", "acme", registry) == {
        "public",
        "internal",
        "confidential",
    }


def test_a_classification_deny_caps_what_the_filters_and_the_check_return(
    one_row_per_level: tuple[Any, dict[str, list[str]]], filtered_ids: Any, classification_denies_policy: Policy
) -> None:
    table, registry = one_row_per_level
    expected = {
        "user:bob": {"public"},  # confidential granted through a group, internal denied to him
        "user:carol": set(),  # public denied to her group: not even public rows
        "user:erin": {"public", "internal", "confidential"},
        "user:frank": {"public"},  # restricted allowed to him, denied to everyone
    }
    for subject, ids in expected.items():
        view = SubjectView.of(classification_denies_policy, subject, "acme")
        prefilter = compile_prefilter(view, registry, [])
        found = table.search().where(prefilter, prefilter=True).select(["chunk_id"]).limit(None).to_arrow()
        assert set(found["chunk_id"].to_pylist()) == ids, subject
        assert filtered_ids(table, classification_denies_policy, subject, "acme", registry) == ids, subject
        assert _check_ids(classification_denies_policy, subject, "acme", table, registry) == ids, subject
    internal = next(row for row in table.to_arrow().to_pylist() if row["chunk_id"] == "internal")
    refused = check_row(classification_denies_policy, "user:bob", "acme", internal, registry)
    assert refused.reason == "clearance capped below internal by a deny"


def test_a_subject_cleared_for_nothing_compiles_to_a_filter_that_passes_nothing(
    classification_denies_policy: Policy,
) -> None:
    view = SubjectView.of(classification_denies_policy, "user:carol", "acme")
    assert view.clearance is None
    assert "(FALSE)" in compile_filter(view, frozenset({"c-any"}))
    assert "(FALSE)" in compile_prefilter(view, {"c-any": ["user:carol"]}, [])


# -- rows that cannot be evaluated fail closed --------------------------------------------


def test_row_with_an_unknown_clause_token_fails_closed(
    make_chunks_table: Callable[..., Any], make_row: Callable[..., dict[str, Any]], filtered_ids: Any
) -> None:
    public = _tags("acme", [EVERYONE])
    known = public.clause_tokens[0]
    rows = [
        make_row("known", public),
        make_row("unknown", public, acl_clauses=["c-not-in-the-registry"]),
        make_row("known+unknown", public, acl_clauses=[known, "c-not-in-the-registry"]),
    ]
    table = make_chunks_table(rows)
    registry = public.clauses_by_token
    policy = Policy.from_text("")
    assert filtered_ids(table, policy, "user:u", "acme", registry) == {"known"}
    for row in rows[1:]:
        decision = check_row(policy, "user:u", "acme", row, registry)
        assert not decision.allowed and "unknown" in decision.reason


def test_row_with_an_out_of_range_high_classification_fails_closed(
    make_chunks_table: Callable[..., Any], make_row: Callable[..., dict[str, Any]], filtered_ids: Any
) -> None:
    public = _tags("acme", [EVERYONE])
    rows = [make_row("ok", public), make_row("level-9", public, classification=9)]
    table = make_chunks_table(rows)
    policy = Policy.from_text("p, everyone, acme, classification:restricted, read, allow\n")
    assert filtered_ids(table, policy, "user:u", "acme", public.clauses_by_token) == {"ok"}
    assert not check_row(policy, "user:u", "acme", rows[1], public.clauses_by_token).allowed


def test_row_with_a_negative_classification_fails_closed(
    make_chunks_table: Callable[..., Any], make_row: Callable[..., dict[str, Any]], filtered_ids: Any
) -> None:
    public = _tags("acme", [EVERYONE])
    rows = [make_row("ok", public), make_row("level-minus-1", public, classification=-1)]
    table = make_chunks_table(rows)
    policy = Policy.from_text("")
    assert not check_row(policy, "user:u", "acme", rows[1], public.clauses_by_token).allowed
    assert filtered_ids(table, policy, "user:u", "acme", public.clauses_by_token) == {"ok"}


def test_row_with_no_clause_tokens_fails_closed(
    make_chunks_table: Callable[..., Any], make_row: Callable[..., dict[str, Any]], filtered_ids: Any
) -> None:
    public = _tags("acme", [EVERYONE])
    rows = [make_row("ok", public), make_row("no-clauses", public, acl_clauses=[])]
    table = make_chunks_table(rows)
    policy = Policy.from_text("")
    decision = check_row(policy, "user:u", "acme", rows[1], public.clauses_by_token)
    assert not decision.allowed and "no ACL" in decision.reason
    assert filtered_ids(table, policy, "user:u", "acme", public.clauses_by_token) == {"ok"}


def test_row_with_an_empty_allow_list_fails_closed(
    make_chunks_table: Callable[..., Any], make_row: Callable[..., dict[str, Any]], filtered_ids: Any
) -> None:
    public = _tags("acme", [EVERYONE])
    rows = [make_row("ok", public), make_row("no-allow", public, acl_allow=[])]
    table = make_chunks_table(rows)
    policy = Policy.from_text("")
    assert filtered_ids(table, policy, "user:u", "acme", public.clauses_by_token) == {"ok"}
    assert not check_row(policy, "user:u", "acme", rows[1], public.clauses_by_token).allowed


NULLISH = [
    ("tenant", None),
    ("acl_allow", None),
    ("acl_allow", [None]),
    ("acl_deny", None),
    ("acl_clauses", None),
    ("acl_clauses", [None]),
    ("labels", None),
    ("labels", [None]),
    ("labels", [None, "pii"]),
    ("classification", None),
]


@pytest.mark.parametrize(("column", "value"), NULLISH, ids=[f"{c}={v}" for c, v in NULLISH])
def test_row_with_null_governance_data_fails_closed(
    column: str,
    value: object,
    make_chunks_table: Callable[..., Any],
    make_row: Callable[..., dict[str, Any]],
    nullable_schema: Any,
    filtered_ids: Any,
) -> None:
    public = _tags("acme", [EVERYONE], labels=["pii"]) if column == "labels" else _tags("acme", [EVERYONE])
    good = make_row("ok", public)
    bad = make_row("null", public, **{column: value})
    clause = public.clause_tokens[0]
    if column == "acl_clauses" and value is not None:
        bad["acl_clauses"] = [clause, *value]  # a NULL token beside a valid one
    table = make_chunks_table([good, bad], schema=nullable_schema)
    stored = {row["chunk_id"]: row for row in table.to_arrow().to_pylist()}
    assert stored["null"][column] == bad[column]
    policy = Policy.from_text(
        "p, everyone, acme, label:pii, read, allow\np, everyone, acme, classification:restricted, read, allow\n"
    )
    assert filtered_ids(table, policy, "user:u", "acme", public.clauses_by_token) == {"ok"}
    assert check_row(policy, "user:u", "acme", stored["ok"], public.clauses_by_token).allowed
    assert not check_row(policy, "user:u", "acme", stored["null"], public.clauses_by_token).allowed


def test_row_missing_a_governance_column_is_refused_by_check_row() -> None:
    row = {"tenant": "acme", "acl_allow": [EVERYONE], "acl_deny": [], "labels": [], "classification": 0}
    decision = check_row(Policy.from_text(""), "user:u", "acme", row, {})
    assert not decision.allowed and "cannot be evaluated" in decision.reason
