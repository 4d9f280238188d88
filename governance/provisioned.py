"""Memberships an identity provider provisioned (SCIM), laid over the policy in force.

The directory (``state.directory``) holds each tenant's users and groups as the provider sent them.
Here they become what the policy decides with: ``g`` rules (member user, group, tenant) whose origin
names the provisioned group, so ``explain`` says where a membership came from, and the set of
users the provider deactivated, who are refused everything in that tenant. Only active users'
memberships count; a member id naming no user of the tenant counts for nothing.

The combined policy is rebuilt only when the base policy or what was provisioned changes; the
directory's version is part of every request's freshness check, so a membership removed on any
replica is gone from every replica's next request.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ..errors import PolicyError
from .policy import Policy, Rule

log = logging.getLogger(__name__)

USER = "User"
GROUP = "Group"

class ProvisionedRow(Protocol):
    """What a directory row tells governance (``state.directory.DirectoryRow``)."""

    tenant: str
    resource_type: str
    resource_id: str
    principal: str | None
    active: bool | None
    members: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Provisioned:
    """Every tenant's provisioned memberships (``g`` rules) and deactivated (subject, tenant)
    pairs, with a digest of both that names this state in the policy's version."""

    memberships: tuple[Rule, ...]
    deactivated: frozenset[tuple[str, str]]
    digest: str

    @property
    def empty(self) -> bool:
        return not self.memberships and not self.deactivated

    def over(self, base: Policy) -> Policy:
        """``base`` with these memberships and deactivations (``PolicyError`` if they cannot combine)."""
        return base.with_provisioned(self.memberships, deactivated=self.deactivated, digest=self.digest)

    @classmethod
    def from_rows(cls, rows: Iterable[ProvisionedRow]) -> Provisioned:
        users: dict[tuple[str, str], tuple[str, bool]] = {}
        groups: list[ProvisionedRow] = []
        for row in rows:
            if row.principal is None:
                continue
            if row.resource_type == USER:
                users[(row.tenant, row.resource_id)] = (row.principal, row.active is not False)
            elif row.resource_type == GROUP:
                groups.append(row)
        memberships: dict[tuple[str, str, str], Rule] = {}
        for group in sorted(groups, key=lambda g: (g.tenant, g.principal or "", g.resource_id)):
            assert group.principal is not None
            origin = f"SCIM group {group.principal.removeprefix('group:')!r} (id {group.resource_id})"
            for member in group.members:
                user = users.get((group.tenant, member))
                if user is not None and user[1]:
                    values = (user[0], group.principal, group.tenant)
                    memberships.setdefault(values, Rule(ptype="g", values=values, line=0, origin=origin))
        deactivated = frozenset((principal, tenant) for (tenant, _), (principal, active) in users.items() if not active)
        digest = hashlib.sha256()
        for values in sorted(memberships):
            digest.update(("\x1e" + "\x1f".join(values)).encode("utf-8"))
        for subject, tenant in sorted(deactivated):
            digest.update(("\x1d" + subject + "\x1f" + tenant).encode("utf-8"))
        return cls(memberships=tuple(memberships[key] for key in sorted(memberships)), deactivated=deactivated,
                   digest=digest.hexdigest()[:32])  # fmt: skip


def combined(base: Policy, provisioned: Provisioned) -> Policy:
    """``base`` with ``provisioned``; if they cannot combine, with the memberships of the tenants
    that can, the others refused (never decided without their provisioned state)."""
    try:
        return provisioned.over(base)
    except PolicyError:
        pass
    by_tenant: dict[str, list[Rule]] = {}
    for rule in provisioned.memberships:
        by_tenant.setdefault(rule.values[2], []).append(rule)
    kept: list[Rule] = []
    refused: dict[str, str] = {}
    for tenant, rules in sorted(by_tenant.items()):
        try:
            base.with_provisioned(rules, deactivated=frozenset(), digest=provisioned.digest)
        except PolicyError as exc:
            log.error("the memberships provisioned in tenant %r are refused: %s", tenant, exc)
            refused[tenant] = f"the memberships provisioned in {tenant} cannot be combined with the policy: {exc}"
            continue
        kept.extend(rules)
    combined = base.with_provisioned(kept, deactivated=provisioned.deactivated, digest=provisioned.digest)
    if combined is base:
        combined = base._extended([], source="provisioned memberships", suffix=f"scim-{provisioned.digest}")
    combined.refused_tenants = {**combined.refused_tenants, **refused}
    return combined
