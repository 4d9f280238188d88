"""Governance tags: principal and label forms, classification levels, tags, fingerprint, tokens."""

from __future__ import annotations

import dataclasses

import pytest

from ragwarden.errors import InvalidRequestError
from ragwarden.governance.tags import (
    EVERYONE,
    MAX_NAME_LENGTH,
    Classification,
    GovernanceTags,
    check_principal,
    clause_token,
    label_problem,
    principal_problem,
    tenant_problem,
)

# -- principals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "principal",
    [
        "user:alice",
        "group:finance",
        EVERYONE,
        "user:smith, john",
        "group:m&a 2024",
        "user:x' OR '1'='1",
        "user:日本",
        "user:" + "a" * (MAX_NAME_LENGTH - len("user:")),
    ],
)
def test_principal_of_a_valid_form_is_accepted(principal: str) -> None:
    assert principal_problem(principal) is None
    assert check_principal(principal) == principal


@pytest.mark.parametrize(
    ("principal", "why"),
    [
        ("alice", "not of the form"),
        ("role:admin", "not of the form"),
        ("User:alice", "not of the form"),
        ("user:", "not of the form"),
        ("group:", "not of the form"),
        (":alice", "not of the form"),
        ("Everyone", "not of the form"),
        ("", "empty"),
        ("user:al\x00ice", "non-printable"),
        ("user:al\nice", "non-printable"),
        ("user:alice\t", "non-printable"),
        ("user:al\x07ice", "non-printable"),
        ("user:al\u200bice", "non-printable"),  # zero-width space (Cf)
        ("user:al\u202eice", "non-printable"),  # right-to-left override (Cf)
        ("user:" + "a" * MAX_NAME_LENGTH, "longer than 256"),
        (" user:alice", "leading or trailing spaces"),
        ("user:alice ", "leading or trailing spaces"),
        (None, "not a string"),
        (42, "not a string"),
        (b"user:alice", "not a string"),
        (["user:alice"], "not a string"),
    ],
)
def test_principal_of_a_bad_form_is_refused_with_the_reason(principal: object, why: str) -> None:
    problem = principal_problem(principal)
    assert problem is not None and why in problem
    with pytest.raises(ValueError, match=why):
        check_principal(principal)


def test_principal_of_exactly_the_maximum_length_is_accepted_and_one_more_refused() -> None:
    at_limit = "user:" + "a" * (MAX_NAME_LENGTH - 5)
    assert len(at_limit) == MAX_NAME_LENGTH
    assert principal_problem(at_limit) is None
    assert principal_problem(at_limit + "a") is not None


# -- labels and tenants -------------------------------------------------------------------


@pytest.mark.parametrize(
    "label", ["pii", "legal-hold", "deal, project x", "x' OR '1'='1", "ﬁnance", "日本", "a" * MAX_NAME_LENGTH]
)
def test_label_of_printable_text_is_accepted(label: str) -> None:
    assert label_problem(label) is None


@pytest.mark.parametrize(
    ("label", "why"),
    [
        ("", "empty"),
        ("p\x00ii", "non-printable"),
        ("p\nii", "non-printable"),
        ("pii\r", "non-printable"),
        ("p\u00adii", "non-printable"),  # soft hyphen (Cf)
        (" pii", "leading or trailing spaces"),
        ("pii ", "leading or trailing spaces"),
        ("a" * 257, "longer than 256"),
        (7, "not a string"),
        (None, "not a string"),
    ],
)
def test_label_that_is_not_printable_text_is_refused_with_the_reason(label: object, why: str) -> None:
    problem = label_problem(label)
    assert problem is not None and why in problem


@pytest.mark.parametrize(
    ("tenant", "ok"), [("acme", True), ("", False), ("ac\x00me", False), (" acme", False), (1, False)]
)
def test_tenant_must_be_printable_text(tenant: object, ok: bool) -> None:
    assert (tenant_problem(tenant) is None) is ok


