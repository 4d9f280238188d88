"""Provisioned memberships become policy: only active users' memberships count, a member id naming
no user counts for nothing, the combined policy's version names what was provisioned, and a
combination the role graph refuses is refused whole, never served half applied."""

from __future__ import annotations

import pytest

from ragwarden.errors import PolicyError
from ragwarden.governance.policy import MAX_ROLE_DEPTH, Policy
from ragwarden.governance.provisioned import GROUP, USER, Provisioned
from ragwarden.state import DirectoryRow

POLICY = """
g, user:alice, group:finance, acme
p, group:finance, acme, label:finance, read, allow
p, user:zed, acme, label:notes, read, allow
"""


def user(tenant: str, rid: str, name: str, *, active: bool = True) -> DirectoryRow:
    return DirectoryRow(tenant=tenant, resource_type=USER, resource_id=rid, body="{}", principal=name, active=active)


def group(tenant: str, rid: str, name: str, members: tuple[str, ...]) -> DirectoryRow:
    return DirectoryRow(tenant=tenant, resource_type=GROUP, resource_id=rid, body="{}", principal=name, members=members)


@pytest.fixture
def finance_policy() -> Policy:
    return Policy.from_text(POLICY, source="test")


def test_only_active_users_of_the_groups_tenant_are_members(finance_policy: Policy):
    rows = [
        user("acme", "u1", "user:zed"),
        user("acme", "u2", "user:ivy", active=False),
        user("globex", "u3", "user:hank"),
        group("acme", "g1", "group:finance", ("u1", "u2", "u3", "no-such-id")),
    ]
    provisioned = Provisioned.from_rows(rows)
    assert [rule.values for rule in provisioned.memberships] == [("user:zed", "group:finance", "acme")]
    assert provisioned.deactivated == {("user:ivy", "acme")}
    combined = finance_policy.with_provisioned(provisioned.memberships, deactivated=provisioned.deactivated,
                                               digest=provisioned.digest)  # fmt: skip
    assert combined.label_allowed("user:zed", "acme", "finance")
    assert not combined.label_allowed("user:hank", "acme", "finance"), "a member from another tenant counts for nothing"
    assert combined.membership_origin("user:zed", "group:finance", "acme") == "SCIM group 'finance' (id g1)"
    assert combined.membership_origin("user:alice", "group:finance", "acme") == "policy line 2"
    assert combined.version == f"{finance_policy.version}+scim-{provisioned.digest}"


def test_the_digest_names_the_state_not_the_order_rows_came_in():
    rows = [user("acme", "u1", "user:zed"), user("acme", "u2", "user:ivy"), group("acme", "g1", "group:x", ("u1", "u2"))]
    assert Provisioned.from_rows(rows).digest == Provisioned.from_rows(reversed(rows)).digest
    fewer = [rows[0], rows[1], group("acme", "g1", "group:x", ("u1",))]
    assert Provisioned.from_rows(fewer).digest != Provisioned.from_rows(rows).digest
    deactivated = [rows[0], user("acme", "u2", "user:ivy", active=False), rows[2]]
    assert Provisioned.from_rows(deactivated).digest != Provisioned.from_rows(fewer).digest


def test_a_provisioned_membership_that_nests_past_the_limit_is_refused_whole():
    """The policy nests nine groups deep (Casbin's limit); a user provisioned into the innermost
    would be the tenth link, which Casbin would silently cut: refused instead."""
    chain = "".join(f"g, group:g{n}, group:g{n + 1}, acme\n" for n in range(MAX_ROLE_DEPTH))
    policy = Policy.from_text(chain + "p, group:g9, acme, label:finance, read, allow\n", source="t")
    provisioned = Provisioned.from_rows([user("acme", "u1", "user:zed"), group("acme", "g1", "group:g0", ("u1",))])
    with pytest.raises(PolicyError, match="provisioned memberships cannot be combined"):
        policy.with_provisioned(provisioned.memberships, deactivated=provisioned.deactivated, digest=provisioned.digest)


def test_claimed_groups_over_a_provisioned_policy_keep_its_deactivations(finance_policy: Policy):
    provisioned = Provisioned.from_rows([user("acme", "u1", "user:zed", active=False)])
    combined = finance_policy.with_provisioned(provisioned.memberships, deactivated=provisioned.deactivated,
                                               digest=provisioned.digest)  # fmt: skip
    claimed = combined.with_memberships("user:zed", "acme", frozenset({"group:finance"}))
    assert claimed.deactivated == {("user:zed", "acme")}
    assert claimed.version.startswith(combined.version + "+groups-")
