"""The HTTP service: every route over a real server on 127.0.0.1, identity from the credential only,
operations authorized by the policy, one JSON error shape, the context manifest, and request limits.

Reads go to the shared demo service; every write goes to a fresh warehouse of its own.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.raw_tables import raw_table

from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse

LEVELS = ["public", "internal", "confidential", "restricted"]
LEGAL_QUERY = "Ruiz matter investigation legal hold"
DEMO_POLICY = policy_file("demo.csv").read_text(encoding="utf-8")
TRACEBACK_MARKS = ("Traceback", 'File "', "line ", ".py")


def error_of(response: httpx.Response, status: int, code: str) -> str:
    """Assert ``response`` is the one error shape with ``status`` and ``code``; return its message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code, body
    message = body["error"]["message"]
    assert isinstance(message, str) and message
    assert not any(mark in message for mark in TRACEBACK_MARKS[:2]), message
    return message


def ids(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [hit["chunk_id"] for hit in response.json()["hits"]]


@pytest.fixture
def http() -> Iterator[Callable[[str], httpx.Client]]:
    """Plain clients (no credential) for a base URL, closed at the end."""
    made: list[httpx.Client] = []

    def client(url: str) -> httpx.Client:
        made.append(httpx.Client(base_url=url, timeout=60))
        return made[-1]

    yield client
    for one in made:
        one.close()


@pytest.fixture
def small_service(small_warehouse: Warehouse, serve: Callable[..., str], http: Callable[[str], httpx.Client]) -> httpx.Client:
    """A client (no credential) of a fresh warehouse holding SMALL_CORPUS, served for this test only."""
    return http(serve(small_warehouse))


# ---------------------------------------------------------------- service routes and OpenAPI


def test_healthz_answers_without_a_credential(demo_service_url):
    response = httpx.get(f"{demo_service_url}/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_is_200_and_names_the_policy_in_force(demo_service_url, demo_warehouse):
    response = httpx.get(f"{demo_service_url}/readyz")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ready"
    assert body["policy_version"] == demo_warehouse.policy.version
    assert body["table_version"] >= 1
    assert body["serving_index"]["state"] == "idle"  # the demo table is too small to want one


def test_readyz_is_503_on_a_warehouse_with_no_policy(fresh_warehouse, serve):
    url = serve(fresh_warehouse)
    message = error_of(httpx.get(f"{url}/readyz"), 503, "policy_unavailable")
    assert "no policy" in message
    assert httpx.get(f"{url}/healthz").status_code == 200


def test_openapi_documents_every_route_and_the_bearer_credential(demo_service_url):
    response = httpx.get(f"{demo_service_url}/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    routes = {(method.upper(), path) for path, item in schema["paths"].items() for method in item}
    assert {
        ("POST", "/v1/search"),
        ("POST", "/v1/ingest"),
        ("POST", "/v1/derive"),
        ("POST", "/v1/sync"),
        ("POST", "/v1/forget"),
        ("GET", "/v1/chunks/{chunk_id}"),
        ("GET", "/v1/chunks/{chunk_id}/explain"),
        ("GET", "/v1/lineage/{item_id}"),
        ("GET", "/v1/audit/receipts"),
        ("GET", "/v1/audit/verify"),
        ("GET", "/v1/audit/access-review"),
        ("GET", "/v1/audit/inventory"),
        ("PUT", "/v1/policy"),
        ("GET", "/v1/whoami"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
    } <= routes
    schemes = schema["components"]["securitySchemes"]
    assert [s["scheme"] for s in schemes.values()] == ["bearer"]
    search = schema["paths"]["/v1/search"]["post"]
    assert {"200", "401", "403", "404", "413", "422", "503"} <= set(search["responses"])
    assert search["security"], "search must declare the bearer credential"


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_docs_load_every_asset_from_the_service_itself(demo_service_url, page):
    """No CDN: every script, stylesheet and icon the page names is served by the service."""
    html = httpx.get(f"{demo_service_url}{page}").text
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html) + re.findall(r"""url: ?["']([^"']+)["']""", html)
    assert assets and not [asset for asset in assets if asset.startswith(("http:", "https:", "//"))], assets
    for asset in assets:
        answer = httpx.get(f"{demo_service_url}{asset}")
        assert answer.status_code == 200 and answer.content, asset


def test_search_returns_only_what_the_caller_may_read(as_user, demo_warehouse):
    hits = as_user("dave").post("/v1/search", json={"query": LEGAL_QUERY, "k": 20}).json()["hits"]
    assert hits
    for hit in hits:
        assert hit["classification"] in ("public", "internal")
        assert hit["labels"] == []
    legal = set(demo_warehouse.store.chunks.chunk_ids_of("acme-legal-001"))
    assert legal.isdisjoint(h["chunk_id"] for h in hits)


def test_get_chunk_returns_a_chunk_the_caller_may_read(as_user, demo_warehouse):
    (chunk_id,) = demo_warehouse.store.chunks.chunk_ids_of("acme-fin-001")
    response = as_user("alice").get(f"/v1/chunks/{chunk_id}")
    assert response.status_code == 200, response.text
    hit = response.json()
    assert (hit["chunk_id"], hit["doc_id"]) == (chunk_id, "acme-fin-001")
    assert hit["labels"] == ["finance"] and hit["classification"] == "confidential"


def test_explain_tells_the_caller_why_it_may_read_a_chunk(as_user, demo_warehouse):
    (chunk_id,) = demo_warehouse.store.chunks.chunk_ids_of("acme-fin-001")
    response = as_user("alice").get(f"/v1/chunks/{chunk_id}/explain")
    assert response.status_code == 200, response.text
    explanation = response.json()
    assert explanation["allowed"] is True
    assert (explanation["subject"], explanation["tenant"]) == ("user:alice", "acme")
    assert explanation["steps"] and all(step["passed"] for step in explanation["steps"])


def test_explaining_someone_elses_access_needs_audit(as_user, demo_warehouse):
    (chunk_id,) = demo_warehouse.store.chunks.chunk_ids_of("acme-fin-001")
    error_of(as_user("dave").get(f"/v1/chunks/{chunk_id}/explain", params={"about": "user:alice"}), 403, "forbidden")
    response = as_user("carol").get(f"/v1/chunks/{chunk_id}/explain", params={"about": "user:dave"})
    assert response.status_code == 200, response.text
    assert response.json()["subject"] == "user:dave" and response.json()["allowed"] is False


def test_lineage_shows_an_auditor_the_chunks_and_the_receipts_that_returned_them(as_user, demo_warehouse):
    (chunk_id,) = demo_warehouse.store.chunks.chunk_ids_of("acme-pub-003")
    assert chunk_id in ids(as_user("dave").post("/v1/search", json={"query": "Acme Ledger FAQ banks supported"}))
    response = as_user("carol").get("/v1/lineage/acme-pub-003")
    assert response.status_code == 200, response.text
    lineage = response.json()
    assert lineage["source"]["doc_id"] == "acme-pub-003" and lineage["source"]["tenant"] == "acme"
    assert lineage["chunks"] == [chunk_id]
    assert any(r["subject"] == "user:dave" and chunk_id in r["returned"] for r in lineage["receipts"])


def test_audit_receipts_and_chain_verification_answer_an_auditor(as_user):
    purpose = f"audit-route-{uuid.uuid4()}"
    as_user("dave").post("/v1/search", json={"query": "parental leave", "purpose": purpose}).raise_for_status()
    carol = as_user("carol")
    response = carol.get("/v1/audit/receipts", params={"subject": "user:dave", "operation": "search", "limit": 50})
    assert response.status_code == 200, response.text
    receipts = response.json()
    assert [r for r in receipts if r["purpose"] == purpose]
    assert all(r["subject"] == "user:dave" and r["tenant"] == "acme" for r in receipts)
    chain = carol.get("/v1/audit/verify")
    assert chain.status_code == 200, chain.text
    assert chain.json()["ok"] is True and chain.json()["problems"] == []


def test_receipts_page_by_offset_with_their_total_and_filter_by_outcome(as_user, demo_warehouse):
    """Pages of one filter, fixed in time, tile it: no receipt twice, none left out, the total
    in X-Total-Count; allowed=false keeps the refusals only."""
    assert as_user("dave").get("/v1/audit/receipts").status_code == 403  # a refusal, recorded
    carol = as_user("carol")
    until = datetime.now(timezone.utc).isoformat()
    first = carol.get("/v1/audit/receipts", params={"until": until, "limit": 7})
    total = int(first.headers["X-Total-Count"])
    assert total > 7 and len(first.json()) == 7
    seen = []
    for offset in range(0, total, 7):
        page = carol.get("/v1/audit/receipts", params={"until": until, "limit": 7, "offset": offset})
        assert int(page.headers["X-Total-Count"]) == total
        seen += [(r["chain"], r["seq"]) for r in page.json()]
    assert len(seen) == len(set(seen)) == total
    expected = demo_warehouse.audit.query(tenant="acme", until=datetime.fromisoformat(until), allowed=False)
    refused = carol.get("/v1/audit/receipts", params={"until": until, "allowed": "false", "limit": 1000})
    assert [(r["chain"], r["seq"]) for r in refused.json()] == [(r.chain, r.seq) for r in expected]
    assert refused.json() and not any(r["allowed"] for r in refused.json())


def test_the_vocabulary_names_only_the_callers_tenants_labels_subjects_and_documents(as_user, demo_warehouse):
    found = as_user("carol").get("/v1/audit/vocabulary").json()
    assert found["tenant"] == "acme" and "legal-hold" in found["labels"] and "user:dave" in found["subjects"]
    assert found["documents"] and all(doc.startswith("acme-") for doc in found["documents"])
    assert not [s for s in found["subjects"] if s in ("user:erin", "user:hank")], "globex's people are not named"
    assert as_user("dave").get("/v1/audit/vocabulary").status_code == 403


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"since": "0086-07-08T22:17:46Z"}, 200),
        ({"until": "0001-01-01T00:00:00+05:00"}, 422),
        ({"since": "0"}, 422),
        ({"until": "1700000000.5"}, 422),
        ({"since": "2026-01-01T00:00:00"}, 422),
        ({"limit": 0}, 422),
        ({"limit": 1001}, 422),
    ],
)
def test_audit_time_filters_take_aware_iso_datetimes_of_any_year(as_user, params, status):
    as_user("dave").post("/v1/search", json={"query": "parental leave"}).raise_for_status()
    response = as_user("carol").get("/v1/audit/receipts", params=params)
    if status == 200:
        assert response.status_code == 200, response.text
        assert response.json()
    else:
        message = error_of(response, status, "invalid_request")
        assert next(iter(params)) in message