# -- classification -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "level"),
    [
        ("public", Classification.PUBLIC),
        ("INTERNAL", Classification.INTERNAL),
        ("Confidential", Classification.CONFIDENTIAL),
        ("rEsTrIcTeD", Classification.RESTRICTED),
        (" confidential ", Classification.CONFIDENTIAL),
        (0, Classification.PUBLIC),
        (1, Classification.INTERNAL),
        (2, Classification.CONFIDENTIAL),
        (3, Classification.RESTRICTED),
        (Classification.RESTRICTED, Classification.RESTRICTED),
    ],
)
def test_classification_parse_accepts_names_in_any_case_and_numbers(value: object, level: Classification) -> None:
    assert Classification.parse(value) is level


@pytest.mark.parametrize("value", ["secret", "", "2", 4, -1, True, False, 2.0, None, ["public"]])
def test_classification_parse_refuses_unknown_values_naming_the_choices(value: object) -> None:
    with pytest.raises(ValueError) as caught:
        Classification.parse(value)
    message = str(caught.value)
    assert repr(value) in message
    assert "public, internal, confidential, restricted" in message


def test_classification_levels_are_ordered_and_named_in_lower_case() -> None:
    assert Classification.PUBLIC < Classification.INTERNAL < Classification.CONFIDENTIAL < Classification.RESTRICTED
    assert [level.label for level in Classification] == ["public", "internal", "confidential", "restricted"]


# -- GovernanceTags -----------------------------------------------------------------------


def test_tags_for_a_source_carry_one_clause_of_its_allow_list() -> None:
    tags = GovernanceTags.for_source(
        tenant="acme", allow=["user:b", "group:a"], deny=["user:c"], labels=["pii"], classification="confidential"
    )
    assert tags.acl_clauses == (frozenset({"user:b", "group:a"}),)
    assert tags.acl_allow == ["group:a", "user:b"]
    assert tags.clause_tokens == [clause_token(["group:a", "user:b"])]
    assert tags.clauses_by_token == {clause_token(["user:b", "group:a"]): ["group:a", "user:b"]}
    assert tags.classification is Classification.CONFIDENTIAL


def test_tags_refuse_an_empty_allow_list() -> None:
    with pytest.raises(ValueError, match="allows nobody"):
        GovernanceTags.for_source(tenant="acme", allow=[])


def test_tags_refuse_an_empty_clause_among_others() -> None:
    with pytest.raises(ValueError, match="allows nobody"):
        GovernanceTags(tenant="acme", acl_clauses=(frozenset({"user:a"}), frozenset()))


def test_tags_refuse_no_clauses_at_all() -> None:
    with pytest.raises(ValueError, match="allows nobody") as caught:
        GovernanceTags(tenant="acme", acl_clauses=())
    assert isinstance(caught.value, InvalidRequestError), "a malformed tag is a ragwarden error a service answers 422"


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"tenant": ""}, "tenant is empty"),
        ({"allow": ["alice"]}, "not of the form"),
        ({"deny": ["role:x"]}, "not of the form"),
        ({"labels": ["p\nii"]}, "non-printable"),
        ({"classification": "secret"}, "unknown classification"),
    ],
)
def test_tags_refuse_any_malformed_part(fields: dict[str, object], why: str) -> None:
    arguments: dict[str, object] = {"tenant": "acme", "allow": ["user:a"]}
    arguments.update(fields)
    with pytest.raises(ValueError, match=why):
        GovernanceTags.for_source(**arguments)  # type: ignore[arg-type]


def test_tags_refuse_a_classification_that_is_not_a_level() -> None:
    with pytest.raises(ValueError, match="not a Classification"):
        GovernanceTags(tenant="acme", acl_clauses=(frozenset({"user:a"}),), classification=2)  # type: ignore[arg-type]


