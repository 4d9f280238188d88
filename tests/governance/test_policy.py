"""The policy: strict parsing of rule files, and the questions the rest of the system asks."""

from __future__ import annotations

import logging
import logging.config
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragwarden.errors import InvalidPolicyError, PolicyError
from ragwarden.governance.policy import MAX_ROLE_DEPTH, Policy, parse_rules
from ragwarden.governance.tags import EVERYONE, Classification

# -- bad files: each is refused naming its line and why -------------------------------------

BAD_FILES = [
    ("wrong_field_count.csv", {3}, "a p rule has 5 fields"),
    ("unknown_ptype.csv", {4}, "unknown rule type 'g2'"),
    ("bad_effect.csv", {2}, "effect 'permit' is neither allow nor deny"),
    ("bad_object.csv", {3}, "object 'salaries_table' is neither label:NAME, classification:LEVEL nor an operation"),
    ("bad_principal.csv", {3}, "principal 'alice' is not of the form user:NAME, group:NAME, service:NAME or everyone"),
    ("everyone_joins_group.csv", {3}, "everyone cannot join a group"),
    ("member_of_non_group.csv", {2}, "'user:bob' is not a group"),
    ("cycle.csv", {3, 4, 5}, "membership cycle through"),
    ("too_deep.csv", set(range(2, 13)), f"group nesting deeper than {MAX_ROLE_DEPTH} levels"),
    ("invalid_csv.csv", {3}, "not valid CSV"),
]


@pytest.mark.parametrize(("name", "lines", "reason"), BAD_FILES, ids=[name for name, _, _ in BAD_FILES])
def test_bad_policy_file_is_refused_naming_the_line_and_the_reason(
    policy_path: Callable[[str], Path], name: str, lines: set[int], reason: str
) -> None:
    path = policy_path(name)
    with pytest.raises(InvalidPolicyError) as caught:
        parse_rules(path.read_text(encoding="utf-8"), source=str(path))
    error = caught.value
    assert error.line in lines
    assert reason in error.reason
    assert error.path == str(path)
    assert str(error) == f"{path}:{error.line}: {error.reason}"


@pytest.mark.parametrize(("name", "lines", "reason"), BAD_FILES[:3], ids=[name for name, _, _ in BAD_FILES[:3]])
def test_loading_a_bad_policy_file_raises_the_same_named_error(
    policy_path: Callable[[str], Path], name: str, lines: set[int], reason: str
) -> None:
    with pytest.raises(InvalidPolicyError) as caught:
        Policy.from_file(policy_path(name))
    assert caught.value.line in lines and reason in caught.value.reason
    assert isinstance(caught.value, PolicyError)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("p, user:a, acme, label:pii, write, allow", "label rules take the action read"),
        ("p, user:a, acme, classification:secret, read, allow", "unknown classification 'secret'"),
        ("p, user:a, acme, classification:internal, execute, allow", "classification rules take the action read"),
        ("p, user:a, acme, forget, delete, allow", "operation rules take the action read or execute"),
        ("p, user:a, acme, label:, read, allow", "label is empty"),
        ("p, user:a, , label:pii, read, allow", "tenant is empty"),
        ("p, role:admin, acme, audit, read, allow", "not of the form"),
        ("g, user:a, group:b", "a g rule has 3 fields"),
        ("g, user:a, group:b, acme, extra", "a g rule has 3 fields"),
        ("p, user:a, acme, label:pii, read, allow, extra", "a p rule has 5 fields"),
        ("g, user:a, everyone, acme", "is not a group"),
        ("g, group:a, group:a, acme", "membership cycle"),
    ],
)
def test_bad_rule_is_refused_with_its_reason(line: str, reason: str) -> None:
    with pytest.raises(InvalidPolicyError) as caught:
        parse_rules("# a comment\n\n" + line + "\n")
    assert caught.value.line == 3
    assert reason in caught.value.reason


def test_missing_policy_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="does not exist"):
        Policy.from_file(tmp_path / "absent.csv")