def test_an_id_longer_than_any_id_is_422_naming_it(as_user):
    message = error_of(as_user("carol").get(f"/v1/chunks/{'x' * 513}"), 422, "invalid_request")
    assert "chunk_id" in message
    assert "item_id" in error_of(as_user("carol").get(f"/v1/lineage/{'x' * 513}"), 422, "invalid_request")


def test_whoami_names_the_subject_and_tenant_of_the_credential_and_its_rights_without_a_receipt(as_user, demo_warehouse):
    before = demo_warehouse.audit.count()
    assert as_user("erin", tenant="globex").get("/v1/whoami").json() == {
        "subject": "user:erin",
        "tenant": "globex",
        "actor": None,
        "method": "jwt",
        "groups": [],
        "rights": ["derive"],  # what the demo policy grants erin in globex
    }
    assert "audit" in as_user("carol").get("/v1/whoami").json()["rights"]
    assert demo_warehouse.audit.count() == before  # reading one's rights reads no row and leaves no receipt


# ---------------------------------------------------------------- writes, on fresh warehouses


def test_an_admin_ingests_records_into_its_own_tenant(small_service, bearer, small_warehouse):
    record = {"id": "acme-new", "text": "The parking garage closes for repairs in May.",
              "acl": {"allow": ["everyone"], "deny": []}, "labels": [], "classification": "public"}  # fmt: skip
    response = small_service.post("/v1/ingest", json={"records": [record]}, headers=bearer("admin"))
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["written"] == ["acme-new"] and report["rejected"] == []
    assert small_warehouse.store.sources.document_tenants("acme-new") == ["acme"]
    found = small_service.post(
        "/v1/search",
        json={"query": "parking garage repairs", "k": 1, "min_version": report["table_version"]},
        headers=bearer("dave"),
    )
    assert [h["doc_id"] for h in found.json()["hits"]] == ["acme-new"]


