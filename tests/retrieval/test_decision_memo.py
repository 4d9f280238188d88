"""The post-check's memo decides exactly as the enforcer does, and never past a registry change."""

from __future__ import annotations

import pyarrow as pa

from ragwarden.governance.compiler import SubjectView
from ragwarden.governance.visibility import check_row
from ragwarden.retrieval.search import DecisionMemo
from ragwarden.state import TAG_COLUMNS
from ragwarden.warehouse import Warehouse

SUBJECTS = ("user:alice", "user:bob", "user:carol", "user:dave", "user:erin")


def test_the_memo_decides_every_row_as_the_enforcer_does(demo_warehouse: Warehouse, demo_rows: list[dict]):
    memo, policy, registry = DecisionMemo(), demo_warehouse.policy, demo_warehouse.store.registries.clauses()
    for _ in range(2):  # the second pass is answered from the memo
        for subject in SUBJECTS:
            for tenant in ("acme", "globex"):
                for row in demo_rows:
                    assert memo.check(SubjectView.of(policy, subject, tenant), row, registry) == check_row(policy, subject, tenant, row, registry)


def test_a_new_registry_is_decided_afresh_and_an_unknown_clause_is_refused(demo_warehouse: Warehouse, demo_rows: list[dict]):
    memo, policy, registry = DecisionMemo(), demo_warehouse.policy, demo_warehouse.store.registries.clauses()
    row = next(r for r in demo_rows if check_row(policy, "user:alice", "acme", r, registry).allowed)
    assert memo.check(SubjectView.of(policy, "user:alice", "acme"), row, registry).allowed
    assert not memo.check(SubjectView.of(policy, "user:alice", "acme"), row, {}).allowed  # the token is unknown to this registry


def test_a_row_that_cannot_be_evaluated_is_refused_not_memoised(demo_warehouse: Warehouse, demo_rows: list[dict]):
    memo, policy, registry = DecisionMemo(), demo_warehouse.policy, demo_warehouse.store.registries.clauses()
    broken = {**demo_rows[0], "labels": None}
    assert not memo.check(SubjectView.of(policy, "user:carol", "acme"), broken, registry).allowed


def test_verdicts_on_a_table_are_the_enforcers_row_by_row_and_a_null_list_is_refused(
    demo_warehouse: Warehouse, demo_rows: list[dict]
):
    memo, policy, registry = DecisionMemo(), demo_warehouse.policy, demo_warehouse.store.registries.clauses()
    rows = [{name: row[name] for name in ("chunk_id", *TAG_COLUMNS)} for row in demo_rows]
    rows.append({**rows[0], "chunk_id": "broken", "labels": None})  # cannot be evaluated
    table = pa.Table.from_pylist(rows)
    for subject in SUBJECTS:
        for tenant in ("acme", "globex"):
            expected = [check_row(policy, subject, tenant, row, registry).allowed for row in rows]
            assert memo.verdicts(SubjectView.of(policy, subject, tenant), registry, table).tolist() == expected
            assert expected[-1] is False