def test_policy_file_that_is_not_utf8_is_a_policy_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes("p, user:é, acme, audit, read, allow\n".encode("latin-1"))
    with pytest.raises(PolicyError, match="not valid UTF-8"):
        Policy.from_file(path)


# -- good files ---------------------------------------------------------------------------


def test_quoted_values_with_commas_load_as_one_value(quoted_values_policy: Policy) -> None:
    values = [rule.values for rule in quoted_values_policy.rules]
    assert ("user:smith, john", "group:m&a, 2024", "acme") in values
    assert ("group:m&a, 2024", "acme", "label:deal, project x", "read", "allow") in values
    principals = quoted_values_policy.principals("user:smith, john", "acme")
    assert principals == {"user:smith, john", "group:m&a, 2024", EVERYONE}
    assert quoted_values_policy.label_allowed("user:smith, john", "acme", "deal, project x")
    assert not quoted_values_policy.label_allowed("user:smith", "acme", "deal, project x")
    assert "deal, project x" in quoted_values_policy.labels


def test_trailing_comment_is_stripped_from_a_rule(quoted_values_policy: Policy) -> None:
    values = [rule.values for rule in quoted_values_policy.rules]
    assert ("group:finance", "acme", "label:pii", "read", "allow") in values
    assert ("user:alice", "group:finance", "acme") in values
    assert quoted_values_policy.label_allowed("user:alice", "acme", "pii")


def test_rules_remember_their_line_numbers(quoted_values_policy: Policy) -> None:
    assert [rule.line for rule in quoted_values_policy.rules] == [2, 3, 4, 5]


def test_comments_and_blank_lines_are_not_rules() -> None:
    assert parse_rules("# only a comment\n\n   \n  # indented comment\n") == []


# -- deny, everyone -----------------------------------------------------------------------


def test_deny_overrides_allow_for_the_denied_subject_only(deny_overrides_policy: Policy) -> None:
    assert deny_overrides_policy.label_allowed("user:alice", "acme", "pii")
    assert not deny_overrides_policy.label_allowed("user:bob", "acme", "pii")


def test_deny_on_a_group_reaches_its_nested_members(deny_overrides_policy: Policy) -> None:
    assert deny_overrides_policy.label_allowed("user:alice", "acme", "payroll")
    assert not deny_overrides_policy.label_allowed("user:mallory", "acme", "payroll")
    # mallory is still in finance for everything else
    assert deny_overrides_policy.label_allowed("user:mallory", "acme", "pii")


def test_rule_for_everyone_applies_to_every_subject_of_its_tenant(everyone_rules_policy: Policy) -> None:
    for subject in ("user:alice", "user:stranger", "user:x' OR '1'='1"):
        assert everyone_rules_policy.label_allowed(subject, "acme", "handbook")
        assert everyone_rules_policy.clearance(subject, "acme") is Classification.INTERNAL
        assert not everyone_rules_policy.label_allowed(subject, "globex", "handbook")
        assert everyone_rules_policy.label_allowed(subject, "globex", "globex-news")
        assert not everyone_rules_policy.label_allowed(subject, "acme", "globex-news")


def test_deny_for_everyone_overrides_a_group_allow(everyone_rules_policy: Policy) -> None:
    assert not everyone_rules_policy.label_allowed("user:alice", "acme", "salaries")


def test_label_no_rule_names_is_allowed_to_nobody(nested_groups_policy: Policy) -> None:
    assert not nested_groups_policy.label_allowed("user:alice", "acme", "export-control")


# -- principals, holds --------------------------------------------------------------------


def test_principals_are_transitive_through_nested_groups(nested_groups_policy: Policy) -> None:
    assert nested_groups_policy.principals("user:alice", "acme") == {
        "user:alice",
        EVERYONE,
        "group:fpa",
        "group:finance",
        "group:staff",
    }
    assert nested_groups_policy.principals("user:bob", "acme") == {"user:bob", EVERYONE, "group:hr", "group:staff"}


