"""The one permission gate: each operation asks it once, under one read of the policy; it records
exactly one receipt, allowed or refused, with the reason, and hands its decision to the operation."""

from __future__ import annotations

from typing import Any

import pytest

from ragwarden.errors import PermissionDeniedError
from ragwarden.gate import Need, Permission, PermissionGate
from ragwarden.governance.caller import Caller
from ragwarden.governance.operations import Operation
from ragwarden.governance.policy import Policy
from ragwarden.warehouse import Warehouse

ALICE = Caller(subject="user:alice", tenant="acme")  # staff: derive; no audit
CAROL = Caller(subject="user:carol", tenant="acme")  # compliance: audit


def _gate(warehouse: Warehouse, reads: list[int]) -> PermissionGate:
    def policy() -> Policy | None:
        reads.append(1)
        return warehouse.policy

    return PermissionGate(audit=warehouse.audit, policy=policy, table_version=lambda: warehouse.store.chunks.version)


def _receipts_after(warehouse: Warehouse, before: int) -> list[Any]:
    """The receipts recorded since the log held ``before`` of them (newest first)."""
    return warehouse.audit.query(limit=warehouse.audit.count() - before)


@pytest.mark.parametrize(
    ("operation", "need", "caller", "about", "allowed", "reason"),
    [
        (Operation.DERIVE, Need.GRANT, ALICE, None, True, "policy grants derive to user:alice in acme"),
        (Operation.INGEST, Need.GRANT, ALICE, None, False, "policy does not grant ingest to user:alice in acme"),
        (Operation.AUDIT, Need.AUDIT, ALICE, None, False, "user:alice is not granted audit in acme"),
        (Operation.AUDIT, Need.AUDIT, CAROL, None, True, "user:carol holds audit in acme"),
        (Operation.AUDIT, Need.SELF_OR_AUDIT, ALICE, "user:alice", True, "user:alice asks about itself"),
        (Operation.EXPLAIN, Need.SELF_OR_AUDIT, ALICE, "user:dave", False, "may explain only its own access"),
        (Operation.SEARCH, Need.READ, ALICE, None, True, "rows are decided one by one"),
        (Operation.INGEST, Need.GRANT, None, None, True, "ingest run by the operator"),
    ],
)
def test_the_gate_decides_once_records_one_receipt_with_the_reason_and_hands_the_decision_over(
    small_warehouse: Warehouse, operation, need, caller, about, allowed, reason
):
    reads: list[int] = []
    gate = _gate(small_warehouse, reads)
    before = small_warehouse.audit.count()
    handed: list[Permission] = []

    def action(permission: Permission) -> str:
        handed.append(permission)
        return "done"

    run = lambda: gate.run(operation, caller, need, action, lambda result: {"reason": result}, about=about)  # noqa: E731
    if allowed:
        assert run() == "done"
        assert handed[0].allowed and reason in handed[0].reason and handed[0].policy is small_warehouse.policy
    else:
        with pytest.raises(PermissionDeniedError, match=reason):
            run()
        assert not handed, "a refused operation never runs"
    assert len(reads) == 1, "the policy is read once per operation"
    (receipt,) = _receipts_after(small_warehouse, before)
    assert receipt.operation == operation and receipt.allowed is allowed
    assert receipt.reason == "done" if allowed else reason in receipt.reason
    assert receipt.kind == ("retrieval" if need is Need.READ else "decision")
    assert receipt.policy_version == small_warehouse.policy.version  # type: ignore[union-attr]


def test_a_refusal_from_inside_the_operation_is_recorded_as_one_refused_receipt(small_warehouse: Warehouse):
    gate = _gate(small_warehouse, [])
    before = small_warehouse.audit.count()

    def action(_: Permission) -> None:
        raise PermissionDeniedError("installing this policy needs admin in globex, which user:alice lacks")

    with pytest.raises(PermissionDeniedError):
        gate.run(Operation.DERIVE, ALICE, Need.GRANT, action, lambda _: {"reason": "never"})
    (receipt,) = _receipts_after(small_warehouse, before)
    assert not receipt.allowed and "needs admin in globex" in receipt.reason


def test_every_face_operation_leaves_exactly_one_receipt(small_warehouse: Warehouse):
    (chunk_id, *_) = small_warehouse.store.chunks.chunk_ids_of("acme-memo")
    calls = [
        lambda: small_warehouse.search("menu", subject="user:alice", tenant="acme"),
        lambda: small_warehouse.get_chunk(chunk_id, subject="user:alice", tenant="acme"),
        lambda: small_warehouse.derive("Soup daily.", parents=[chunk_id], subject="user:alice", tenant="acme"),
        lambda: small_warehouse.explain(chunk_id, subject="user:alice", tenant="acme"),
        lambda: small_warehouse.access_review(subject="user:dave", tenant="acme", caller="user:carol"),
        lambda: small_warehouse.inventory(label="finance", tenant="acme", caller="user:carol"),
        lambda: small_warehouse.lineage("acme-memo", caller="user:carol", tenant="acme"),
        lambda: small_warehouse.receipts(caller="user:carol", tenant="acme", limit=1),
        lambda: small_warehouse.verify_audit(caller="user:carol", tenant="acme"),
    ]
    for call in calls:
        before = small_warehouse.audit.count()
        call()
        assert len(_receipts_after(small_warehouse, before)) == 1, call
