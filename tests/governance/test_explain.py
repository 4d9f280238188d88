"""explain: the decision with its chain of reasons, and nothing at all about what the asker may not see."""

from __future__ import annotations

import pytest

from ragwarden.errors import PermissionDeniedError
from ragwarden.governance.explain import explain_row
from ragwarden.governance.tags import GovernanceTags


def chunk(warehouse, doc_id: str) -> str:
    return warehouse.store.chunks.chunk_ids_of(doc_id)[0]


def test_a_visible_row_is_explained_with_group_path_and_rule_lines(demo_warehouse):
    result = demo_warehouse.explain(chunk(demo_warehouse, "acme-hr-001"), subject="user:alice", tenant="acme")
    assert result.allowed
    steps = {step.check: step for step in result.steps}
    assert all(step.passed for step in result.steps)
    acl = next(step for name, step in steps.items() if name.startswith("acl clause"))
    assert "user:alice -> group:fpa (policy line 21) -> group:finance (policy line 22)" in acl.detail
    assert steps["label comp"].detail.startswith("cleared by line 52: p, group:finance, acme, label:comp, read, allow")
    assert "clearance is confidential" in steps["classification"].detail


def test_an_invisible_row_is_only_not_visible_to_its_subject(demo_warehouse):
    result = demo_warehouse.explain(chunk(demo_warehouse, "acme-hr-001"), subject="user:dave", tenant="acme")
    assert (result.allowed, result.reason, result.steps) == (False, "not visible", ())


def test_a_missing_row_reads_exactly_like_an_invisible_one(demo_warehouse):
    invisible = demo_warehouse.explain(chunk(demo_warehouse, "acme-hr-001"), subject="user:dave", tenant="acme")
    missing = demo_warehouse.explain("no-such-chunk", subject="user:dave", tenant="acme")
    assert (missing.allowed, missing.reason, missing.steps) == (invisible.allowed, invisible.reason, invisible.steps)


def test_an_auditor_sees_which_check_failed_for_someone_else(demo_warehouse):
    result = demo_warehouse.explain(
        chunk(demo_warehouse, "acme-hr-004"), subject="user:bob", tenant="acme", caller="user:carol"
    )
    assert not result.allowed
    failed = {step.check: step.detail for step in result.steps if not step.passed}
    assert failed["acl deny"] == "denied to user:bob through user:bob"


def test_asking_about_someone_else_without_audit_is_refused(demo_warehouse):
    with pytest.raises(PermissionDeniedError, match="needs audit"):
        demo_warehouse.explain(chunk(demo_warehouse, "acme-pub-001"), subject="user:alice", tenant="acme", caller="user:dave")


def test_explain_agrees_with_search(demo_warehouse, demo_rows_by_person):
    for subject, visible in demo_rows_by_person.items():
        for row_id, can_read in visible.items():
            assert demo_warehouse.explain(row_id, subject=subject, tenant="acme", caller="user:carol").allowed is can_read


@pytest.mark.parametrize(
    ("subject", "level", "clearance"),
    [
        (
            "user:bob",
            "internal",
            (
                "public (confidential granted by line 8: p, group:finance, acme, classification:confidential, read, "
                "allow; capped below internal by line 9: p, user:bob, acme, classification:internal, read, deny)"
            ),
        ),
        (
            "user:carol",
            "public",
            (
                "none (internal granted by line 11: p, group:staff, acme, classification:internal, read, allow; "
                "capped below public by line 10: p, group:contractors, acme, classification:public, read, deny)"
            ),
        ),
    ],
)
def test_the_classification_step_names_the_deny_line_that_capped_the_clearance(
    classification_denies_policy, make_row, make_registry, subject, level, clearance
):
    tags = GovernanceTags.for_source(tenant="acme", allow=["group:staff"], classification=level)
    result = explain_row(classification_denies_policy, subject, "acme", make_row("row", tags), make_registry([tags]))
    steps = {step.check: step for step in result.steps}
    assert not result.allowed and [name for name, step in steps.items() if not step.passed] == ["classification"]
    assert steps["classification"].detail == f"row is {level}; clearance is {clearance}"