def test_principals_are_per_tenant(nested_groups_policy: Policy) -> None:
    assert nested_groups_policy.principals("user:alice", "globex") == {"user:alice", EVERYONE, "group:auditors"}
    assert nested_groups_policy.principals("user:bob", "globex") == {"user:bob", EVERYONE}
    assert nested_groups_policy.principals("user:alice", "initech") == {"user:alice", EVERYONE}


def test_unknown_subject_holds_only_itself_and_everyone(nested_groups_policy: Policy) -> None:
    assert nested_groups_policy.principals("user:nobody", "acme") == {"user:nobody", EVERYONE}


def test_holds_follows_nested_membership_within_the_tenant(nested_groups_policy: Policy) -> None:
    policy = nested_groups_policy
    assert policy.holds("user:alice", "user:alice", "acme")
    assert policy.holds("user:alice", EVERYONE, "acme")
    assert policy.holds("user:alice", "group:fpa", "acme")
    assert policy.holds("user:alice", "group:staff", "acme")
    assert not policy.holds("user:alice", "group:hr", "acme")
    assert not policy.holds("user:alice", "group:auditors", "acme")
    assert policy.holds("user:alice", "group:auditors", "globex")
    assert not policy.holds("user:alice", "group:staff", "globex")
    assert not policy.holds("user:bob", "user:alice", "acme")


def test_a_group_rule_reaches_members_of_nested_groups(nested_groups_policy: Policy) -> None:
    assert nested_groups_policy.label_allowed("user:alice", "acme", "finance")
    assert not nested_groups_policy.label_allowed("user:bob", "acme", "finance")
    assert nested_groups_policy.label_allowed("group:fpa", "acme", "finance")


def test_operation_is_granted_only_where_the_policy_says(nested_groups_policy: Policy) -> None:
    assert nested_groups_policy.allows_operation("user:alice", "globex", "audit").allowed
    assert not nested_groups_policy.allows_operation("user:alice", "acme", "audit").allowed
    unknown = nested_groups_policy.allows_operation("user:alice", "globex", "drop-table")
    assert not unknown.allowed and "unknown operation" in unknown.reason


# -- clearance ----------------------------------------------------------------------------


def test_clearance_defaults_to_public(nested_groups_policy: Policy) -> None:
    assert nested_groups_policy.clearance("user:nobody", "acme") is Classification.PUBLIC
    assert nested_groups_policy.clearance("user:alice", "globex") is Classification.PUBLIC


def test_clearance_is_the_highest_level_granted(nested_groups_policy: Policy) -> None:
    assert nested_groups_policy.clearance("user:alice", "acme") is Classification.CONFIDENTIAL
    assert nested_groups_policy.clearance("user:bob", "acme") is Classification.INTERNAL
    assert nested_groups_policy.clearance("user:carol", "acme") is Classification.INTERNAL


def test_a_deny_on_a_lower_level_caps_the_clearance_below_it_whatever_is_granted() -> None:
    policy = Policy.from_text(
        "g, user:a, group:board, acme\n"
        "p, group:board, acme, classification:restricted, read, allow\n"
        "p, user:a, acme, classification:internal, read, deny\n"
    )
    assert policy.clearance("user:a", "acme") is Classification.PUBLIC


@pytest.mark.parametrize(
    ("subject", "level"),
    [
        ("user:bob", Classification.PUBLIC),  # confidential through finance; internal denied to him
        ("user:carol", None),  # internal through staff; public denied to her group: nothing at all
        ("user:erin", Classification.CONFIDENTIAL),  # the deny on restricted is above her grant
        ("user:frank", Classification.PUBLIC),  # restricted allowed to him and denied to everyone
        ("user:zed", Classification.PUBLIC),  # nothing granted: public by default
    ],
)
def test_a_classification_deny_caps_the_clearance_strictly_below_its_level(
    classification_denies_policy: Policy, subject: str, level: Classification | None
) -> None:
    assert classification_denies_policy.clearance(subject, "acme") == level


