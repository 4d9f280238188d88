"""The visibility rule of DESIGN §4, asked of the Casbin enforcer for one row.

This is the second, independent enforcement: the compiled prefilter chose the rows, and each is
checked here before it leaves the data layer. It reads the row's stored columns as they are and
refuses anything it cannot evaluate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .policy import Decision, Policy
from .tags import Classification


def check_row(
    policy: Policy,
    subject: str,
    tenant: str,
    row: Mapping[str, Any],
    clauses: Mapping[str, Sequence[str]],
) -> Decision:
    """Whether ``subject`` in ``tenant`` may read ``row``; ``clauses`` maps clause token -> principals."""
    if (subject, tenant) in policy.deactivated:
        return Decision(allowed=False, reason=deactivated_reason(subject, tenant))
    try:
        row_tenant = row["tenant"]
        allow = list(row["acl_allow"])
        deny = list(row["acl_deny"])
        tokens = list(row["acl_clauses"])
        labels = list(row["labels"])
        level = Classification(int(row["classification"]))
    except (KeyError, TypeError, ValueError) as exc:
        return Decision(allowed=False, reason=f"row cannot be evaluated ({exc!r})")
    if row_tenant != tenant:
        return Decision(allowed=False, reason="row belongs to another tenant")
    if not tokens or not allow:
        return Decision(allowed=False, reason="row has no ACL")

    def held(principal: object) -> bool:
        return isinstance(principal, str) and policy.holds(subject, principal, tenant)

    holding = sorted(p for p in allow if held(p))
    if not holding:
        return Decision(allowed=False, reason="subject holds no principal of the ACL")
    for token in tokens:
        members = clauses.get(token)
        if members is None:
            return Decision(allowed=False, reason=f"ACL clause {token} is unknown")
        if not any(held(p) for p in members):
            return Decision(allowed=False, reason=f"subject holds no principal of ACL clause {token}")
    denied = [p for p in deny if held(p)]
    if denied:
        return Decision(allowed=False, reason=f"denied to {denied[0]}")
    for label in labels:
        if not isinstance(label, str) or not policy.label_allowed(subject, tenant, label):
            return Decision(allowed=False, reason=f"label {label!r} not granted")
    problem = _clearance_problem(policy, subject, tenant, level)
    if problem:
        return Decision(allowed=False, reason=problem)
    return Decision(allowed=True, reason=_allowed_reason(holding, labels, level))


def deactivated_reason(subject: str, tenant: str) -> str:
    """Why a subject the identity provider deactivated reads nothing (and is refused everything)."""
    return f"{subject} is deactivated in {tenant} by the identity provider (SCIM)"


def _clearance_problem(policy: Policy, subject: str, tenant: str, level: Classification) -> str | None:
    """Why the subject's clearance does not reach ``level``, asked of Casbin level by level, or None.

    The clearance (DESIGN §4, point 5) reaches ``level`` when no level at or below it is denied to
    the subject (a deny on a level caps the clearance strictly below it) and, above public, some
    level at or above it is granted (an allow and no deny on it). This is the compiler's
    ``Policy.clearance`` decided another way: from Casbin's verdicts, not from the rule index.
    """
    for lower in (one for one in Classification if one <= level):
        if policy.denies(subject, tenant, f"classification:{lower.label}", "read"):
            return f"clearance capped below {lower.label} by a deny"
    higher = [one for one in Classification if one >= level]
    if level > Classification.PUBLIC and not any(
        policy.enforce(subject, tenant, f"classification:{one.label}", "read") for one in higher
    ):
        return f"clearance below {level.label}"
    return None


def _allowed_reason(holding: list[str], labels: list[str], level: Classification) -> str:
    parts = [f"ACL allows {', '.join(holding)}, which the subject holds"]
    if labels:
        parts.append(f"cleared for {', '.join(sorted(labels))}")
    parts.append(f"clearance covers {level.label}")
    return "; ".join(parts)
