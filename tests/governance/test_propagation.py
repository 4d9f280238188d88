"""The propagation rule (DESIGN §4): the tags of a row derived from parents."""

from __future__ import annotations

import pytest

from ragwarden.governance.propagation import propagate
from ragwarden.governance.tags import Classification, GovernanceTags

FINANCE_DOC = GovernanceTags.for_source(
    tenant="acme", allow=["group:finance"], deny=["user:mallory"], labels=["finance"], classification="confidential"
)
HR_DOC = GovernanceTags.for_source(
    tenant="acme", allow=["group:hr", "user:olivia"], deny=["user:bob"], labels=["pii", "hr"], classification="internal"
)
PUBLIC_DOC = GovernanceTags.for_source(tenant="acme", allow=["everyone"])


def test_derived_row_conjoins_its_parents_acl_clauses() -> None:
    derived = propagate([FINANCE_DOC, HR_DOC])
    assert set(derived.acl_clauses) == {frozenset({"group:finance"}), frozenset({"group:hr", "user:olivia"})}
    assert set(derived.clause_tokens) == set(FINANCE_DOC.clause_tokens) | set(HR_DOC.clause_tokens)
    assert derived.acl_allow == ["group:finance", "group:hr", "user:olivia"]


def test_derived_row_takes_the_union_of_denies_and_labels() -> None:
    derived = propagate([FINANCE_DOC, HR_DOC, PUBLIC_DOC])
    assert derived.acl_deny == {"user:mallory", "user:bob"}
    assert derived.labels == {"finance", "pii", "hr"}


def test_derived_row_takes_the_highest_classification() -> None:
    assert propagate([HR_DOC, FINANCE_DOC, PUBLIC_DOC]).classification is Classification.CONFIDENTIAL
    assert propagate([PUBLIC_DOC, PUBLIC_DOC]).classification is Classification.PUBLIC
    restricted = GovernanceTags.for_source(tenant="acme", allow=["user:a"], classification="restricted")
    assert propagate([PUBLIC_DOC, restricted]).classification is Classification.RESTRICTED


def test_derived_row_of_one_parent_has_the_parents_tags() -> None:
    assert propagate([HR_DOC]) == HR_DOC
    assert propagate([HR_DOC]).fingerprint() == HR_DOC.fingerprint()


def test_derived_row_keeps_one_clause_for_parents_sharing_an_acl() -> None:
    twin = GovernanceTags.for_source(tenant="acme", allow=["group:finance"], labels=["legal"])
    derived = propagate([FINANCE_DOC, twin])
    assert derived.acl_clauses == (frozenset({"group:finance"}),)


def test_propagation_does_not_depend_on_parent_order() -> None:
    assert propagate([FINANCE_DOC, HR_DOC, PUBLIC_DOC]) == propagate([PUBLIC_DOC, HR_DOC, FINANCE_DOC])
    assert (
        propagate([FINANCE_DOC, HR_DOC]).fingerprint() == propagate([HR_DOC, FINANCE_DOC]).fingerprint()
    )


def test_a_row_derived_from_derived_rows_conjoins_every_ancestor_clause() -> None:
    summary = propagate([propagate([FINANCE_DOC, PUBLIC_DOC]), propagate([HR_DOC])])
    assert set(summary.acl_clauses) == set(FINANCE_DOC.acl_clauses + PUBLIC_DOC.acl_clauses + HR_DOC.acl_clauses)
    assert summary == propagate([FINANCE_DOC, PUBLIC_DOC, HR_DOC])


def test_propagation_refuses_parents_in_several_tenants() -> None:
    globex = GovernanceTags.for_source(tenant="globex", allow=["everyone"])
    with pytest.raises(ValueError, match="several tenants") as caught:
        propagate([FINANCE_DOC, globex])
    assert "acme" in str(caught.value) and "globex" in str(caught.value)


def test_propagation_refuses_no_parents() -> None:
    with pytest.raises(ValueError, match="at least one parent"):
        propagate([])


def test_equal_tags_compare_equal_whatever_the_clause_order():
    from ragwarden.governance.tags import GovernanceTags

    a, b = frozenset({"group:a"}), frozenset({"group:b", "user:c"})
    assert GovernanceTags(tenant="t", acl_clauses=(a, b)) == GovernanceTags(tenant="t", acl_clauses=(b, a, b))
