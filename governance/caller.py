"""Who asks: the caller a request acts for, validated once where its identity is established.

A ``Caller`` is built at an edge (a verified credential, the CLI's flags, the Python API's
arguments: ``caller_of``, ``required_caller``, ``asker``) and then passed whole, so no layer below
re-validates loose strings. An ``Identity`` is
a caller whose credential was verified, and says how.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError, InvalidValueError
from .operations import Operation
from .tags import actor_problem, group_problem, principal_problem, tenant_problem


@dataclass(frozen=True, kw_only=True)
class Caller:
    """The subject whose rights apply, the tenant it acts in, and the agent acting for it (if any).

    Construction refuses, naming the field (``InvalidValueError.field``), a subject that is not a
    principal, a tenant that is not a tenant name, and an actor that is not ``agent:NAME`` or
    ``service:NAME``. This is the one check of who a caller is: an edge builds the caller and says
    where a refused field came from, and nothing below checks the strings again."""

    subject: str
    tenant: str
    actor: str | None = None

    def __post_init__(self) -> None:
        refused = self._problem()
        if refused is not None:
            raise InvalidValueError(refused[1], field=refused[0])

    def _problem(self) -> tuple[str, str] | None:
        """(the field at fault, what is wrong with it), or None."""
        problem = principal_problem(self.subject)
        if problem:
            return "subject", problem
        if self.tenant is None or self.tenant == "":
            return "tenant", f"{self.subject} needs the tenant it acts in"
        problem = tenant_problem(self.tenant)
        if problem:
            return "tenant", problem
        problem = actor_problem(self.actor) if self.actor is not None else None
        return ("actor", problem) if problem else None

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

    def _problem(self) -> tuple[str, str] | None:
        if isinstance(self.groups, str) or not isinstance(self.groups, frozenset):
            return "groups", f"groups must be a frozenset of group: principals, not {self.groups!r}"
        problems = [problem for problem in map(group_problem, sorted(self.groups, key=repr)) if problem]
        if problems:
            return "groups", f"claimed group refused: {problems[0]}"
        return super()._problem()

    @property
    def caller(self) -> Caller:
        """The caller alone, without how it was proven."""
        return Caller(subject=self.subject, tenant=self.tenant, actor=self.actor)

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "method": self.method, "groups": sorted(self.groups)}


def caller_of(caller: Caller | None, subject: str | None, tenant: str | None, actor: str | None) -> Caller | None:
    """The Python API's edge: ``caller`` whole (a verified ``Identity``, say), else one ``Caller``
    built here from the loose arguments (and so checked, once); None when neither names anyone
    (the operator)."""
    if caller is not None:
        if not isinstance(caller, Caller):
            raise InvalidRequestError(f"caller must be a Caller, got {type(caller).__name__}")
        if (subject is not None and subject != caller.subject) or tenant not in (None, caller.tenant) or actor not in (None, caller.actor):
            raise InvalidRequestError(f"pass the caller whole or as subject/tenant/actor, not both ({caller.subject} in {caller.tenant})")
        return caller
    if subject is None:  # the operator; a tenant then only narrows where it acts (forget)
        if actor is not None:
            raise InvalidRequestError(f"actor {actor!r} was given without the subject it acts for")
        return None
    return Caller(subject=subject, tenant=tenant, actor=actor)  # type: ignore[arg-type] - validated there


def required_caller(caller: Caller | None, subject: str | None, tenant: str | None, actor: str | None, operation: Operation) -> Caller:
    """The caller of an operation that is always someone's (search, get, derive, admin). Rows are
    read for people: a search or get is refused here, before anything runs, for a caller that is
    not a user (an agent reads only on a user's behalf)."""
    who = caller_of(caller, subject, tenant, actor)
    if who is None:
        raise InvalidRequestError(f"{operation} needs a caller: pass subject and tenant, or caller")
    if operation in (Operation.SEARCH, Operation.GET) and not who.is_user:
        raise InvalidRequestError(f"subject {who.subject!r} must be a user (user:NAME)")
    return who


def asker(caller: str | Caller | None, subject: str | None, tenant: str | None, actor: str | None) -> Caller:
    """Who asks a question about access (explain, reviews, the audit): ``caller`` whole, or the
    subject ``caller`` names (by default ``subject``, asking about itself) in ``tenant``."""
    if isinstance(caller, Caller):
        if tenant not in (None, caller.tenant):
            raise InvalidRequestError(f"{caller.subject} acts in {caller.tenant!r}, not {tenant!r}")
        return caller
    name = caller if caller is not None else subject
    if name is None:
        raise InvalidRequestError("a question about access needs the caller who asks")
    return Caller(subject=name, tenant=tenant, actor=actor)  # type: ignore[arg-type] - validated there
