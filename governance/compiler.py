"""Compile the policy, for one subject in one tenant, into one LanceDB SQL prefilter.

The filter is the visibility rule of DESIGN §4 written over row columns. Each term is written so
that a NULL or missing value fails it: a row that cannot be evaluated never passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .policy import Decision, Policy
from .sql import sql_list, sql_string
from .tags import Classification
from .visibility import check_row


@dataclass(frozen=True, kw_only=True)
class SubjectView:
    """What the policy grants one subject in one tenant, at one policy version; ``policy`` is that
    policy, so the view is all a search needs to decide rows for its caller."""

    subject: str
    tenant: str
    policy_version: str
    principals: frozenset[str]
    cleared_labels: frozenset[str]
    clearance: Classification | None  # None: nothing is readable, not even public rows
    policy: Policy = field(compare=False, repr=False)

    @classmethod
    def of(cls, policy: Policy, subject: str, tenant: str) -> SubjectView:
        return cls(
            policy=policy,
            subject=subject,
            tenant=tenant,
            policy_version=policy.version,
            principals=policy.principals(subject, tenant),
            cleared_labels=policy.cleared_labels(subject, tenant),
            # a subject the identity provider deactivated reads nothing, not even public rows
            clearance=None if (subject, tenant) in policy.deactivated else policy.clearance(subject, tenant),
        )

    def check(self, row: Mapping[str, Any], clauses: Mapping[str, Sequence[str]]) -> Decision:
        """The enforcer's decision on one row for this subject (``visibility.check_row``)."""
        return check_row(self.policy, self.subject, self.tenant, row, clauses)

    def satisfied_clauses(self, clauses: Mapping[str, Iterable[str]]) -> frozenset[str]:
        """The clause tokens (token -> principals) this subject satisfies."""
        return frozenset(token for token, members in clauses.items() if self.principals.intersection(members))


def compile_filter(view: SubjectView, satisfied_clauses: frozenset[str]) -> str:
    """One SQL predicate true exactly for the rows ``view`` may read.

    ``satisfied_clauses`` are the ACL clause tokens the subject satisfies; a row passes only if
    every one of its clause tokens is among them, so a token unknown to the caller fails closed.
    """
    principals = sql_list(view.principals)
    terms = [
        f"tenant = {sql_string(view.tenant)}",
        f"array_has_any(acl_allow, {principals})",
        f"NOT array_has_any(acl_deny, {principals})",
        "cardinality(acl_clauses) > 0",
        f"array_has_all({sql_list(satisfied_clauses)}, acl_clauses)" if satisfied_clauses else "FALSE",
        (
            f"(cardinality(labels) = 0 OR array_has_all({sql_list(view.cleared_labels)}, labels))"
            if view.cleared_labels
            else "cardinality(labels) = 0"
        ),
        _classification_term(view),
    ]
    return " AND ".join(f"({term})" for term in terms)


def _classification_term(view: SubjectView) -> str:
    """Rows within the view's clearance; none at all when a deny on public left it nothing. A NULL
    or out-of-range classification fails the range, so such a row is never returned."""
    if view.clearance is None:
        return "FALSE"
    return f"classification BETWEEN {int(Classification.PUBLIC)} AND {int(view.clearance)}"


def compile_prefilter(view: SubjectView, clauses: Mapping[str, Iterable[str]], labels: Iterable[str]) -> str:
    """The filter of ``compile_filter`` written so that every term is served by a scalar index.

    Subset tests become "none of the others": a row passes when it names a satisfied clause and
    no unsatisfied one, and carries no label outside the caller's clearance — "others" taken from
    the clause and label registries. That is exact for every row whose tokens and labels are
    registered (the store registers them before writing a row); a row carrying one that is not
    (a write racing the compile, damaged data) may pass here, which is why the searcher re-checks
    every hit and falls back to the exact filter when the check withholds one.
    """
    satisfied = view.satisfied_clauses(clauses)
    unsatisfied = frozenset(clauses) - satisfied
    uncleared = frozenset(labels) - view.cleared_labels
    principals = sql_list(view.principals)
    terms = [
        f"tenant = {sql_string(view.tenant)}",
        f"array_has_any(acl_allow, {principals})",
        f"NOT array_has_any(acl_deny, {principals})",
        f"array_has_any(acl_clauses, {sql_list(satisfied)})" if satisfied else "FALSE",
    ]
    if unsatisfied:
        terms.append(f"NOT array_has_any(acl_clauses, {sql_list(unsatisfied)})")
    if uncleared:
        terms.append(f"NOT array_has_any(labels, {sql_list(uncleared)})")
    terms.append(_classification_term(view))
    return " AND ".join(f"({term})" for term in terms)
