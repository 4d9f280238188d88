"""Governance tags: what every row carries so that visibility can be decided from the row alone.

Principals and labels are validated here, once, for every entry point (JSONL, files, policy):
they are data that later reaches SQL as quoted literals, so they are kept to printable text.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from typing import Any

from ..errors import InvalidValueError

EVERYONE = "everyone"
MAX_NAME_LENGTH = 256
_PRINCIPAL_KINDS = ("user", "group", "service")


class Classification(IntEnum):
    """Ordered sensitivity levels; a subject's clearance must reach a row's level."""

    PUBLIC = 0
    INTERNAL = 1
    CONFIDENTIAL = 2
    RESTRICTED = 3

    @classmethod
    def parse(cls, value: object) -> Classification:
        """Accept a level name (any case) or its number; raise ValueError naming the choices."""
        if isinstance(value, Classification):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and value in cls._value2member_map_:
            return cls(value)
        if isinstance(value, str) and value.strip().upper() in cls.__members__:
            return cls[value.strip().upper()]
        choices = ", ".join(level.name.lower() for level in cls)
        raise InvalidValueError(f"unknown classification {value!r}; use one of {choices}")

    @property
    def label(self) -> str:
        return self.name.lower()

    def __str__(self) -> str:
        """Its name (``confidential``), as people read it; ``int()`` gives the number."""
        return self.label

    def __format__(self, spec: str) -> str:
        """The name, padded or aligned as ``spec`` asks; a numeric ``spec`` (``d``, ``x``...) formats the number."""
        return format(int(self), spec) if spec[-1:] in tuple("bcdeEfFgGnoxX%") else format(self.label, spec)


def _printable_problem(value: object, what: str) -> str | None:
    if not isinstance(value, str):
        return f"{what} {value!r} is not a string"
    if not value:
        return f"{what} is empty"
    if len(value) > MAX_NAME_LENGTH:
        return f"{what} {value[:40]!r}... is longer than {MAX_NAME_LENGTH} characters"
    # printable ASCII holds none of the characters looked for below (in ASCII those are the
    # controls, which are not printable): most names, checked without a loop in Python
    plain = value.isascii() and value.isprintable()
    for char in "" if plain else value:
        if not char.isprintable() or unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            return f"{what} {value!r} holds the non-printable character {char!r}"
    if value != value.strip():
        return f"{what} {value!r} has leading or trailing spaces"
    return None


def principal_problem(value: object) -> str | None:
    """Why ``value`` is not a principal (``user:alice``, ``group:finance``, ``service:indexer``, ``everyone``), or None."""
    problem = _printable_problem(value, "principal")
    if problem:
        return problem
    assert isinstance(value, str)
    if value == EVERYONE:
        return None
    kind, sep, name = value.partition(":")
    if not sep or kind not in _PRINCIPAL_KINDS or not name:
        return f"principal {value!r} is not of the form user:NAME, group:NAME, service:NAME or {EVERYONE}"
    return None


def user_named(name: str) -> str:
    """The user principal an identity provider's name for a user (a token's ``sub``, a SCIM
    ``userName``) stands for: ``user:NAME``, unless it is one already."""
    return name if name.startswith("user:") else f"user:{name}"


def group_named(name: str) -> str:
    """The group principal an identity provider's group name (a groups-claim value, a SCIM
    ``displayName``) stands for: ``group:NAME``, unless it is one already."""
    return name if name.startswith("group:") else f"group:{name}"


def group_problem(value: object) -> str | None:
    """Why ``value`` is not a group principal (``group:NAME``), or None: what a membership from
    outside the policy (a token's groups claim) may name, never a user, a service or everyone."""
    if not isinstance(value, str) or not value.startswith("group:"):
        return f"{value!r} is not a group: only group:NAME can be claimed"
    return principal_problem(value)


ACTOR_KINDS = ("agent", "service")


def actor_problem(value: object) -> str | None:
    """Why ``value`` is not an actor (``agent:NAME`` or ``service:NAME``), or None. An actor is the
    program acting for a subject: never a person or a group, so a receipt cannot read "carol acting
    for dave"."""
    problem = _printable_problem(value, "actor")
    if problem:
        return problem
    assert isinstance(value, str)
    kind, sep, name = value.partition(":")
    if not sep or kind not in ACTOR_KINDS or not name:
        return f"actor {value!r} is not of the form agent:NAME or service:NAME (an actor is never a user or a group)"
    return None


def label_problem(value: object) -> str | None:
    """Why ``value`` is not a label (printable text of at most 256 characters), or None."""
    return _printable_problem(value, "label")


def tenant_problem(value: object) -> str | None:
    """Why ``value`` is not a tenant name, or None."""
    return _printable_problem(value, "tenant")


def check_principal(value: object) -> str:
    """Return ``value`` if it is a valid principal, else raise ValueError saying why."""
    problem = principal_problem(value)
    if problem:
        raise InvalidValueError(problem)
    return value  # type: ignore[return-value]


def clause_token(principals: frozenset[str] | tuple[str, ...] | list[str]) -> str:
    """A stable token for one ACL clause (a set of principals, any of whom may read)."""
    canonical = "\x1f".join(sorted(set(principals)))
    return "c" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:24]