@pytest.mark.parametrize(
    ("subject", "grant", "cap", "described"),
    [
        ("user:bob", 8, 9, "public (confidential granted by line 8; capped below internal by line 9)"),
        ("user:carol", 11, 10, "none (internal granted by line 11; capped below public by line 10)"),
        ("user:erin", 8, None, "confidential (confidential granted by line 8)"),
        ("user:frank", None, None, "public (nothing granted)"),
    ],
)
def test_a_clearance_names_the_lines_that_set_it(
    classification_denies_policy: Policy, subject: str, grant: int | None, cap: int | None, described: str
) -> None:
    clearance = classification_denies_policy.clearance_of(subject, "acme")
    assert (clearance.grant and clearance.grant.line, clearance.cap and clearance.cap.line) == (grant, cap)
    assert clearance.describe(lambda rule: f"line {rule.line}") == described


def test_a_classification_deny_reaches_through_nested_groups_and_everyone() -> None:
    policy = Policy.from_text(
        "g, user:a, group:inner, acme\n"
        "g, group:inner, group:outer, acme\n"
        "p, group:outer, acme, classification:restricted, read, allow\n"
        "p, group:outer, acme, classification:confidential, read, deny\n"
        "p, everyone, globex, classification:internal, read, deny\n"
        "p, everyone, globex, classification:confidential, read, allow\n"
    )
    assert policy.clearance("user:a", "acme") is Classification.INTERNAL
    assert policy.clearance("user:a", "globex") is Classification.PUBLIC
    assert policy.clearance("user:stranger", "acme") is Classification.PUBLIC


def test_clearance_denied_at_the_top_falls_back_to_the_next_grant() -> None:
    policy = Policy.from_text(
        "g, user:a, group:board, acme\n"
        "p, group:board, acme, classification:restricted, read, allow\n"
        "p, group:board, acme, classification:confidential, read, allow\n"
        "p, user:a, acme, classification:restricted, read, deny\n"
    )
    assert policy.clearance("user:a", "acme") is Classification.CONFIDENTIAL


def test_classification_rule_written_in_another_case_grants_the_level_or_is_refused() -> None:
    text = "p, user:a, acme, classification:Confidential, read, allow\n"
    try:
        policy = Policy.from_text(text)
    except InvalidPolicyError:
        return  # refusing the line is a correct answer too
    assert policy.clearance("user:a", "acme") is Classification.CONFIDENTIAL


# -- nesting depth ------------------------------------------------------------------------


def test_nine_deep_chain_is_accepted_and_resolves_in_principals(nine_deep_chain_policy: Policy) -> None:
    principals = nine_deep_chain_policy.principals("user:deep", "acme")
    assert {f"group:level{i}" for i in range(1, 10)} <= principals


def test_nine_deep_chain_resolves_in_the_enforcer(nine_deep_chain_policy: Policy) -> None:
    assert nine_deep_chain_policy.holds("user:deep", "group:level9", "acme")
    assert nine_deep_chain_policy.label_allowed("user:deep", "acme", "deep")


def test_ten_deep_chain_that_casbin_would_silently_deny_is_refused(policy_path: Callable[[str], Path]) -> None:
    with pytest.raises(InvalidPolicyError, match="deeper than 9"):
        Policy.from_file(policy_path("too_deep.csv"))


# -- version and text ---------------------------------------------------------------------


def test_version_is_stable_for_the_same_rules(nested_groups_policy: Policy, policy_path: Callable[[str], Path]) -> None:
    again = Policy.from_file(policy_path("nested_groups.csv"))
    assert again.version == nested_groups_policy.version
    spaced = Policy.from_text("# a different comment\n\n" + plain_text(nested_groups_policy).replace(",", " ,  "))
    assert spaced.version == nested_groups_policy.version


def plain_text(policy: Policy) -> str:
    """The rules as unquoted CSV, the way people write them."""
    return "".join(",".join([rule.ptype, *rule.values]) + "\n" for rule in policy.rules)