def test_derive_saves_a_note_tagged_from_its_parents(small_service, bearer, small_warehouse):
    (parent,) = small_warehouse.store.chunks.chunk_ids_of("acme-budget")
    response = small_service.post(
        "/v1/derive", json={"text": "Budget review: Thursday.", "parents": [parent], "kind": "note"}, headers=bearer("alice")
    )
    assert response.status_code == 200, response.text
    row = response.json()
    assert (row["parents"], row["labels"], row["classification"]) == ([parent], ["finance"], "confidential")
    assert small_service.get(f"/v1/chunks/{row['chunk_id']}", headers=bearer("alice")).status_code == 200
    error_of(small_service.get(f"/v1/chunks/{row['chunk_id']}", headers=bearer("dave")), 404, "not_found")


def test_derive_from_a_parent_the_caller_cannot_read_reads_as_missing(small_service, bearer, small_warehouse):
    (parent,) = small_warehouse.store.chunks.chunk_ids_of("acme-budget")
    body = {"text": "What I could not read.", "parents": [parent]}
    message = error_of(small_service.post("/v1/derive", json=body, headers=bearer("dave")), 404, "not_found")
    assert parent in message


def test_an_admin_syncs_new_tags_onto_a_document(small_service, bearer, small_warehouse):
    (chunk_id,) = small_warehouse.store.chunks.chunk_ids_of("acme-memo")
    assert small_service.get(f"/v1/chunks/{chunk_id}", headers=bearer("dave")).status_code == 200
    record = {"id": "acme-memo", "tenant": "acme", "acl": {"allow": ["group:finance"], "deny": []},
              "labels": ["finance"], "classification": "confidential"}  # fmt: skip
    response = small_service.post("/v1/sync", json={"records": [record]}, headers=bearer("admin"))
    assert response.status_code == 200, response.text
    assert response.json()["documents"] == ["acme-memo"] and response.json()["chunks"] == 1
    error_of(small_service.get(f"/v1/chunks/{chunk_id}", headers=bearer("dave")), 404, "not_found")
    assert small_service.get(f"/v1/chunks/{chunk_id}", headers=bearer("alice")).json()["labels"] == ["finance"]


def test_an_admin_forgets_a_document_and_everything_of_it(small_service, bearer, small_warehouse):
    (chunk_id,) = small_warehouse.store.chunks.chunk_ids_of("acme-memo")
    body = {"doc_id": "acme-memo", "reason": "erasure request 42"}
    response = small_service.post("/v1/forget", json=body, headers=bearer("admin"))
    assert response.status_code == 200, response.text
    assert response.json()["doc_id"] == "acme-memo" and response.json()["chunks"] == 1
    error_of(small_service.get(f"/v1/chunks/{chunk_id}", headers=bearer("dave")), 404, "not_found")
    lineage = small_service.get("/v1/lineage/acme-memo", headers=bearer("carol")).json()
    assert (lineage["source"], lineage["chunks"], lineage["derived"]) == (None, [], [])  # nothing of it is left
    (tombstone,) = lineage["tombstones"]  # but its erasure is on record: ids, who, why, the purge's proof
    assert (tombstone["subject"], tombstone["reason"], tombstone["erased"]["chunks"]) == ("user:admin", "erasure request 42", [chunk_id])
    assert tombstone["versions_left"] == {"chunks": 1, "sources": 1}
    assert small_warehouse.store.chunks.chunk_ids_of("acme-memo") == []

    record = {"id": "acme-memo", "text": "The memo, sent again by a connector.", "acl": {"allow": ["everyone"]},
              "classification": "public"}  # fmt: skip
    again = small_service.post("/v1/ingest", json={"records": [record]}, headers=bearer("admin")).json()
    assert again["written"] == [] and "was erased on" in again["rejected"][0]["reason"]  # the erasure holds
    restored = small_service.post("/v1/ingest", json={"records": [record], "restore_erased": True}, headers=bearer("admin"))
    assert restored.json()["restored"] == ["acme-memo"] and restored.json()["written"] == ["acme-memo"]