ALLOWS_NOBODY = "the ACL allows nobody (acl.allow is empty); name at least one principal"


def allows_nobody(clauses: Iterable[Iterable[str]]) -> bool:
    """The rule wherever an ACL is made: one with no clause, or with a clause naming nobody, lets
    nobody read, and is refused (fail closed: never stored as a row no one can see)."""
    clauses = [frozenset(clause) for clause in clauses]
    return not clauses or any(not clause for clause in clauses)


@dataclass(frozen=True, kw_only=True)
class GovernanceTags:
    """The governance of one row: who may read it, who may not, its labels and level.

    ``acl_clauses`` holds one principal set per ACL clause; a reader must hold a principal of
    every clause. A document and its chunks carry one clause; a derived row carries its
    parents' clauses conjoined.
    """

    tenant: str
    acl_clauses: tuple[frozenset[str], ...]
    acl_deny: frozenset[str] = frozenset()
    labels: frozenset[str] = frozenset()
    classification: Classification = Classification.PUBLIC

    def __post_init__(self) -> None:
        # one canonical clause order (by token), so equal tags compare equal however they were built
        canonical = tuple(sorted({frozenset(c) for c in self.acl_clauses}, key=clause_token))
        object.__setattr__(self, "acl_clauses", canonical)
        problems = [tenant_problem(self.tenant)]
        problems += [principal_problem(p) for clause in self.acl_clauses for p in clause]
        problems += [principal_problem(p) for p in self.acl_deny]
        problems += [label_problem(label) for label in self.labels]
        if allows_nobody(self.acl_clauses):
            problems.append(ALLOWS_NOBODY)
        if not isinstance(self.classification, Classification):
            problems.append(f"classification {self.classification!r} is not a Classification")
        found = [p for p in problems if p]
        if found:
            raise InvalidValueError("; ".join(found))

    @classmethod
    def for_source(
        cls,
        *,
        tenant: str,
        allow: list[str] | tuple[str, ...] | frozenset[str],
        deny: list[str] | tuple[str, ...] | frozenset[str] = (),
        labels: list[str] | tuple[str, ...] | frozenset[str] = (),
        classification: object = Classification.PUBLIC,
    ) -> GovernanceTags:
        """Tags of a source document: one ACL clause, its allow list."""
        return cls(
            tenant=tenant,
            acl_clauses=(frozenset(allow),),
            acl_deny=frozenset(deny),
            labels=frozenset(labels),
            classification=Classification.parse(classification),
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any], clauses: Mapping[str, Sequence[str]]) -> GovernanceTags:
        """Tags of a stored row, its clause tokens resolved through the clause registry.

        Raises ValueError if the row cannot be evaluated (a token unknown to the registry).
        """
        unknown = [t for t in row["acl_clauses"] if t not in clauses]
        if unknown:
            raise InvalidValueError(f"ACL clause {unknown[0]} is unknown")
        return cls(
            tenant=row["tenant"],
            acl_clauses=tuple(frozenset(clauses[t]) for t in row["acl_clauses"]),
            acl_deny=frozenset(row["acl_deny"]),
            labels=frozenset(row["labels"]),
            classification=Classification(int(row["classification"])),
        )

    @property
    def acl_allow(self) -> list[str]:
        """Every principal named by any clause, sorted: a reader holds at least one of them."""
        return sorted(set().union(*self.acl_clauses))

    @property
    def clauses_by_token(self) -> dict[str, list[str]]:
        """Each ACL clause under its token, as the clause registry stores it."""
        return {clause_token(clause): sorted(clause) for clause in self.acl_clauses}

    @property
    def clause_tokens(self) -> list[str]:
        return sorted(self.clauses_by_token)

    def row_columns(self) -> dict[str, object]:
        """The tags as the warehouse tables store them, column by column (new lists each call)."""
        return {name: list(value) if isinstance(value, tuple) else value for name, value in self._columns.items()}

    @cached_property
    def _columns(self) -> dict[str, object]:
        """``row_columns``, worked out once per tags (rows of one tag set share them)."""
        return {
            "tenant": self.tenant,
            "acl_allow": tuple(self.acl_allow),
            "acl_deny": tuple(sorted(self.acl_deny)),
            "acl_clauses": tuple(self.clause_tokens),
            "labels": tuple(sorted(self.labels)),
            "classification": int(self.classification),
        }

    def fingerprint(self) -> str:
        """A hash that changes whenever any tag changes (used to notice re-tagging)."""
        return self._fingerprint

    @cached_property
    def _fingerprint(self) -> str:
        canonical = json.dumps(self.row_columns(), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]
