"""The one permission gate: every operation of the face asks it once, and it decides, records the
receipt (allowed or refused, with the reason) and hands the decision to the operation.

What is needed depends on the operation: a grant of it in the caller's tenant (ingest, derive,
sync, forget, admin), ``audit`` there (lineage, receipts, inventory), ``audit`` unless the caller
asks about itself (explain, access review), or nothing but a user (search and get, whose rows are
decided one by one and recorded as a retrieval). The operator (no caller: the process itself, as
the CLI runs) needs no grant; its runs are recorded once per tenant they touched.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from .caches import LruCache
from .deadline import bounded
from .errors import NotFoundError, PermissionDeniedError, PolicyError
from .governance.audit import Receipt
from .governance.caller import Caller
from .governance.operations import Operation
from .governance.policy import Policy
from .governance.visibility import deactivated_reason
from .stages import counting, stage
from .state import AuditLog, operation_named

T = TypeVar("T")
def _process_user() -> str:
    """The operating-system user this process runs as (its uid where it has no name)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


OPERATOR = f"operator:{_process_user()}"
"""The subject receipts name for operations run in-process with no caller (the command line, the
operator's scripts): the operating-system user that ran them."""
ANY_TENANT = "*"  # the tenant receipts name for operator runs, which may span tenants


class Need(Enum):
    """What a caller needs for an operation to run."""

    GRANT = "the operation's grant in the caller's tenant"
    AUDIT = "audit in the caller's tenant"
    SELF_OR_AUDIT = "asking about itself, or audit in the caller's tenant"
    READ = "to be a user: rows are decided one by one"


@dataclass(frozen=True, kw_only=True)
class Permission:
    """The gate's decision on one request, with the policy it was made under (the operation uses
    that same policy) and whether the caller holds ``audit`` (an auditor is shown more)."""

    operation: Operation
    caller: Caller | None
    allowed: bool
    reason: str
    policy: Policy | None
    auditor: bool = False


CLAIMED_POLICIES_KEPT = 1024
"""Policies with a caller's claimed memberships kept, by (policy version, subject, tenant, groups)."""