def test_forget_with_a_reason_the_audit_cannot_record_is_refused_before_anything_is_erased(
    small_service, bearer, small_warehouse
):
    body = {"doc_id": "acme-memo", "reason": "bad\x00reason"}
    error_of(small_service.post("/v1/forget", json=body, headers=bearer("admin")), 422, "invalid_request")
    assert small_warehouse.store.chunks.chunk_ids_of("acme-memo"), "the document was erased without a receipt"


def test_a_policy_put_is_authorized_before_its_role_graph_is_checked(small_warehouse, serve, http, bearer, tmp_path: Path):
    policy = tmp_path / "acme-admin-olivia.csv"
    policy.write_text(DEMO_POLICY + "\ng, user:olivia, group:admins, acme\n", encoding="utf-8")
    installed = small_warehouse.install_policy(policy).version
    client = http(serve(small_warehouse))
    cyclic = "g, group:a, group:b, globex\ng, group:b, group:a, globex\n"
    message = error_of(client.put("/v1/policy", json={"text": cyclic}, headers=bearer("olivia")), 403, "forbidden")
    assert "globex" in message and "cycle" not in message  # refused for the right, before the graph is walked
    assert small_warehouse.policy.version == installed
    message = error_of(client.put("/v1/policy", json={"text": cyclic}, headers=bearer("admin")), 422, "invalid_request")
    assert "policy line 2" in message and "cycle" in message


def test_a_policy_put_by_an_admin_of_every_tenant_installs_it(small_service, bearer, small_warehouse):
    before = small_warehouse.policy.version
    text = DEMO_POLICY + "\ng, user:dave, group:finance, acme\n"
    response = small_service.put("/v1/policy", json={"text": text}, headers=bearer("admin"))
    assert response.status_code == 200, response.text
    assert response.json()["version"] != before and response.json()["tenants"] == ["acme", "globex"]
    assert small_service.get("/readyz").json()["policy_version"] == response.json()["version"]
    (chunk_id,) = small_warehouse.store.chunks.chunk_ids_of("acme-budget")
    assert small_service.get(f"/v1/chunks/{chunk_id}", headers=bearer("dave")).status_code == 200


# ---------------------------------------------------------------- one JSON error shape, never a stack trace


def test_an_unexpected_error_answers_500_internal_without_a_traceback(small_warehouse, serve):
    def add_failing_route(app: Any) -> None:
        @app.get("/test-only/boom")
        def boom() -> None:
            raise RuntimeError("secret detail from /srv/ragwarden/warehouse.py line 42")

    url = serve(small_warehouse, configure=add_failing_route)
    response = httpx.get(f"{url}/test-only/boom")
    message = error_of(response, 500, "internal")
    assert "secret detail" not in response.text and not any(mark in response.text for mark in TRACEBACK_MARKS)
    assert message == "internal error; the server log has the details"
    assert httpx.get(f"{url}/healthz").status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("GET", "/v1/chunks/no-such-chunk", None, 404, "not_found"),
        ("GET", "/v1/no-such-route", None, 404, "not_found"),
        ("DELETE", "/v1/search", None, 405, "method_not_allowed"),
        ("POST", "/v1/search", "{not json", 422, "invalid_request"),
        ("POST", "/v1/search", [1, 2], 422, "invalid_request"),
        ("POST", "/v1/search", {"query": "x", "min_version": 10**12}, 503, "warehouse_unavailable"),
        ("POST", "/v1/ingest", {"records": [{"id": "x"}]}, 403, "forbidden"),
    ],
)
def test_every_error_is_json_with_a_stable_code_and_a_message(small_service, bearer, method, path, body, status, code):
    content = body if isinstance(body, str) else json.dumps(body) if body is not None else None
    headers = {**bearer("alice"), "content-type": "application/json"}
    error_of(small_service.request(method, path, content=content, headers=headers), status, code)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/chunks/bad%00id", None),
        ("GET", "/v1/lineage/bad%00id", None),
        ("POST", "/v1/forget", {"doc_id": "bad\x00id", "reason": "test"}),
        ("POST", "/v1/sync", {"records": [{"id": "bad\x00id", "tenant": "acme", "acl": {"allow": ["everyone"]},
                                           "labels": [], "classification": "public"}]}),
        ("POST", "/v1/derive", {"text": "note", "parents": ["bad\x00id"]}),
    ],
)  # fmt: skip
def test_an_id_holding_a_nul_character_reads_as_missing_not_as_a_server_error(small_service, bearer, method, path, body):
    caller = {"/v1/lineage/bad%00id": "carol", "/v1/derive": "alice"}.get(path, "admin")
    response = small_service.request(method, path, json=body, headers=bearer(caller))
    error_of(response, 404, "not_found")


def test_explaining_an_id_holding_a_nul_character_is_a_client_error(small_service, bearer):
    error_of(small_service.get("/v1/chunks/bad%00id/explain", headers=bearer("alice")), 422, "invalid_request")


# ---------------------------------------------------------------- identity comes from the credential only


