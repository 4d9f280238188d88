"""The visibility rule of DESIGN §4 in plain Python over raw rules: an oracle that shares no code
with the product's Policy, compiler or enforcer."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from support.policy_worlds import World

from ragwarden.governance.tags import EVERYONE, Classification

ORACLE_COLUMNS = ["chunk_id", "tenant", "acl_allow", "acl_deny", "acl_clauses", "labels", "classification"]

def world_of_policy(text: str) -> World:
    """A policy file's g and p lines as the oracle's raw rules (comments and blank lines skipped)."""
    memberships, permissions = [], []
    for row in csv.reader(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")):
        kind, *values = [value.strip() for value in row]
        if kind == "g":
            memberships.append((values[0], values[1], values[2]))
        elif kind == "p" and values[3] == "read":
            permissions.append((values[0], values[1], values[2], values[4]))
    tenants = sorted({t for *_, t in memberships} | {p[1] for p in permissions})
    return World(tenants=tenants, users=[], groups=[], memberships=memberships, permissions=permissions, labels=[])



def oracle_principals(world: World, subject: str, tenant: str) -> set[str]:
    """{S, everyone} and every group S holds in T, transitively."""
    held = {subject, EVERYONE}
    frontier = [subject]
    while frontier:
        member = frontier.pop()
        for who, group, where in world.memberships:
            if where == tenant and who == member and group not in held:
                held.add(group)
                frontier.append(group)
    return held


def oracle_effects(world: World, held: set[str], tenant: str, obj: str) -> set[str]:
    """The effects of the read rules on ``obj`` in ``tenant`` for a held principal (everyone included)."""
    return {effect for who, where, what, effect in world.permissions if where == tenant and what == obj and who in held}


def oracle_grants(world: World, held: set[str], tenant: str, obj: str) -> bool:
    """Some allow rule for a held principal, and no deny rule for one."""
    return oracle_effects(world, held, tenant, obj) == {"allow"}


def oracle_clearance(world: World, held: set[str], tenant: str) -> Classification | None:
    """The highest level granted (public by default), capped strictly below the lowest level
    denied to a held principal; None (nothing readable) when public is denied."""
    levels = {level: oracle_effects(world, held, tenant, f"classification:{level.label}") for level in Classification}
    clearance = max((level for level, effects in levels.items() if effects == {"allow"}), default=Classification.PUBLIC)
    for level, effects in sorted(levels.items()):
        if "deny" in effects and level <= clearance:
            return Classification(level - 1) if level > Classification.PUBLIC else None
    return clearance


def oracle_visible(
    world: World, subject: str, tenant: str, rows: Iterable[Mapping[str, Any]], registry: Mapping[str, Sequence[str]]
) -> set[str]:
    held = oracle_principals(world, subject, tenant)
    clearance = oracle_clearance(world, held, tenant)
    visible = set()
    for row in rows:
        if row["tenant"] != tenant:
            continue
        if not held & set(row["acl_allow"]):
            continue
        if not row["acl_clauses"] or not all(
            token in registry and held & set(registry[token]) for token in row["acl_clauses"]
        ):
            continue
        if held & set(row["acl_deny"]):
            continue
        if not all(oracle_grants(world, held, tenant, f"label:{label}") for label in row["labels"]):
            continue
        if clearance is None or row["classification"] > clearance:
            continue
        visible.add(row["chunk_id"])
    return visible
