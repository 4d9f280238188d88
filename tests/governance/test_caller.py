"""A caller is validated once, where it is built, and then travels whole: a malformed subject,
tenant or actor never gets as far as an operation, and a verified identity is a caller."""

from __future__ import annotations

import pytest

from ragwarden.errors import InvalidRequestError
from ragwarden.governance.caller import Caller, Identity
from ragwarden.warehouse import Warehouse


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"subject": "alice", "tenant": "acme"}, "'alice'"),
        ({"subject": "user:alice", "tenant": None}, "needs the tenant"),
        ({"subject": "user:alice", "tenant": "ac\x00me"}, "tenant"),
        ({"subject": "user:alice", "tenant": "acme", "actor": "user:bob"}, "actor 'user:bob'"),
    ],
    ids=["bare-subject", "no-tenant", "nul-tenant", "person-as-actor"],
)
def test_a_malformed_caller_is_refused_naming_what_is_wrong(fields, named):
    with pytest.raises(InvalidRequestError, match=named):
        Caller(**fields)


def test_an_identity_is_a_caller_and_its_caller_drops_how_it_was_proven():
    identity = Identity(subject="user:alice", tenant="acme", actor="agent:research", method="api-key")
    assert isinstance(identity, Caller)
    assert identity.caller == Caller(subject="user:alice", tenant="acme", actor="agent:research")
    assert identity.as_dict()["method"] == "api-key"


def test_a_caller_passed_whole_acts_with_its_own_subject_tenant_and_actor(small_warehouse: Warehouse):
    who = Identity(subject="user:alice", tenant="acme", actor="agent:research")
    hits = small_warehouse.search("quarterly budget", caller=who, k=2)
    assert hits and all(hit.doc_id.startswith("acme-") for hit in hits)
    (receipt,) = small_warehouse.audit.query(operation="search", limit=1)
    assert (receipt.subject, receipt.tenant, receipt.actor) == ("user:alice", "acme", "agent:research")


def test_a_caller_and_loose_arguments_that_disagree_are_refused_before_anything_runs(small_warehouse: Warehouse):
    before = small_warehouse.audit.count()
    with pytest.raises(InvalidRequestError, match="not both"):
        small_warehouse.search("budget", caller=Caller(subject="user:alice", tenant="acme"), tenant="globex")
    with pytest.raises(InvalidRequestError, match="must be a user"):
        small_warehouse.search("budget", subject="service:indexer", tenant="acme")
    assert small_warehouse.audit.count() == before  # refused at the edge: no operation, no receipt


def test_a_search_and_a_get_check_who_asks_once_from_loose_arguments_and_never_for_a_caller_passed_whole(
    small_warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch
):
    checks: list[str] = []
    check = Caller._problem

    def counted(self: Caller) -> tuple[str, str] | None:
        checks.append(self.subject)
        return check(self)

    monkeypatch.setattr(Caller, "_problem", counted)
    small_warehouse.search("quarterly budget", subject="user:alice", tenant="acme", k=2)
    assert checks == ["user:alice"]  # built once at the edge, then passed whole
    who = Caller(subject="user:alice", tenant="acme")
    checks.clear()
    (hit,) = small_warehouse.search("quarterly budget", caller=who, k=1)
    small_warehouse.get_chunk(hit.chunk_id, caller=who)
    assert checks == []