@pytest.mark.parametrize(
    ("field", "value"), [("subject", "user:carol"), ("tenant", "globex"), ("actor", "agent:x"), ("as", "user:carol")]
)
def test_a_search_body_naming_an_identity_is_refused(as_user, field, value):
    response = as_user("dave").post("/v1/search", json={"query": LEGAL_QUERY, field: value})
    message = error_of(response, 422, "invalid_request")
    assert field in message


def test_an_identity_in_the_query_string_changes_nothing(as_user):
    dave, carol = as_user("dave"), as_user("carol")
    body = {"query": LEGAL_QUERY, "k": 10}
    own = ids(dave.post("/v1/search", json=body))
    spoofed = ids(dave.post("/v1/search", json=body, params={"subject": "user:carol", "as": "user:carol",
                                                               "tenant": "acme", "actor": "user:carol"}))  # fmt: skip
    carols = ids(carol.post("/v1/search", json=body))
    assert spoofed == own
    assert carols != own and set(carols) - set(own), "carol must see something dave cannot for this to prove anything"
    who = dave.get("/v1/whoami", params={"subject": "user:carol", "tenant": "globex"}).json()
    assert (who["subject"], who["tenant"]) == ("user:dave", "acme")


# ---------------------------------------------------------------- operations authorized by the policy


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/ingest", {"records": [{"id": "alice-doc", "text": "mine", "acl": {"allow": ["everyone"]},
                                             "classification": "public"}]}),
        ("POST", "/v1/sync", {"records": [{"id": "acme-memo", "tenant": "acme", "acl": {"allow": ["user:alice"]},
                                           "labels": [], "classification": "public"}]}),
        ("POST", "/v1/forget", {"doc_id": "acme-memo", "reason": "alice wants it gone"}),
        ("GET", "/v1/audit/receipts", None),
        ("GET", "/v1/audit/verify", None),
        ("GET", "/v1/audit/access-review?subject=user:dave", None),
        ("GET", "/v1/audit/inventory?label=finance", None),
        ("GET", "/v1/lineage/acme-memo", None),
        ("PUT", "/v1/policy", {"text": DEMO_POLICY + "\ng, user:alice, group:admins, acme\n"}),
    ],
)  # fmt: skip
def test_an_operation_the_policy_does_not_grant_is_403_and_changes_nothing(
    small_service, bearer, small_warehouse, method, path, body
):
    version, policy = small_warehouse.store.chunks.version, small_warehouse.policy.version
    response = small_service.request(method, path, json=body, headers=bearer("alice"))
    message = error_of(response, 403, "forbidden")
    assert "alice" in message
    assert (small_warehouse.store.chunks.version, small_warehouse.policy.version) == (version, policy)


def test_derive_is_403_for_a_caller_without_the_derive_grant(small_service, bearer, small_warehouse):
    (parent,) = small_warehouse.store.chunks.chunk_ids_of("acme-memo")
    body = {"text": "admin is no staff member", "parents": [parent]}
    error_of(small_service.post("/v1/derive", json=body, headers=bearer("admin")), 403, "forbidden")


def test_a_caller_without_credentials_is_401_on_every_governed_route(small_service):
    for method, path in [("POST", "/v1/search"), ("POST", "/v1/ingest"), ("POST", "/v1/derive"), ("POST", "/v1/sync"),
                         ("POST", "/v1/forget"), ("GET", "/v1/chunks/x"), ("GET", "/v1/chunks/x/explain"),
                         ("GET", "/v1/lineage/x"), ("GET", "/v1/audit/receipts"), ("GET", "/v1/audit/verify"),
                         ("GET", "/v1/audit/access-review"), ("GET", "/v1/audit/inventory?label=x"),
                         ("PUT", "/v1/policy"), ("GET", "/v1/whoami")]:  # fmt: skip
        response = small_service.request(method, path, json={"query": "x"} if method != "GET" else None)
        error_of(response, 401, "unauthenticated")
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_a_caller_without_credentials_hears_401_before_anything_about_its_body(small_service):
    """A body that would not validate (k of 0, a subject field the API does not take) still answers
    401, not 422 describing the schema: who asks is decided first."""
    response = small_service.post("/v1/search", json={"query": "x", "k": 0, "subject": "user:admin"})
    error_of(response, 401, "unauthenticated")


def test_a_forbidden_chunk_reads_byte_for_byte_like_a_missing_one(as_user, demo_warehouse):
    (secret,) = demo_warehouse.store.chunks.chunk_ids_of("acme-fin-001")
    missing = uuid.uuid4().hex
    assert len(missing) == len(secret) and missing not in demo_warehouse.store.chunks.rows([missing])
    dave = as_user("dave")
    forbidden, absent = dave.get(f"/v1/chunks/{secret}"), dave.get(f"/v1/chunks/{missing}")
    assert forbidden.status_code == absent.status_code == 404
    assert forbidden.json()["error"]["code"] == absent.json()["error"]["code"] == "not_found"
    assert forbidden.content.replace(secret.encode(), b"ID") == absent.content.replace(missing.encode(), b"ID")
    # the date and the durations differ from call to call, as a client's own clock would show
    varying = ("date",)
    assert {k: v for k, v in forbidden.headers.items() if k not in varying} == {
        k: v for k, v in absent.headers.items() if k not in varying
    }
    explained = dave.get(f"/v1/chunks/{secret}/explain").json()
    unknown = dave.get(f"/v1/chunks/{missing}/explain").json()
    assert {**explained, "chunk_id": "ID"} == {**unknown, "chunk_id": "ID"}


