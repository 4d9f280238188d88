"""Random policies ("worlds") for the governance property tests, as raw rules and as CSV text.

A world has one to a few tenants, users, groups nested per tenant (only "upwards" in list order,
so never in a cycle), labels, and read rules: allow and deny rules on labels and on
classification levels (a deny on a level caps the clearance below it, so denies on levels come
one time in three), ``everyone`` named in about half the label rules. Two kinds of names:

- ``hostile_worlds``: names generated from pieces that break naive quoting (SQL quotes and
  comments, LIKE wildcards, a backslash, CSV delimiters and quotes, a comment marker, and unicode
  that looks like or folds to ASCII), so any two names may be near look-alikes;
- ``look_alike_worlds``: names from small fixed pools holding quotes, commas, SQL and LIKE
  characters and look-alike unicode, so that the same few names recur and collide often.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from ragwarden.governance.tags import EVERYONE, Classification, label_problem

EFFECTS = st.sampled_from(["allow", "allow", "allow", "deny"])  # allow three times as often as deny
# on levels, a deny one time in three: a deny caps the clearance below its level, so it matters
# only at or below the levels granted, and should meet them often
LEVEL_EFFECTS = st.sampled_from(["allow", "allow", "deny"])

# Pieces hostile names are built from: SQL quoting and comment characters, LIKE wildcards, a
# backslash, CSV delimiters and quotes, a comment marker, and unicode that looks like (or folds
# to) ASCII.
ATOMS = [
    "a", "b", "x", "fi", "'", "\\", "%", "--", "_", "é", "e\u0301", "日本", "ﬁ", "а", " ", "#", ",",
    '"', ":", ";", "|", "OR", "1=1", ")", "(", "[", "]",
]  # fmt: skip
hostile_names = (
    st.lists(st.sampled_from(ATOMS), min_size=1, max_size=4)
    .map(lambda parts: "".join(parts).strip())
    .filter(lambda name: label_problem(name) is None)
)

# Fixed pools: quotes, commas, SQL comment and LIKE characters, a combining accent, and a Cyrillic
# "а" that looks like the Latin one (so "аcme" and "user:аlice" are look-alikes, not the same).
TENANTS = ["acme", "аcme", "glo'bex", "日本 e\u0301"]
USERS = ["alice", "аlice", "o'neil", "b%_b"]
GROUPS = ["fin", "hr,ops", "staff", 'q"t', "x--y", "日本"]
LABELS = ["pii", "fin'ance", "hr%", "a,b", "日本"]


@dataclass(frozen=True)
class World:
    """One random policy, as the raw rules an oracle reads and the CSV text the Policy loads."""

    tenants: list[str]
    users: list[str]
    groups: list[str]
    memberships: list[tuple[str, str, str]]  # (member, group, tenant)
    permissions: list[tuple[str, str, str, str]]  # (principal, tenant, object, effect)
    labels: list[str]  # the labels the rules may name

    @property
    def principals(self) -> list[str]:
        return [*self.users, *self.groups, EVERYONE]

    def csv_text(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
        for member, group, tenant in self.memberships:
            writer.writerow(["g", member, group, tenant])
        for principal, tenant, obj, effect in self.permissions:
            writer.writerow(["p", principal, tenant, obj, "read", effect])
        return out.getvalue()


def name_lists(
    names: st.SearchStrategy[str] | Sequence[str], *, min_size: int = 0, max_size: int, prefix: str = ""
) -> st.SearchStrategy[list[str]]:
    """Lists of distinct names, drawn from a strategy or from a fixed pool, each given ``prefix``."""
    elements = names if isinstance(names, st.SearchStrategy) else st.sampled_from(list(names))
    return st.lists(elements, min_size=min_size, max_size=max_size, unique=True).map(
        lambda drawn: [prefix + name for name in drawn]
    )


@dataclass(frozen=True)
class WorldShape:
    """What may vary between worlds: where the names come from, and how many rules there are."""

    tenants: st.SearchStrategy[list[str]]
    users: st.SearchStrategy[list[str]]  # "user:..." names
    groups: st.SearchStrategy[list[str]]  # "group:..." names
    labels: st.SearchStrategy[list[str]]
    max_memberships: int  # membership edges drawn, before those that would make a cycle are dropped
    max_label_rules: int
    max_level_rules: int
    max_level_caps: int  # denies drawn at or below a granted level (``caps``), beside the level rules
    everyone_on_levels: bool  # name everyone in about half the classification rules too
    shuffle_rules: bool  # mix label and classification rules in the CSV, not labels first


@st.composite
def worlds(draw: st.DrawFn, shape: WorldShape) -> World:
    tenants = draw(shape.tenants)
    users = draw(shape.users)
    groups = draw(shape.groups)
    labels = draw(shape.labels)
    memberships: list[tuple[str, str, str]] = []
    if groups:
        edges = draw(
            st.lists(
                st.tuples(st.sampled_from(users + groups), st.sampled_from(groups), st.sampled_from(tenants)),
                max_size=shape.max_memberships,
            )
        )
        # groups nest only "upwards" in list order: no cycles, and no deeper than there are groups
        memberships = [
            (member, group, tenant)
            for member, group, tenant in edges
            if not member.startswith("group:") or groups.index(member) < groups.index(group)
        ]
    principals = [*users, *groups, EVERYONE]
    # everyone about half the time (and among the other principals as often as each of them)
    everyone_or_any = st.one_of(st.just(EVERYONE), st.sampled_from(principals))
    label_rules = st.tuples(
        everyone_or_any,
        st.sampled_from(tenants),
        st.sampled_from(labels).map(lambda label: "label:" + label),
        EFFECTS,
    )
    level_rules = st.tuples(
        everyone_or_any if shape.everyone_on_levels else st.sampled_from(principals),
        st.sampled_from(tenants),
        st.sampled_from(list(Classification)).map(lambda level: "classification:" + level.label),
        LEVEL_EFFECTS,
    )
    levels = draw(st.lists(level_rules, max_size=shape.max_level_rules))
    permissions = draw(st.lists(label_rules, max_size=shape.max_label_rules)) + levels + draw(caps(levels, principals, shape))
    if shape.shuffle_rules:
        permissions = draw(st.permutations(permissions))
    return World(
        tenants=tenants, users=users, groups=groups, memberships=memberships, permissions=permissions, labels=labels
    )


def caps(
    levels: list[tuple[str, str, str, str]], principals: list[str], shape: WorldShape
) -> st.SearchStrategy[list[tuple[str, str, str, str]]]:
    """Denies on a level at or below one that a drawn rule grants, in that rule's tenant, for any
    principal: the case where a classification deny changes a clearance (bob holds confidential
    through a group, and internal is denied to him), which rules drawn at random rarely make."""
    grants = [(tenant, Classification.parse(obj.partition(":")[2])) for _, tenant, obj, effect in levels if effect == "allow"]
    if not grants:
        return st.just([])
    cap = st.tuples(st.sampled_from(grants), st.sampled_from(principals)).flatmap(
        lambda drawn: st.sampled_from([level for level in Classification if level <= drawn[0][1]]).map(
            lambda level: (drawn[1], drawn[0][0], "classification:" + level.label, "deny")
        )
    )
    return st.lists(cap, max_size=shape.max_level_caps)


def hostile_worlds() -> st.SearchStrategy[World]:
    """One to three tenants, up to four users, five groups and four labels, all with generated
    hostile names; up to 12 label and 6 classification rules and 3 denies capping a grant, in any
    order."""
    return worlds(
        WorldShape(
            tenants=name_lists(hostile_names, min_size=1, max_size=3),
            users=name_lists(hostile_names, min_size=1, max_size=4, prefix="user:"),
            groups=name_lists(hostile_names, max_size=5, prefix="group:"),
            labels=name_lists(hostile_names, min_size=1, max_size=4),
            max_memberships=12,
            max_label_rules=12,
            max_level_rules=6,
            max_level_caps=3,
            everyone_on_levels=False,
            shuffle_rules=True,
        )
    )


def look_alike_worlds(*, min_tenants: int = 1) -> st.SearchStrategy[World]:
    """``min_tenants`` to two tenants, up to three users and four groups from the fixed pools, all
    five fixed labels; up to 8 label and 5 classification rules, everyone in about half of each,
    and 2 denies capping a grant."""
    return worlds(
        WorldShape(
            tenants=name_lists(TENANTS, min_size=min_tenants, max_size=2),
            users=name_lists(USERS, min_size=1, max_size=3, prefix="user:"),
            groups=name_lists(GROUPS, max_size=4, prefix="group:"),
            labels=st.just(LABELS).map(list),
            max_memberships=10,
            max_label_rules=8,
            max_level_rules=5,
            max_level_caps=2,
            everyone_on_levels=True,
            shuffle_rules=False,
        )
    )