class PermissionGate:
    """Decides, records and hands over: ``run`` is the one entry every operation goes through."""

    def __init__(
        self,
        *,
        audit: AuditLog,
        policy: Callable[[], Policy | None],
        table_version: Callable[[], int],
        fresh: Callable[[], AbstractContextManager[object]] = nullcontext,
        read_deadline_seconds: float | None = None,
    ) -> None:
        """``fresh()`` holds one freshness check for the length of a read operation
        (``state.Store.pinned``): its policy, registries and table versions come from one check.
        ``read_deadline_seconds``: how long a read (search, get) or an explain may work before it is
        stopped (``deadline``; a request's own deadline, set by the HTTP layer, stands instead)."""
        self._audit = audit
        self._policy = policy
        self._table_version = table_version
        self._fresh = fresh
        self._read_deadline = read_deadline_seconds
        self._claimed: LruCache[Policy] = LruCache(CLAIMED_POLICIES_KEPT)

    def _policy_for(self, caller: Caller | None) -> Policy | None:
        """The policy in force, with the memberships the caller's token claimed (when it did)."""
        policy = self._policy()
        groups = getattr(caller, "groups", frozenset())
        if policy is None or caller is None or not groups:
            return policy
        key = (policy.version, caller.subject, caller.tenant, *sorted(groups))
        try:
            return self._claimed.get(key, lambda: policy.with_memberships(caller.subject, caller.tenant, groups))
        except PolicyError as exc:  # refused, never decided without the claim nor with part of it
            raise PermissionDeniedError(str(exc)) from None

    def decide(
        self, operation: Operation, caller: Caller | None, need: Need, *, about: str | None = None
    ) -> Permission:
        """Whether ``caller`` may run ``operation`` under the policy in force (read once, here),
        with the memberships its token claimed."""
        policy = self._policy_for(caller)

        def permit(allowed: bool, reason: str, auditor: bool = False) -> Permission:
            return Permission(operation=operation, caller=caller, allowed=allowed, reason=reason, policy=policy,
                              auditor=auditor)  # fmt: skip

        if caller is None:
            return permit(True, f"{operation} run by the operator")
        if policy is not None and (caller.subject, caller.tenant) in policy.deactivated:
            return permit(False, deactivated_reason(caller.subject, caller.tenant))
        refused = policy.refused_tenants.get(caller.tenant) if policy is not None else None
        if refused and operation not in (Operation.PROVISION, Operation.ADMIN):
            return permit(False, refused)
        if need is Need.READ:
            return permit(True, "rows are decided one by one")
        if policy is None:
            if operation is Operation.EXPLAIN:  # the answer is "not visible", whoever asks
                return permit(True, "no policy is in force: nothing is visible")
            if need is Need.GRANT:
                return permit(False, f"no policy is in force, so {operation} is granted to no one")
            return permit(False, "no policy is in force, so nothing may be reviewed")
        if need is Need.GRANT:
            decision = policy.allows_operation(caller.subject, caller.tenant, operation)
            return permit(decision.allowed, decision.reason)
        auditor = policy.allows_operation(caller.subject, caller.tenant, Operation.AUDIT).allowed
        if auditor:
            return permit(True, f"{caller.subject} holds audit in {caller.tenant}", auditor=True)
        if need is Need.SELF_OR_AUDIT and about == caller.subject:
            return permit(True, f"{caller.subject} asks about itself")
        if operation is Operation.EXPLAIN:
            return permit(False, f"{caller.subject} may explain only its own access; asking about {about} needs audit")
        return permit(False, f"{caller.subject} is not granted audit in {caller.tenant}")

    def rights(self, caller: Caller) -> tuple[Operation, ...]:
        """The operations ``caller`` is granted under the policy in force, decided as ``run``
        decides them and recorded nowhere: what a client may offer it (each call it then makes is
        decided, and receipted, on its own). Reading one's own rights reads no row."""
        return tuple(op for op in Operation if op.granted and self.decide(op, caller, Need.GRANT).allowed)

    def run(
        self,
        operation: Operation,
        caller: Caller | None,
        need: Need,
        action: Callable[[Permission], T],
        describe: Callable[[T], Mapping[str, Any]],
        *,
        about: str | None = None,
        touched: Callable[[T], Mapping[str, Sequence[str]]] | None = None,
        neutral: bool = False,
    ) -> T:
        """Decide; record a refusal and raise ``PermissionDeniedError``, or run ``action`` with the
        permission and record what ``describe`` says of its result. A ``NotFoundError`` or
        ``PermissionDeniedError`` from the action is recorded as a refusal too.

        ``touched`` gives, for an operator's run, the documents it wrote (or the tenants it read) in
        each tenant: the run is then recorded once per tenant, naming only that tenant's documents,
        so each tenant's auditor sees what was done to it and nothing of the others. A run over
        several tenants is described generically unless ``neutral`` says its description holds
        nothing of one tenant another may not see."""
        # A storage failure names this operation; a read sees one freshness check throughout and
        # stops at its deadline; the operation's work is counted (``stages``).
        reading = need is Need.READ
        bounded_here = (reading or operation is Operation.EXPLAIN) and self._read_deadline
        with (
            operation_named(str(operation)),
            counting(),
            self._fresh() if reading else nullcontext(),
            bounded(self._read_deadline) if bounded_here else nullcontext(),  # type: ignore[arg-type]
        ):
            permission = self.decide(operation, caller, need, about=about)
            kind = "retrieval" if need is Need.READ else "decision"
            if not permission.allowed:
                self._record(permission, kind, {"allowed": False, "reason": permission.reason})
                raise PermissionDeniedError(permission.reason)
            try:
                result = action(permission)
            except (NotFoundError, PermissionDeniedError) as exc:
                self._record(permission, kind, {"allowed": False, "reason": str(exc)})
                raise
            described = {"allowed": True, **describe(result)}
            by_tenant = dict(touched(result) if touched and caller is None else {})
            if not by_tenant:
                self._record(permission, kind, described)
            if len(by_tenant) > 1 and not neutral:  # counts and details span tenants: each tenant's receipt names only its own
                described = {"allowed": True, "reason": f"{operation} run by the operator", "details": {}}
            for tenant, doc_ids in sorted(by_tenant.items()):
                self._record(permission, kind, {**described, "doc_ids": tuple(doc_ids)}, tenant=tenant)
            return result

    def _record(
        self, permission: Permission, kind: str, fields: Mapping[str, Any], *, tenant: str | None = None
    ) -> None:
        caller = permission.caller
        policy = permission.policy
        receipt: dict[str, Any] = {
            "kind": kind,
            "operation": str(permission.operation),
            "subject": caller.subject if caller else OPERATOR,
            "actor": caller.actor if caller else None,
            "tenant": tenant or (caller.tenant if caller else ANY_TENANT),
            "policy_version": policy.version if policy else None,
            **fields,
        }
        claimed = sorted(getattr(caller, "groups", ()))
        if claimed:  # what the token's claim added to the policy for this request: part of why
            receipt["details"] = {**receipt.get("details", {}), "claimed_groups": claimed}
        if receipt.get("table_version") is None:
            receipt["table_version"] = self._table_version()
        with stage("receipt"):
            self._audit.append(Receipt(**receipt))