def test_an_acme_admin_cannot_forget_a_globex_document(small_service, bearer, small_warehouse):
    body = {"doc_id": "globex-plan", "reason": "cross-tenant attempt"}
    error_of(small_service.post("/v1/forget", json=body, headers=bearer("admin")), 404, "not_found")
    assert small_warehouse.store.chunks.chunk_ids_of("globex-plan")


@pytest.mark.parametrize(("named", "status", "code"), [("globex", 403, "forbidden"), ("acme", 404, "not_found")])
def test_an_acme_admin_cannot_sync_a_globex_document(small_service, bearer, small_warehouse, named, status, code):
    record = {"id": "globex-plan", "tenant": named, "acl": {"allow": ["everyone"], "deny": []}, "labels": [],
              "classification": "public"}  # fmt: skip
    error_of(small_service.post("/v1/sync", json={"records": [record]}, headers=bearer("admin")), status, code)
    assert small_warehouse.store.sources.document_tenants("globex-plan") == ["globex"]
    (chunk_id,) = small_warehouse.store.chunks.chunk_ids_of("globex-plan")
    assert small_warehouse.store.chunks.rows([chunk_id])[chunk_id]["classification"] == LEVELS.index("internal")


def test_ingest_of_a_record_naming_another_tenant_is_rejected(small_service, bearer, small_warehouse):
    foreign = {"id": "acme-admin-into-globex", "text": "planted", "tenant": "globex",
               "acl": {"allow": ["everyone"]}, "classification": "public"}  # fmt: skip
    response = small_service.post("/v1/ingest", json={"records": [foreign]}, headers=bearer("admin"))
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["written"] == [] and len(report["rejected"]) == 1
    assert "tenant 'globex'" in report["rejected"][0]["reason"]
    assert small_warehouse.store.sources.document_tenants("acme-admin-into-globex") == []


def test_an_id_another_tenant_uses_ingests_exactly_like_an_unused_one(small_service, bearer, small_warehouse):
    """Ids are per tenant: reusing globex's id writes acme's own document, and the answer tells
    acme's admin nothing it would not get for an id nobody uses."""
    globex_before = chunk_texts_of(small_warehouse, "globex-plan", "globex")

    def ingest(doc_id: str) -> dict:
        record = {"id": doc_id, "text": "Acme's own plan for the spring fair.", "acl": {"allow": ["group:staff"]},
                  "classification": "internal"}  # fmt: skip
        response = small_service.post("/v1/ingest", json={"records": [record]}, headers=bearer("admin"))
        assert response.status_code == 200, response.text
        return {k: v for k, v in response.json().items() if k not in ("run_id", "table_version")}

    reused, unused = ingest("globex-plan"), ingest("acme-never-used")
    assert reused == {**unused, "written": ["globex-plan"]}
    assert chunk_texts_of(small_warehouse, "globex-plan", "globex") == globex_before
    assert chunk_texts_of(small_warehouse, "globex-plan", "acme") == ["Acme's own plan for the spring fair."]
    found = small_service.post("/v1/search", json={"query": "new warehouse plans", "k": 10}, headers=bearer("dave"))
    assert [h["text"] for h in found.json()["hits"] if h["doc_id"] == "globex-plan"] == chunk_texts_of(
        small_warehouse, "globex-plan", "acme"
    )


def chunk_texts_of(warehouse, doc_id: str, tenant: str) -> list[str]:
    rows = warehouse.store.chunks.rows(warehouse.store.chunks.chunk_ids_of(doc_id, tenant), ["chunk_id", "text"])
    return [row["text"] for _, row in sorted(rows.items())]


def test_a_policy_put_by_someone_lacking_admin_in_every_tenant_is_403(
    small_warehouse, serve, http, bearer, tmp_path: Path
):
    policy = tmp_path / "acme-admin-olivia.csv"
    policy.write_text(DEMO_POLICY + "\ng, user:olivia, group:admins, acme\n", encoding="utf-8")
    installed = small_warehouse.install_policy(policy).version
    client = http(serve(small_warehouse))
    acme_only = "\n".join(line for line in DEMO_POLICY.splitlines() if "globex" not in line)
    message = error_of(client.put("/v1/policy", json={"text": acme_only}, headers=bearer("olivia")), 403, "forbidden")
    assert "globex" in message
    assert small_warehouse.policy.version == installed
    # olivia does hold admin in acme: the refusal is about the other tenant's rules
    response = client.post("/v1/forget", json={"doc_id": "acme-memo", "reason": "x"}, headers=bearer("olivia"))
    assert response.status_code == 200, response.text


# ---------------------------------------------------------------- agents acting for a user


@pytest.mark.parametrize("agent", ["agent:notes", "service:indexer", "agent:admin"])  # named like a stronger caller: no gain
def test_an_agent_acting_for_a_user_gets_exactly_the_users_results(as_user, agent):
    body = {"query": LEGAL_QUERY, "k": 10}
    for user in ("dave", "carol"):
        own = ids(as_user(user).post("/v1/search", json=body))
        acted = ids(as_user(user, act=agent).post("/v1/search", json=body))
        assert acted == own, (user, agent)


