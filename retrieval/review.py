"""Compliance questions over what is stored: what a subject can see, and where a label lives."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError
from ..governance.compiler import SubjectView
from ..governance.policy import Policy
from ..governance.sql import sql_list, sql_string
from ..governance.tags import Classification, label_problem
from ..state import Store
from .search import Searcher

_REVIEW_COLUMNS = ["chunk_id", "doc_id", "kind", "parents", "tenant", "acl_allow", "acl_deny", "acl_clauses", "labels", "classification"]


@dataclass(frozen=True, kw_only=True)
class AccessReview:
    """Everything one subject can read in one tenant, counted three ways."""

    subject: str
    tenant: str
    policy_version: str
    table_version: int
    rows: int
    by_source: Mapping[str, int]
    by_label: Mapping[str, int]
    by_classification: Mapping[str, int]
    derived_by_kind: Mapping[str, int]

    def as_dict(self) -> dict[str, Any]:
        return {name: (dict(value) if isinstance(value, Mapping) else value) for name, value in self.__dict__.items()}


def access_review(store: Store, searcher: Searcher, view: SubjectView) -> AccessReview:
    """Count every row ``view``'s subject may read: the same compiled filter and post-check as search."""
    subject, tenant = view.subject, view.tenant
    version = store.chunks_version
    rows = store.rows_where(searcher.compiled_filter(view), _REVIEW_COLUMNS)
    decide = searcher.decisions.decider(view, store.clause_registry())
    visible = [row for row in rows if decide(row).allowed]
    chunks = [row for row in visible if row["kind"] == "chunk"]
    return AccessReview(
        subject=subject,
        tenant=tenant,
        policy_version=view.policy_version,
        table_version=version,
        rows=len(visible),
        by_source=dict(sorted(Counter(row["doc_id"] for row in chunks).items())),
        by_label=dict(sorted(Counter(label for row in visible for label in row["labels"]).items())),
        by_classification={
            level.label: sum(1 for row in visible if row["classification"] == level) for level in Classification
        },
        derived_by_kind=dict(sorted(Counter(row["kind"] for row in visible if row["kind"] != "chunk").items())),
    )


def inventory(store: Store, label: str, tenant: str) -> dict[str, list[str]]:
    """Every row carrying ``label`` in ``tenant``, grouped by the source documents it comes from."""
    problem = label_problem(label)
    if problem:
        raise InvalidRequestError(problem)
    where = f"tenant = {sql_string(tenant)} AND array_has_any(labels, {sql_list([label])})"
    rows = store.rows_where(where, ["chunk_id", "doc_id", "kind", "parents"])
    grouped: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        for source in _root_sources(store, row):
            grouped[source].append(row["chunk_id"])
    return {source: sorted(ids) for source, ids in sorted(grouped.items())}


def _root_sources(store: Store, row: Mapping[str, Any]) -> set[str]:
    """The source documents a row derives from, following ``parents`` up to the chunks."""
    if row["kind"] == "chunk":
        return {row["doc_id"]}
    roots: set[str] = set()
    pending, seen = list(row["parents"]), set()
    while pending:
        parents = store.rows([p for p in pending if p not in seen], ["chunk_id", "doc_id", "kind", "parents"])
        seen.update(pending)
        pending = []
        for parent in parents.values():
            if parent["kind"] == "chunk":
                roots.add(parent["doc_id"])
            else:
                pending.extend(parent["parents"])
    return roots


VOCABULARY_MAX = 1000
"""The most names of each kind a vocabulary lists (a picker's suggestions, not an inventory)."""


@dataclass(frozen=True, kw_only=True)
class Vocabulary:
    """What a tenant's receipts can be filtered by: the labels its rows carry, the users and
    services its policy names, its documents (each sorted, at most ``VOCABULARY_MAX``)."""

    tenant: str
    labels: tuple[str, ...]
    subjects: tuple[str, ...]
    documents: tuple[str, ...]


def vocabulary(store: Store, policy: Policy | None, tenant: str) -> Vocabulary:
    """The names a reviewer of ``tenant`` picks from, from that tenant's rows and policy alone."""
    rows = store.rows_where(f"tenant = {sql_string(tenant)}", ["doc_id", "kind", "labels"])
    labels = sorted({label for row in rows for label in row["labels"]})
    documents = sorted({row["doc_id"] for row in rows if row["kind"] == "chunk"})
    named = policy.named() if policy is not None else []
    subjects = sorted({p for t, p in named if t == tenant and p.startswith(("user:", "service:"))})
    return Vocabulary(tenant=tenant, labels=tuple(labels[:VOCABULARY_MAX]), subjects=tuple(subjects[:VOCABULARY_MAX]),
                      documents=tuple(documents[:VOCABULARY_MAX]))  # fmt: skip
