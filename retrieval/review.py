"""Compliance questions over what is stored: what a subject can see, and where a label lives."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError
from ..governance.compiler import SubjectView
from ..governance.explain import membership_chain
from ..governance.policy import Policy
from ..governance.sql import sql_list, sql_string
from ..governance.tags import EVERYONE, Classification, label_problem
from ..governance.visibility import check_row
from ..state import TAG_COLUMNS, ReadDoors
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


def access_review(doors: ReadDoors, searcher: Searcher, view: SubjectView) -> AccessReview:
    """Count every row ``view``'s subject may read: the same compiled filter and post-check as search."""
    subject, tenant = view.subject, view.tenant
    version = doors.chunks.version
    rows = doors.chunks.rows_where(searcher.compiled_filter(view), _REVIEW_COLUMNS)
    decide = searcher.decisions.decider(view, doors.registries.clauses())
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


def inventory(doors: ReadDoors, label: str, tenant: str) -> dict[str, list[str]]:
    """Every row carrying ``label`` in ``tenant``, grouped by the source documents it comes from."""
    problem = label_problem(label)
    if problem:
        raise InvalidRequestError(problem)
    where = f"tenant = {sql_string(tenant)} AND array_has_any(labels, {sql_list([label])})"
    rows = doors.chunks.rows_where(where, ["chunk_id", "doc_id", "kind", "parents"])
    grouped: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        for source in _root_sources(doors, row):
            grouped[source].append(row["chunk_id"])
    return {source: sorted(ids) for source, ids in sorted(grouped.items())}


def _root_sources(doors: ReadDoors, row: Mapping[str, Any]) -> set[str]:
    """The source documents a row derives from, following ``parents`` up to the chunks."""
    if row["kind"] == "chunk":
        return {row["doc_id"]}
    roots: set[str] = set()
    pending, seen = list(row["parents"]), set()
    while pending:
        parents = doors.chunks.rows([p for p in pending if p not in seen], ["chunk_id", "doc_id", "kind", "parents"])
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


def vocabulary(doors: ReadDoors, policy: Policy | None, tenant: str) -> Vocabulary:
    """The names a reviewer of ``tenant`` picks from, from that tenant's rows and policy alone."""
    rows = doors.chunks.rows_where(f"tenant = {sql_string(tenant)}", ["doc_id", "kind", "labels"])
    labels = sorted({label for row in rows for label in row["labels"]})
    documents = sorted({row["doc_id"] for row in rows if row["kind"] == "chunk"})
    named = policy.named() if policy is not None else []
    subjects = sorted({p for t, p in named if t == tenant and p.startswith(("user:", "service:"))})
    return Vocabulary(tenant=tenant, labels=tuple(labels[:VOCABULARY_MAX]), subjects=tuple(subjects[:VOCABULARY_MAX]),
                      documents=tuple(documents[:VOCABULARY_MAX]))  # fmt: skip


READERS_MAX_ROWS = 1000
"""The most rows of one item (a document's chunks and derived rows, or a label's) a reverse review weighs."""


@dataclass(frozen=True, kw_only=True)
class Reader:
    """One principal who can read some of an item's rows: how many, and through which path (the
    membership chain to the ACL principal that admitted it, each link naming its origin)."""

    principal: str
    rows: int
    path: str


@dataclass(frozen=True, kw_only=True)
class Readers:
    """Who can read an item in one tenant: the users and services the policy or the rows' ACLs
    name, and the groups (as a member holding that group alone), each with the rows it can read
    of ``rows`` (the first ``READERS_MAX_ROWS`` by id when ``truncated``)."""

    tenant: str
    item: str
    rows: int
    truncated: bool
    policy_version: str
    subjects: tuple[Reader, ...]
    groups: tuple[Reader, ...]

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "subjects": [r.__dict__ for r in self.subjects], "groups": [r.__dict__ for r in self.groups]}


def readers(doors: ReadDoors, policy: Policy, tenant: str, *, doc_id: str | None = None, label: str | None = None) -> Readers:
    """Who can read document ``doc_id`` (its chunks and every row derived from them) or the rows
    carrying ``label``, in ``tenant``: every principal the policy names there or the rows' ACLs
    name, decided by the enforcer (``visibility.check_row``) once per distinct set of tags, as a
    search would decide each row. ``policy`` is the policy in force, with no caller's token claims:
    the answer is the same whoever asks."""
    if (doc_id is None) == (label is None):
        raise InvalidRequestError("ask who can read a document (doc_id) or a label (label), one of them")
    if label is not None:
        problem = label_problem(label)
        if problem:
            raise InvalidRequestError(problem)
        rows = doors.chunks.rows_where(f"tenant = {sql_string(tenant)} AND array_has_any(labels, {sql_list([label])})", _REVIEW_COLUMNS)
    else:
        chunk_ids = doors.chunks.chunk_ids_of(str(doc_id), tenant)
        found = doors.chunks.rows(chunk_ids, _REVIEW_COLUMNS)
        if chunk_ids:
            found.update(doors.chunks.derived_from(chunk_ids))
        rows = [row for row in found.values() if row["tenant"] == tenant]
    ordered = sorted(rows, key=lambda row: row["chunk_id"])
    weighed = ordered[:READERS_MAX_ROWS]
    clauses = doors.registries.clauses()
    alike: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)  # rows with the same tags decide alike
    for row in weighed:
        alike[tuple(tuple(row[c]) if isinstance(row[c], list) else row[c] for c in TAG_COLUMNS)].append(row)
    in_acls = {p for row in weighed for p in (*row["acl_allow"], *row["acl_deny"])}
    in_acls |= {p for row in weighed for token in row["acl_clauses"] for p in clauses.get(token, ())}
    named = {principal for t, principal in policy.named() if t == tenant} | in_acls | {EVERYONE}

    def reader(principal: str) -> Reader | None:
        passing = [group for group in alike.values() if check_row(policy, principal, tenant, group[0], clauses).allowed]
        if not passing:
            return None
        held = sorted(p for p in passing[0][0]["acl_allow"] if policy.holds(principal, p, tenant))
        return Reader(principal=principal, rows=sum(map(len, passing)), path=membership_chain(policy, principal, held[0], tenant))

    found_readers = [r for r in map(reader, sorted(named)) if r is not None]
    person = ("user:", "service:")
    return Readers(
        tenant=tenant,
        item=f"label {label}" if label is not None else str(doc_id),
        rows=len(weighed),
        truncated=len(ordered) > len(weighed),
        policy_version=policy.version,
        subjects=tuple(r for r in found_readers if r.principal.startswith(person)),
        groups=tuple(r for r in found_readers if not r.principal.startswith(person)),
    )