def test_the_receipt_of_an_agents_search_names_both_subject_and_actor(as_user, demo_warehouse):
    purpose = f"agent-receipt-{uuid.uuid4()}"
    agent = as_user("carol", act="agent:notes")
    assert agent.get("/v1/whoami").json()["actor"] == "agent:notes"
    returned = ids(agent.post("/v1/search", json={"query": LEGAL_QUERY, "purpose": purpose}))
    (receipt,) = [r for r in demo_warehouse.audit.query(subject="user:carol", operation="search") if r.purpose == purpose]
    assert (receipt.subject, receipt.actor, receipt.tenant) == ("user:carol", "agent:notes", "acme")
    assert list(receipt.chunk_ids) == returned


# ---------------------------------------------------------------- the context manifest


@pytest.mark.parametrize(("user", "tenant"), [("carol", "acme"), ("bob", "acme"), ("dave", "acme"), ("erin", "globex")])
def test_every_search_response_carries_the_manifest_of_its_hits(as_user, user, tenant):
    response = as_user(user, tenant=tenant).post("/v1/search", json={"query": "salary compensation review", "k": 12})
    assert response.status_code == 200, response.text
    hits, manifest = response.json()["hits"], response.json()["manifest"]
    assert hits
    assert manifest["chunk_ids"] == [h["chunk_id"] for h in hits]
    assert manifest["labels"] == sorted({label for h in hits for label in h["labels"]})
    assert manifest["classification"] == max((h["classification"] for h in hits), key=LEVELS.index)
    assert manifest["table_versions"] == sorted({h["table_version"] for h in hits})
    assert manifest["policy_versions"] == sorted({h["policy_version"] for h in hits})
    assert manifest["doc_versions"] == sorted({f"{h['doc_id']}@{h['doc_version']}" for h in hits})


def test_a_search_with_no_hits_carries_an_empty_public_manifest(as_user):
    response = as_user("dave", tenant="no-such-tenant").post("/v1/search", json={"query": "anything"})
    assert response.status_code == 200, response.text
    assert response.json()["hits"] == []
    assert response.json()["manifest"] == {"chunk_ids": [], "labels": [], "classification": "public",
                                           "table_versions": [], "policy_versions": [], "doc_versions": []}  # fmt: skip


def test_a_manifest_with_labels_reports_the_highest_classification(as_user):
    response = as_user("carol").post("/v1/search", json={"query": LEGAL_QUERY, "k": 20})
    manifest = response.json()["manifest"]
    assert {"legal-hold", "pii"} <= set(manifest["labels"])
    assert manifest["classification"] in ("confidential", "restricted")


# ---------------------------------------------------------------- request limits

LIMIT = 4096


@pytest.fixture
def limited(small_warehouse: Warehouse, serve: Callable[..., str], http: Callable[[str], httpx.Client]) -> httpx.Client:
    """A client of a fresh warehouse served with max_body_bytes=4096."""
    return http(serve(small_warehouse, max_body_bytes=LIMIT))


def test_a_body_over_the_limit_is_413_naming_the_limit(limited, bearer, small_warehouse):
    version = small_warehouse.store.chunks.version
    record = {"id": "big", "text": "x" * (2 * LIMIT), "acl": {"allow": ["everyone"]}, "classification": "public"}
    response = limited.post("/v1/ingest", json={"records": [record]}, headers=bearer("admin"))
    assert int(response.request.headers["content-length"]) > LIMIT
    message = error_of(response, 413, "payload_too_large")
    assert str(LIMIT) in message and "max_body_bytes" in message
    assert small_warehouse.store.chunks.version == version


def test_a_streamed_body_over_the_limit_is_413_naming_the_limit(limited, bearer, small_warehouse):
    version = small_warehouse.store.chunks.version
    record = {"id": "big", "text": "x" * (2 * LIMIT), "acl": {"allow": ["everyone"]}, "classification": "public"}
    payload = json.dumps({"records": [record]}).encode()
    pieces = iter([payload[i : i + 1024] for i in range(0, len(payload), 1024)])
    headers = {**bearer("admin"), "content-type": "application/json"}
    response = limited.post("/v1/ingest", content=pieces, headers=headers)
    assert "content-length" not in response.request.headers
    assert response.request.headers["transfer-encoding"] == "chunked"
    message = error_of(response, 413, "payload_too_large")
    assert str(LIMIT) in message
    assert small_warehouse.store.chunks.version == version


def test_a_streamed_body_within_the_limit_is_served(limited, bearer):
    payload = json.dumps({"query": "cafeteria soup", "k": 1}).encode()
    pieces = iter([payload[:10], payload[10:]])
    response = limited.post("/v1/search", content=pieces, headers={**bearer("dave"), "content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert [h["doc_id"] for h in response.json()["hits"]] == ["acme-memo"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": "budget", "k": 0}, "k"),
        ({"query": "budget", "k": 1001}, "k"),
        ({"query": "budget", "k": "ten"}, "k"),
        ({"query": "budget", "k": "5"}, "k"),
        ({"query": "budget", "k": True}, "k"),
        ({"query": "budget", "min_version": False}, "min_version"),
        ({"query": "budget", "min_version": -1}, "min_version"),
        ({"query": "q" * 8193}, "query"),
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"k": 3}, "query"),
        ({"query": "budget", "mode": "psychic"}, "mode"),
        ({"query": "budget", "group_by": "folder"}, "group_by"),
        ({"query": "budget", "group_by": "doc", "per_group": 0}, "per_group"),
        ({"query": "budget", "distinct": "yes"}, "distinct"),
        ({"query": "budget", "filter": "year > 2020"}, "filter"),
        ({"query": "budget", "filter": {"tenant": "globex"}}, "filter.tenant"),
        ({"query": "budget", "filter": {"$or": [{"year": {"$gt": "2020"}}]}}, "filter.$or[0].year.$gt"),
    ],
)
def test_search_arguments_out_of_range_are_422_naming_the_field(as_user, body, field):
    message = error_of(as_user("dave").post("/v1/search", json=body), 422, "invalid_request")
    assert message.startswith(field) or f" {field} " in f" {message} ", message