def test_tags_report_every_problem_at_once() -> None:
    with pytest.raises(ValueError) as caught:
        GovernanceTags.for_source(tenant="", allow=["alice"], labels=[""])
    message = str(caught.value)
    assert "tenant is empty" in message and "'alice'" in message and "label is empty" in message


# -- fingerprint --------------------------------------------------------------------------

BASE = GovernanceTags.for_source(
    tenant="acme", allow=["user:a", "group:g"], deny=["user:d"], labels=["pii", "finance"], classification="internal"
)


def test_fingerprint_is_the_same_for_equal_tags() -> None:
    same = GovernanceTags.for_source(
        tenant="acme", allow=["group:g", "user:a"], deny=["user:d"], labels=["finance", "pii"], classification=1
    )
    assert same.fingerprint() == BASE.fingerprint()


@pytest.mark.parametrize(
    "changed",
    [
        dataclasses.replace(BASE, tenant="globex"),
        dataclasses.replace(BASE, acl_clauses=(frozenset({"user:a"}),)),
        dataclasses.replace(BASE, acl_clauses=(frozenset({"user:a", "group:g"}), frozenset({"user:z"}))),
        dataclasses.replace(BASE, acl_deny=frozenset()),
        dataclasses.replace(BASE, acl_deny=frozenset({"user:d", "user:e"})),
        dataclasses.replace(BASE, labels=frozenset({"pii"})),
        dataclasses.replace(BASE, labels=frozenset({"pii", "finance", "legal"})),
        dataclasses.replace(BASE, classification=Classification.RESTRICTED),
    ],
    ids=["tenant", "allow", "extra-clause", "deny-removed", "deny-added", "label-removed", "label-added", "level"],
)
def test_fingerprint_changes_when_any_tag_changes(changed: GovernanceTags) -> None:
    assert changed != BASE
    assert changed.fingerprint() != BASE.fingerprint()


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ({"labels": ["a|b"]}, {"labels": ["a", "b"]}),
        ({"deny": ["user:a|user:b"]}, {"deny": ["user:a", "user:b"]}),
    ],
    ids=["labels", "deny"],
)
def test_fingerprint_tells_apart_tags_whose_names_hold_the_separator(
    one: dict[str, list[str]], other: dict[str, list[str]]
) -> None:
    first = GovernanceTags.for_source(tenant="acme", allow=["user:a"], **one)  # type: ignore[arg-type]
    second = GovernanceTags.for_source(tenant="acme", allow=["user:a"], **other)  # type: ignore[arg-type]
    assert first != second
    assert first.fingerprint() != second.fingerprint()


# -- clause tokens ------------------------------------------------------------------------


def test_clause_token_does_not_depend_on_order_duplicates_or_container() -> None:
    token = clause_token(["user:a", "group:b", "everyone"])
    assert clause_token(("everyone", "user:a", "group:b")) == token
    assert clause_token(frozenset({"group:b", "everyone", "user:a"})) == token
    assert clause_token(["group:b", "user:a", "everyone", "user:a"]) == token


def test_clause_token_differs_for_different_clauses() -> None:
    tokens = {
        clause_token(["user:a"]),
        clause_token(["user:b"]),
        clause_token(["user:a", "user:b"]),
        clause_token(["user:a,user:b"]),
        clause_token(["user:a user:b"]),
    }
    assert len(tokens) == 5


def test_clause_token_is_a_short_sql_safe_string() -> None:
    token = clause_token(["user:x' OR '1'='1"])
    assert token.startswith("c") and len(token) == 25
    assert token[1:].isalnum() and token.isascii()


def test_a_classification_prints_as_its_name_and_counts_as_its_number() -> None:
    level = Classification.CONFIDENTIAL
    assert (str(level), f"{level}", f"{level:d}", int(level)) == ("confidential", "confidential", "2", 2)
    assert (f"{level:>14}", f"{level:03d}") == ("  confidential", "002")
    assert Classification.parse(str(level)) is level