def test_version_changes_when_a_rule_changes(nested_groups_policy: Policy) -> None:
    text = plain_text(nested_groups_policy)
    changed = [
        text.replace("label:finance,read,allow", "label:finance,read,deny"),
        text.replace("g,user:carol,group:staff,acme\n", ""),
        text + "p,user:carol,acme,label:pii,read,allow\n",
        text.replace("user:bob", "user:bobby"),
    ]
    versions = {Policy.from_text(one).version for one in changed}
    assert all(one != text for one in changed)
    assert nested_groups_policy.version not in versions
    assert len(versions) == len(changed)


GOOD_FILES = ["nested_groups.csv", "deny_overrides.csv", "everyone_rules.csv", "quoted_values.csv", "chain_9.csv"]


@pytest.mark.parametrize("name", GOOD_FILES)
def test_policy_text_round_trips(policy_path: Callable[[str], Path], name: str) -> None:
    policy = Policy.from_file(policy_path(name))
    again = Policy.from_text(policy.text)
    assert again.version == policy.version
    assert [rule.values for rule in again.rules] == [rule.values for rule in policy.rules]


def test_policy_text_round_trips_hostile_values() -> None:
    policy = Policy.from_text(
        '"g", "user:x\' OR \'1\'=\'1", "group:a,b", "t\\\\"\n'
        '"p", "group:a,b", "t\\\\", "label:say ""hi""", "read", "allow"\n'
    )
    assert policy.rules[0].values == ("user:x' OR '1'='1", "group:a,b", "t\\\\")
    assert policy.rules[1].values[2] == 'label:say "hi"'
    assert Policy.from_text(policy.text).version == policy.version


def test_policy_text_round_trips_a_value_holding_space_hash() -> None:
    policy = Policy.from_text('p, user:a, acme, "label:x #y", read, allow\n')
    assert Policy.from_text(policy.text).version == policy.version


_NAMES = st.sampled_from(["user:a", "user:b", "group:x", "group:y", "group:z", "everyone"])
_GROUPS = st.sampled_from(["group:x", "group:y", "group:z"])
_TENANTS = st.sampled_from(["acme", "globex"])


@settings(max_examples=150, deadline=None)
@given(
    memberships=st.lists(st.tuples(st.sampled_from(["user:a", "user:b", "group:x", "group:y"]), _GROUPS, _TENANTS), max_size=6),
    grants=st.lists(
        st.tuples(_NAMES, _TENANTS, st.sampled_from(["pii", "hr", "deal"]), st.sampled_from(["allow", "deny"])), max_size=8
    ),
)
def test_cleared_labels_agree_with_casbin_for_every_label(
    memberships: list[tuple[str, str, str]], grants: list[tuple[str, str, str, str]]
) -> None:
    lines = [f"g, {member}, {group}, {tenant}" for member, group, tenant in memberships if member != group]
    lines += [f"p, {who}, {tenant}, label:{label}, read, {effect}" for who, tenant, label, effect in grants]
    try:
        policy = Policy.from_text("\n".join(lines) + "\n")
    except PolicyError:
        return  # a cycle or a chain too deep is refused, which other tests cover
    for subject in ("user:a", "user:b"):
        for tenant in ("acme", "globex"):
            expected = {label for label in ("pii", "hr", "deal") if policy.label_allowed(subject, tenant, label)}
            assert policy.cleared_labels(subject, tenant) == expected


def test_casbin_checks_log_nothing_even_after_logging_is_configured_again(caplog: pytest.LogCaptureFixture):
    """Casbin logs each check with its subject and object; a server's logging configuration
    (uvicorn's ``dictConfig``) re-enables the loggers Casbin disables, so they are bypassed."""
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})
    caplog.set_level(logging.DEBUG)
    policy = Policy.from_text("p, user:alice, acme, label:pii, read, allow\n", source="t")
    assert not policy.enforce("user:bob", "acme", "label:pii", "read")
    assert policy.enforce("user:alice", "acme", "label:pii", "read")
    assert not [record for record in caplog.records if "user:bob" in record.getMessage() or "Request:" in record.getMessage()]