def test_a_search_collapsed_by_document_says_so_in_its_receipt(as_user, demo_warehouse):
    body = {"query": "quarterly budget", "k": 5, "group_by": "doc", "per_group": 1, "distinct": True}
    hits = as_user("alice").post("/v1/search", json=body).json()["hits"]
    assert hits and len({hit["doc_id"] for hit in hits}) == len(hits)
    receipt = demo_warehouse.audit.query(subject="user:alice", limit=1)[0]
    assert "at most 1 per document, distinct texts" in receipt.reason


def test_a_filtered_search_returns_matching_hits_with_their_metadata(as_user, demo_warehouse):
    only = {"doc_id": {"$in": ["acme-pub-001", "acme-fin-001"]}}
    hits = as_user("alice").post("/v1/search", json={"query": "quarterly budget", "k": 5, "filter": only}).json()["hits"]
    assert hits and {hit["doc_id"] for hit in hits} <= {"acme-pub-001", "acme-fin-001"}
    assert all(hit["metadata"]["title"] for hit in hits)
    receipt = demo_warehouse.audit.query(subject="user:alice", limit=1)[0]
    assert "filtered" in receipt.reason and receipt.details["filter_fingerprint"]
    assert "filter" not in receipt.details  # its values are query content: kept only where raw queries are


def test_the_largest_allowed_search_arguments_are_served(as_user):
    response = as_user("dave").post("/v1/search", json={"query": "q" * 8192, "k": 1000})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("agent", ["agent:notes", "agent:admin"])
def test_an_agent_reads_and_explains_chunks_exactly_as_its_user(as_user, demo_warehouse, agent):
    chunk_ids = sorted(demo_warehouse.store.chunks.chunk_ids_of_documents(
        (row["tenant"], row["doc_id"]) for row in raw_table(demo_warehouse.store, "sources").to_arrow().to_pylist()))[::3]  # fmt: skip
    for user in ("dave", "carol"):
        person, acting = as_user(user), as_user(user, act=agent)
        statuses = set()
        for chunk_id in chunk_ids:
            path = f"/v1/chunks/{chunk_id}"
            own, acted = person.get(path), acting.get(path)
            assert (acted.status_code, acted.json()) == (own.status_code, own.json()), (user, chunk_id)
            own_why, acted_why = person.get(path + "/explain"), acting.get(path + "/explain")
            assert (acted_why.status_code, acted_why.json()) == (own_why.status_code, own_why.json())
            statuses.add(own.status_code)
        assert statuses == {200, 404}, f"the sample should hold chunks {user} may and may not read"


def test_another_tenants_chunk_reads_byte_for_byte_like_a_missing_one(as_user, demo_warehouse):
    (public,) = demo_warehouse.store.chunks.chunk_ids_of("acme-pub-002")
    missing = uuid.uuid4().hex
    assert as_user("dave").get(f"/v1/chunks/{public}").status_code == 200  # readable to everyone in acme
    erin = as_user("erin", tenant="globex")
    crossing, absent = erin.get(f"/v1/chunks/{public}"), erin.get(f"/v1/chunks/{missing}")
    assert crossing.status_code == absent.status_code == 404
    assert crossing.content.replace(public.encode(), b"ID") == absent.content.replace(missing.encode(), b"ID")


def test_access_review_of_oneself_needs_nothing_and_of_another_needs_audit(as_user, demo_warehouse):
    own = as_user("dave").get("/v1/audit/access-review")
    assert own.status_code == 200, own.text
    assert own.json() == {**demo_warehouse.access_review(subject="user:dave", tenant="acme").as_dict()}
    other = as_user("carol").get("/v1/audit/access-review", params={"subject": "user:dave"})
    assert other.status_code == 200 and other.json()["rows"] == own.json()["rows"] > 0
    error_of(as_user("dave").get("/v1/audit/access-review", params={"subject": "user:carol"}), 403, "forbidden")


def test_inventory_groups_a_labels_rows_by_source_for_an_auditor(as_user, demo_warehouse):
    response = as_user("carol").get("/v1/audit/inventory", params={"label": "legal-hold"})
    assert response.status_code == 200, response.text
    found = demo_warehouse.inventory(label="legal-hold", tenant="acme", caller="user:carol")
    assert response.json() == {"label": "legal-hold", "tenant": "acme", "sources": found} and found


def test_the_lineage_of_a_document_whose_id_is_a_path_is_reachable(small_warehouse, serve, bearer, make_record):
    assert small_warehouse.ingest_records([make_record(id="hr/policies/leave.md", acl={"allow": ["everyone"]})]).ok
    response = httpx.get(f"{serve(small_warehouse)}/v1/lineage/hr%2Fpolicies%2Fleave.md", headers=bearer("carol"), timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["source"]["doc_id"] == "hr/policies/leave.md" and response.json()["chunks"]

