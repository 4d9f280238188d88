"""Why a subject may or may not read a row: the visibility rule, step by step, with the rules that decided.

The verdict comes from ``check_row`` (the enforcer); the steps only explain it, naming the group
path that matched each principal and the policy line that cleared or denied each label.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from .policy import Policy, Rule
from .tags import EVERYONE, Classification
from .visibility import check_row


@dataclass(frozen=True, kw_only=True)
class Step:
    """One condition of the visibility rule: whether it held, and the evidence."""

    check: str
    passed: bool
    detail: str


@dataclass(frozen=True, kw_only=True)
class Explanation:
    """The decision on one row for one subject, with its chain of reasons (empty when withheld)."""

    chunk_id: str
    subject: str
    tenant: str
    allowed: bool
    reason: str
    steps: tuple[Step, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "chunk_id": self.chunk_id,
            "subject": self.subject,
            "tenant": self.tenant,
            "allowed": self.allowed,
            "reason": self.reason,
            "steps": [{"check": s.check, "passed": s.passed, "detail": s.detail} for s in self.steps],
        }


def not_visible(chunk_id: str, subject: str, tenant: str) -> Explanation:
    """The only answer given about a row the asker may not learn anything of."""
    return Explanation(chunk_id=chunk_id, subject=subject, tenant=tenant, allowed=False, reason="not visible")


def membership_chain(policy: Policy, subject: str, principal: str, tenant: str) -> str:
    """The membership chain, each step naming where it comes from (a policy line, the token)."""
    path = policy.membership_path(subject, principal, tenant)
    if not path:
        return principal
    steps = [path[0]]
    for member, group in pairwise(path):
        steps.append(group if group == EVERYONE else f"{group} ({policy.membership_origin(member, group, tenant)})")
    return " -> ".join(steps)


def _rule_text(rule: Rule) -> str:
    return f"line {rule.line}: {rule.ptype}, {', '.join(rule.values)}"


def explain_row(
    policy: Policy, subject: str, tenant: str, row: Mapping[str, Any], clauses: Mapping[str, Sequence[str]]
) -> Explanation:
    """The full chain of reasons for ``subject`` reading ``row`` in ``tenant``."""
    decision = check_row(policy, subject, tenant, row, clauses)
    if decision.reason.startswith("row cannot be evaluated") or (subject, tenant) in policy.deactivated:
        return Explanation(chunk_id=str(row.get("chunk_id")), subject=subject, tenant=tenant, allowed=False, reason=decision.reason)
    steps = [Step(check="tenant", passed=row["tenant"] == tenant, detail=f"row tenant {row['tenant']!r}, asked in {tenant!r}")]
    for token in row["acl_clauses"]:
        members = clauses.get(token)
        held = sorted(p for p in members or () if policy.holds(subject, p, tenant))
        detail = (
            f"allowed {', '.join(sorted(members))}; matched through {membership_chain(policy, subject, held[0], tenant)}"
            if held
            else f"allowed {', '.join(sorted(members or ['?']))}; the subject holds none of them"
        )
        steps.append(Step(check=f"acl clause {token}", passed=bool(held), detail=detail))
    denied = [p for p in row["acl_deny"] if policy.holds(subject, p, tenant)]
    steps.append(
        Step(
            check="acl deny",
            passed=not denied,
            detail=f"denied to {denied[0]} through {membership_chain(policy, subject, denied[0], tenant)}" if denied else "no deny applies",
        )
    )
    for label in row["labels"]:
        rules = policy.rules_for(subject, tenant, f"label:{label}")
        allows = [r for r in rules if r.values[4] == "allow"]
        denies = [r for r in rules if r.values[4] == "deny"]
        if denies:
            detail = f"denied by {_rule_text(denies[0])}"
        elif allows:
            detail = f"cleared by {_rule_text(allows[0])}"
        else:
            detail = "no rule clears this label"
        steps.append(Step(check=f"label {label}", passed=policy.label_allowed(subject, tenant, label), detail=detail))
    level = Classification(int(row["classification"]))
    clearance = policy.clearance_of(subject, tenant)
    steps.append(
        Step(
            check="classification",
            passed=clearance.reaches(level),
            detail=f"row is {level.label}; clearance is {clearance.describe(_rule_text)}",
        )
    )
    return Explanation(
        chunk_id=row["chunk_id"],
        subject=subject,
        tenant=tenant,
        allowed=decision.allowed,
        reason=decision.reason,
        steps=tuple(steps),
    )
