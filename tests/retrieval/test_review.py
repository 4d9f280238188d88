"""access-review and inventory: the compliance view agrees with search and needs audit for others."""

from __future__ import annotations

import pytest

from ragwarden.errors import InvalidRequestError, PermissionDeniedError
from ragwarden.governance.caller import Identity


@pytest.mark.parametrize("subject", ["user:alice", "user:bob", "user:carol", "user:dave"])
def test_access_review_counts_exactly_what_search_returns(demo_warehouse, visible_to, subject):
    review = demo_warehouse.access_review(subject=subject, tenant="acme")
    visible = visible_to(subject, "acme")
    assert review.rows == len(visible)
    assert sum(review.by_source.values()) == len(visible)
    assert set(review.by_source) == {row["doc_id"] for row in visible}
    assert sum(review.by_classification.values()) == len(visible)
    for label, count in review.by_label.items():
        assert count == sum(label in row["labels"] for row in visible)


def test_reviewing_someone_else_needs_audit(demo_warehouse):
    assert demo_warehouse.access_review(subject="user:dave", tenant="acme", caller="user:carol").rows > 0
    with pytest.raises(PermissionDeniedError, match="not granted audit"):
        demo_warehouse.access_review(subject="user:alice", tenant="acme", caller="user:dave")


def test_inventory_groups_labelled_rows_by_source_including_derived(demo_policy_warehouse, make_record):
    wh = demo_policy_warehouse
    wh.ingest_records([make_record(id="a", labels=["finance"]), make_record(id="b", text="Other budget.", labels=["finance"])])
    parents = wh.store.chunks.chunk_ids_of("a") + wh.store.chunks.chunk_ids_of("b")
    derived = wh.derive("Both budgets.", parents=parents, subject="user:alice", tenant="acme")
    found = wh.inventory(label="finance", tenant="acme", caller="user:carol")
    assert found == {"a": sorted([parents[0], derived.chunk_id]), "b": sorted([parents[1], derived.chunk_id])}
    with pytest.raises(PermissionDeniedError):
        wh.inventory(label="finance", tenant="acme", caller="user:alice")


def test_reviews_leave_audit_receipts_allowed_and_refused(demo_policy_warehouse):
    wh = demo_policy_warehouse
    wh.access_review(subject="user:dave", tenant="acme", caller="user:carol")
    with pytest.raises(PermissionDeniedError):
        wh.inventory(label="pii", tenant="acme", caller="user:dave")
    receipts = wh.audit.query(operation="audit")
    assert [(r.subject, r.allowed) for r in receipts] == [("user:dave", False), ("user:carol", True)]


@pytest.mark.parametrize("bad", ["user:\x00carol", "", "user:" + "x" * 300])
def test_a_malformed_subject_or_label_is_refused_naming_it(demo_warehouse, bad):
    with pytest.raises(InvalidRequestError, match="principal"):
        demo_warehouse.access_review(subject=bad, tenant="acme", caller="user:carol")
    with pytest.raises(InvalidRequestError, match="label"):
        demo_warehouse.inventory(label=bad.removeprefix("user:") if bad else bad, tenant="acme", caller="user:carol")


@pytest.mark.parametrize("doc_id", ["acme-legal-001", "acme-hr-001", "acme-pub-001"])
def test_who_can_read_a_document_agrees_with_each_subjects_own_access_review(demo_warehouse, doc_id):
    """Every user the policy names is listed exactly when its own review counts rows of the
    document, with that many rows; the path names the ACL principal that admitted it."""
    found = demo_warehouse.readers(caller="user:carol", tenant="acme", doc_id=doc_id)
    listed = {reader.principal: reader for reader in found.subjects}
    users = sorted({p for t, p in demo_warehouse.policy.named() if t == "acme" and p.startswith("user:")})
    for user in users:
        own = demo_warehouse.access_review(subject=user, tenant="acme", caller="user:carol").by_source.get(doc_id, 0)
        assert (listed[user].rows if user in listed else 0) == own, user
    for reader in found.subjects:
        assert reader.path.startswith(reader.principal)


def test_who_can_read_names_groups_by_what_a_member_holding_them_alone_may_read(demo_warehouse):
    found = demo_warehouse.readers(caller="user:carol", tenant="acme", label="legal-hold")
    groups = {reader.principal for reader in found.groups}
    assert "group:legal" in groups or "group:compliance" in groups, groups
    assert "group:interns" not in groups and "everyone" not in groups
    assert all(not r.principal.startswith("user:") for r in found.groups)
    with pytest.raises(InvalidRequestError, match="one of them"):
        demo_warehouse.readers(caller="user:carol", tenant="acme")
    with pytest.raises(PermissionDeniedError):
        demo_warehouse.readers(caller="user:dave", tenant="acme", label="legal-hold")


def test_who_can_read_names_a_user_only_an_acl_names_and_is_the_same_whoever_asks(demo_policy_warehouse):
    """zoe is in no line of the policy; a public row whose ACL names her is hers to read, so she is
    listed; carol's own token claims would change nothing of the answer."""
    wh = demo_policy_warehouse
    assert wh.ingest_records([{"id": "zoe-note", "text": "A note for zoe.", "tenant": "acme", "classification": "public",
                               "acl": {"allow": ["user:zoe"]}}]).ok  # fmt: skip
    found = wh.readers(caller="user:carol", tenant="acme", doc_id="zoe-note")
    assert [(r.principal, r.rows, r.path) for r in found.subjects] == [("user:zoe", 1, "user:zoe")]
    assert not found.truncated and found.rows == 1
    claiming = Identity(subject="user:carol", tenant="acme", groups=frozenset({"group:zoe-friends"}))
    assert wh.readers(caller=claiming, doc_id="zoe-note") == found
