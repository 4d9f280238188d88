"""Who asks: the caller a request acts for, validated once where its identity is established.

A ``Caller`` is built at an edge (a verified credential, the CLI's flags, the Python API's
arguments) and then passed whole, so no layer below re-validates loose strings. An ``Identity`` is
a caller whose credential was verified, and says how.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError
from .tags import actor_problem, group_problem, principal_problem, tenant_problem


@dataclass(frozen=True, kw_only=True)
class Caller:
    """The subject whose rights apply, the tenant it acts in, and the agent acting for it (if any).

    Construction refuses, naming the field, a subject that is not a principal, a tenant that is
    not a tenant name, and an actor that is not ``agent:NAME`` or ``service:NAME``."""

    subject: str
    tenant: str
    actor: str | None = None

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise InvalidRequestError(problem)

    def _problem(self) -> str | None:
        problem = principal_problem(self.subject)
        if problem:
            return problem
        if self.tenant is None or self.tenant == "":
            return f"{self.subject} needs the tenant it acts in"
        return tenant_problem(self.tenant) or (actor_problem(self.actor) if self.actor is not None else None)

    @property
    def is_user(self) -> bool:
        """Whether the subject is a person (``user:NAME``): searches are made for users only."""
        return self.subject.startswith("user:")

    def as_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "tenant": self.tenant, "actor": self.actor}


@dataclass(frozen=True, kw_only=True)
class Identity(Caller):
    """A caller proven by a credential: ``method`` is ``jwt`` or ``api-key``; ``groups``, the
    groups its token's groups claim names (when the service trusts one), held for this request
    beside the policy's own memberships."""

    method: str = "jwt"
    groups: frozenset[str] = frozenset()

    def _problem(self) -> str | None:
        if isinstance(self.groups, str) or not isinstance(self.groups, frozenset):
            return f"groups must be a frozenset of group: principals, not {self.groups!r}"
        problems = [problem for problem in map(group_problem, sorted(self.groups, key=repr)) if problem]
        if problems:
            return f"claimed group refused: {problems[0]}"
        return super()._problem()

    @property
    def caller(self) -> Caller:
        """The caller alone, without how it was proven."""
        return Caller(subject=self.subject, tenant=self.tenant, actor=self.actor)

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "method": self.method, "groups": sorted(self.groups)}
