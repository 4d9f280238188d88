"""Authentication over real HTTP: JWTs (HS256, and RS256/ES256 from a JWKS file or URL) and API keys.

The identity provider is the one thing faked: its keys are generated here and its JWKS is served
by a tiny stdlib HTTP server on 127.0.0.1 (or written to a file). Everything else is real: the
service on 127.0.0.1, the warehouse, the policy. Each attack on the credential is its own test.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from support.identity_provider import AUDIENCE, ISSUER, JWT_SECRET
from support.live_server import api_app, serving
from support.loopback_http import LoopbackHTTPServer, fixed_answer

from ragwarden.api_keys import ApiKeys
from ragwarden.config import AuthSettings
from ragwarden.errors import ConfigurationError, InvalidRequestError
from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse

DEMO_POLICY = policy_file("demo.csv").read_text(encoding="utf-8")


class IdentityProvider:
    """The test identity provider's signing keys (one RSA, one EC P-256) and the JWKS publishing them."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[str, Any]] = {
            "rsa-1": ("RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
            "ec-1": ("ES256", ec.generate_private_key(ec.SECP256R1())),
        }

    def jwks(self) -> dict[str, Any]:
        published = []
        for kid, (algorithm, private) in self.keys.items():
            family = jwt.algorithms.RSAAlgorithm if algorithm == "RS256" else jwt.algorithms.ECAlgorithm
            jwk = family.to_jwk(private.public_key(), as_dict=True)
            published.append({**jwk, "kid": kid, "alg": algorithm, "use": "sig"})
        return {"keys": published}

    def public_pem(self, kid: str) -> bytes:
        return self.keys[kid][1].public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, kid: str, payload: dict[str, Any], *, algorithm: str | None = None, key: Any = None) -> str:
        own_algorithm, private = self.keys[kid]
        return jwt.encode(payload, key or private, algorithm=algorithm or own_algorithm, headers={"kid": kid})


def claims(sub: str = "alice", **overrides: Any) -> dict[str, Any]:
    """Valid claims for the test identity provider; an override of None removes the claim."""
    now = int(time.time())
    payload: dict[str, Any] = {"sub": sub, "tenant": "acme", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "nbf": now,
                               "exp": now + 600}  # fmt: skip
    for name, value in overrides.items():
        if value is None:
            payload.pop(name, None)
        else:
            payload[name] = value
    return payload


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def handmade(header: dict[str, Any], payload: dict[str, Any], sign: Callable[[bytes], bytes] | None) -> str:
    """A JWT assembled by hand, for the forgeries a JWT library refuses to make."""
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}"
    signature = b64(sign(signing_input.encode())) if sign else ""
    return f"{signing_input}.{signature}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def refused(response: httpx.Response, *fragments: str) -> None:
    """The response is the 401 answer, and its message says why (each of ``fragments``)."""
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"].startswith("Bearer")
    error = response.json()["error"]
    assert error["code"] == "unauthenticated"
    for fragment in fragments:
        assert fragment in error["message"], error["message"]


@pytest.fixture(scope="module")
def idp() -> IdentityProvider:
    return IdentityProvider()


@pytest.fixture(scope="module")
def jwks_url(idp: IdentityProvider) -> Iterator[str]:
    """The identity provider's JWKS, served by a stdlib HTTP server on 127.0.0.1."""
    server = LoopbackHTTPServer(fixed_answer(200, json.dumps(idp.jwks()).encode(), path="/.well-known/jwks.json"))
    try:
        yield f"{server.url}/.well-known/jwks.json"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def jwks_file(idp: IdentityProvider, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("idp") / "jwks.json"
    path.write_text(json.dumps(idp.jwks()), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def service(demo_warehouse: Warehouse, jwks_url: str) -> Iterator[httpx.Client]:
    """The demo warehouse behind a service that takes HS256 (shared secret) and RS256/ES256 (JWKS URL);
    one for the module, as its tests only present credentials and read."""
    auth = AuthSettings(jwt_secret=JWT_SECRET, jwt_jwks=jwks_url, issuer=ISSUER, audience=AUDIENCE)
    with serving(api_app(demo_warehouse, auth)) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client


def whoami(client: httpx.Client, token: str) -> httpx.Response:
    return client.get("/v1/whoami", headers=bearer(token))


# ---------------------------------------------------------------- tokens that verify


@pytest.mark.parametrize("sub", ["alice", "user:alice"])
def test_an_hs256_token_names_its_sub_as_subject_and_its_tenant_claim_as_tenant(service, sub):
    token = jwt.encode(claims(sub, tenant="globex"), JWT_SECRET, algorithm="HS256")
    response = whoami(service, token)
    assert response.status_code == 200, response.text
    assert response.json() == {"subject": "user:alice", "tenant": "globex", "actor": None, "method": "jwt", "groups": [],
                               "rights": []}  # fmt: skip


@pytest.mark.parametrize("kid", ["rsa-1", "ec-1"])
def test_an_asymmetric_token_verifies_against_a_jwks_served_over_http(service, idp, kid):
    response = whoami(service, idp.sign(kid, claims("carol")))
    assert response.status_code == 200, response.text
    assert (response.json()["subject"], response.json()["tenant"]) == ("user:carol", "acme")


@pytest.mark.parametrize("kid", ["rsa-1", "ec-1"])
def test_an_asymmetric_token_verifies_against_a_jwks_file(demo_warehouse, serve, idp, jwks_file, kid):
    auth = AuthSettings(jwt_jwks=str(jwks_file), issuer=ISSUER, audience=AUDIENCE)
    url = serve(demo_warehouse, auth=auth)
    response = httpx.get(f"{url}/v1/whoami", headers=bearer(idp.sign(kid, claims("erin", tenant="globex"))))
    assert response.status_code == 200, response.text
    assert (response.json()["subject"], response.json()["tenant"]) == ("user:erin", "globex")


def test_the_same_caller_sees_the_same_rows_whichever_key_signed_its_token(service, idp):
    body = {"query": "Ruiz matter investigation legal hold", "k": 8}
    answers = [
        service.post("/v1/search", json=body, headers=bearer(token)).json()["manifest"]["chunk_ids"]
        for token in (
            jwt.encode(claims("carol"), JWT_SECRET, algorithm="HS256"),
            idp.sign("rsa-1", claims("carol")),
            idp.sign("ec-1", claims("carol")),
        )
    ]
    assert answers[0] and answers[0] == answers[1] == answers[2]


def test_a_token_within_the_clock_leeway_is_accepted(service):
    now = int(time.time())
    token = jwt.encode(claims(exp=now - 5, nbf=now + 5), JWT_SECRET, algorithm="HS256")
    assert whoami(service, token).status_code == 200


def test_the_clock_leeway_is_a_setting_and_a_token_past_it_is_refused(demo_warehouse, serve):
    env = {"RAGWARDEN_JWT_SECRET": JWT_SECRET.decode(),
           "RAGWARDEN_JWT_ISSUER": ISSUER, "RAGWARDEN_JWT_AUDIENCE": AUDIENCE, "RAGWARDEN_JWT_LEEWAY_SECONDS": "2"}  # fmt: skip
    auth = AuthSettings.from_env(env)
    assert auth.leeway_seconds == 2
    now = int(time.time())
    with httpx.Client(base_url=serve(demo_warehouse, auth=auth), timeout=60) as strict:
        assert whoami(strict, jwt.encode(claims(exp=now - 10), JWT_SECRET, algorithm="HS256")).status_code == 401
        assert whoami(strict, jwt.encode(claims(exp=now + 60), JWT_SECRET, algorithm="HS256")).status_code == 200
    with pytest.raises(ConfigurationError, match="RAGWARDEN_JWT_LEEWAY_SECONDS must be a whole number of seconds, not 'soon'"):
        AuthSettings.from_env({**env, "RAGWARDEN_JWT_LEEWAY_SECONDS": "soon"})


def test_an_audience_list_naming_this_service_is_accepted(service, idp):
    token = idp.sign("rsa-1", claims(aud=["another-api", AUDIENCE]))
    assert whoami(service, token).status_code == 200


# ---------------------------------------------------------------- attacks on the credential, one test each


def test_a_request_without_a_credential_is_refused(service):
    refused(service.get("/v1/whoami"), "missing credential")
    refused(service.post("/v1/search", json={"query": "budget"}), "missing credential")


def test_a_token_whose_claims_were_changed_after_signing_is_refused(service):
    header, _, signature = jwt.encode(claims("dave"), JWT_SECRET, algorithm="HS256").split(".")
    forged = f"{header}.{b64(json.dumps(claims('carol')).encode())}.{signature}"
    refused(whoami(service, forged), "signature")


def test_an_asymmetric_token_whose_claims_were_changed_after_signing_is_refused(service, idp):
    header, _, signature = idp.sign("rsa-1", claims("dave")).split(".")
    forged = f"{header}.{b64(json.dumps(claims('carol')).encode())}.{signature}"
    refused(whoami(service, forged), "signature")


def test_an_hs256_token_signed_with_another_secret_is_refused(service):
    token = jwt.encode(claims("carol"), b"an-attackers-secret-that-is-long-enough!", algorithm="HS256")
    refused(whoami(service, token), "signature")


@pytest.mark.parametrize("kid", ["rsa-1", "ec-1"])
def test_a_token_signed_with_the_wrong_private_key_under_a_published_kid_is_refused(service, idp, kid):
    algorithm = idp.keys[kid][0]
    attacker = rsa.generate_private_key(public_exponent=65537, key_size=2048) if algorithm == "RS256" else (
        ec.generate_private_key(ec.SECP256R1()))  # fmt: skip
    refused(whoami(service, idp.sign(kid, claims("carol"), key=attacker)), "signature")


def test_an_expired_token_is_refused(service, idp):
    now = int(time.time())
    refused(whoami(service, idp.sign("ec-1", claims(exp=now - 3600, iat=now - 7200, nbf=now - 7200))), "expired")
    refused(whoami(service, jwt.encode(claims(exp=now - 3600), JWT_SECRET, algorithm="HS256")), "expired")


def test_a_token_without_an_expiry_is_refused(service):
    refused(whoami(service, jwt.encode(claims(exp=None), JWT_SECRET, algorithm="HS256")), "'exp'")


def test_a_token_that_is_not_valid_yet_is_refused(service, idp):
    later = int(time.time()) + 3600
    refused(whoami(service, idp.sign("rsa-1", claims(nbf=later, exp=later + 600))), "not valid yet")


def test_a_token_for_another_audience_is_refused(service, idp):
    refused(whoami(service, idp.sign("rsa-1", claims(aud="some-other-service"))), "audience")
    refused(whoami(service, jwt.encode(claims(aud=None), JWT_SECRET, algorithm="HS256")), "'aud'")


def test_a_token_from_another_issuer_is_refused(service, idp):
    refused(whoami(service, idp.sign("ec-1", claims(iss="https://evil.example"))), "issuer")
    refused(whoami(service, jwt.encode(claims(iss=None), JWT_SECRET, algorithm="HS256")), "'iss'")


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
def test_an_unsigned_alg_none_token_is_refused(service, alg):
    refused(whoami(service, handmade({"alg": alg, "typ": "JWT"}, claims("carol"), None)), "not accepted")
    refused(whoami(service, handmade({"alg": alg, "kid": "rsa-1"}, claims("carol"), None)), "not accepted")


def test_an_hs256_token_signed_with_the_rs256_public_key_is_refused(demo_warehouse, serve, service, idp, jwks_url):
    def with_public_key(data: bytes) -> bytes:
        return hmac.new(idp.public_pem("rsa-1"), data, hashlib.sha256).digest()

    confused = handmade({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}, claims("carol"), with_public_key)
    # where HS256 is accepted, only the shared secret verifies it
    refused(whoami(service, confused), "signature")
    # where only the JWKS is configured, HS256 is not accepted at all
    jwks_only = serve(demo_warehouse, auth=AuthSettings(jwt_jwks=jwks_url, issuer=ISSUER, audience=AUDIENCE))
    refused(httpx.get(f"{jwks_only}/v1/whoami", headers=bearer(confused)), "not accepted")


def test_a_token_whose_alg_does_not_match_its_keys_kind_is_refused(service, idp):
    refused(whoami(service, idp.sign("rsa-1", claims(), algorithm="PS256")), "not accepted")
    mismatched = jwt.encode(claims(), idp.keys["rsa-1"][1], algorithm="RS256", headers={"kid": "ec-1"})
    refused(whoami(service, mismatched), "does not match its key")


def test_a_token_naming_a_kid_the_identity_provider_does_not_publish_is_refused(service, idp):
    unknown = jwt.encode(claims(), idp.keys["rsa-1"][1], algorithm="RS256", headers={"kid": "rsa-rotated-out"})
    refused(whoami(service, unknown), "does not publish")
    no_kid = jwt.encode(claims(), idp.keys["rsa-1"][1], algorithm="RS256")
    refused(whoami(service, no_kid), "kid")


def test_a_token_without_the_tenant_claim_is_refused(service, idp):
    refused(whoami(service, idp.sign("rsa-1", claims(tenant=None))), "tenant")
    refused(whoami(service, jwt.encode(claims(tenant=None), JWT_SECRET, algorithm="HS256")), "tenant")


@pytest.mark.parametrize("bad", [{"sub": None}, {"sub": ""}, {"sub": 42}, {"tenant": ""}, {"tenant": ["acme"]},
                                 {"act": "agent:x"}, {"act": {"sub": ""}}, {"act": {"sub": "agent:\n"}}])  # fmt: skip
def test_a_token_with_a_malformed_identity_claim_is_refused(service, bad):
    refused(whoami(service, jwt.encode(claims(**bad), JWT_SECRET, algorithm="HS256")))


@pytest.mark.parametrize("actor", ["user:dave", "group:finance", "robot:x", "agent:"])
def test_a_token_whose_actor_is_a_person_or_group_is_refused_naming_the_claim(service, actor):
    response = whoami(service, jwt.encode(claims(act={"sub": actor}), JWT_SECRET, algorithm="HS256"))
    refused(response, "act.sub")


@pytest.mark.parametrize(("named", "actor"), [("agent:notes", "agent:notes"), ("service:indexer", "service:indexer"),
                                              ("notes", "agent:notes")])  # fmt: skip
def test_a_tokens_actor_is_an_agent_or_a_service(service, named, actor):
    response = whoami(service, jwt.encode(claims(act={"sub": named}), JWT_SECRET, algorithm="HS256"))
    assert response.status_code == 200, response.text
    assert response.json()["actor"] == actor


def test_the_python_api_refuses_a_person_as_actor_before_anything_runs(demo_warehouse):
    before = demo_warehouse.audit.count()
    with pytest.raises(InvalidRequestError, match="never a user or a group"):
        demo_warehouse.search("budget", subject="user:dave", tenant="acme", actor="user:carol")
    with pytest.raises(InvalidRequestError, match="never a user or a group"):
        demo_warehouse.explain("x", subject="user:dave", tenant="acme", actor="group:legal")
    assert demo_warehouse.audit.count() == before  # nothing ran, nothing was recorded


@pytest.mark.parametrize(
    "header",
    [
        "Bearer garbage",
        "Bearer a.b.c",
        "Bearer eyJhbGciOiJIUzI1NiJ9.e30",
        "Bearer rwk_not-a-key",
        "Bearer rwk_0123456789abcdef.wrong-secret",
        "Basic YWxpY2U6c2VjcmV0",
        "Bearer",
        "garbage",
    ],
)
def test_a_garbage_authorization_header_is_refused(service, header):
    refused(service.get("/v1/whoami", headers={"Authorization": header}))


def test_jwts_are_refused_where_no_jwt_key_is_configured(demo_warehouse, serve):
    url = serve(demo_warehouse, auth=AuthSettings())
    refused(httpx.get(f"{url}/v1/whoami", headers=bearer(jwt.encode(claims(), JWT_SECRET, algorithm="HS256"))), "API keys only")


def test_an_asymmetric_token_is_refused_where_only_hs256_is_configured(demo_service_url, idp):
    refused(httpx.get(f"{demo_service_url}/v1/whoami", headers=bearer(idp.sign("rsa-1", claims()))), "not accepted")


# ---------------------------------------------------------------- API keys for service accounts


@pytest.fixture
def keyed(demo_policy_warehouse: Warehouse, serve: Callable[..., str], tmp_path: Path) -> Iterator[tuple[httpx.Client, ApiKeys]]:
    """A fresh warehouse whose policy lets service:indexer ingest in acme, served; and its API keys."""
    policy = tmp_path / "policy.csv"
    policy.write_text(DEMO_POLICY + "\ng, service:indexer, group:admins, acme\n", encoding="utf-8")
    demo_policy_warehouse.install_policy(policy)
    with httpx.Client(base_url=serve(demo_policy_warehouse), timeout=60) as client:
        yield client, ApiKeys(demo_policy_warehouse.store.api_keys)


def test_an_api_key_authenticates_its_service_account(keyed):
    client, keys = keyed
    key = keys.create(subject="service:indexer", tenant="acme")
    response = client.get("/v1/whoami", headers=bearer(key))
    assert response.status_code == 200, response.text
    assert {k: v for k, v in response.json().items() if k != "rights"} == {
        "subject": "service:indexer", "tenant": "acme", "actor": None, "method": "api-key", "groups": []}  # fmt: skip


def test_a_service_accounts_operations_are_authorized_by_the_policy(keyed):
    client, keys = keyed
    indexer = bearer(keys.create(subject="service:indexer", tenant="acme"))
    stranger = bearer(keys.create(subject="service:stranger", tenant="acme"))
    record = {"id": "svc-doc", "text": "Indexed by the service account.", "acl": {"allow": ["everyone"]},
              "classification": "public"}  # fmt: skip
    assert client.post("/v1/ingest", json={"records": [record]}, headers=stranger).status_code == 403
    response = client.post("/v1/ingest", json={"records": [record]}, headers=indexer)
    assert response.status_code == 200, response.text
    assert response.json()["written"] == ["svc-doc"]


def test_api_keys_are_stored_only_as_hashes(keyed):
    client, keys = keyed
    key = keys.create(subject="service:indexer", tenant="acme")
    key_id, secret = key.removeprefix("rwk_").split(".")
    rows = [vars(row) for row in keys.table.rows()]
    assert len(rows) == 1 and rows[0]["key_id"] == key_id
    stored = json.dumps(rows, default=str)
    assert secret not in stored and key not in stored
    assert rows[0]["key_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert client.get("/v1/whoami", headers=bearer(key)).status_code == 200


def test_a_revoked_api_key_is_refused(keyed):
    client, keys = keyed
    key = keys.create(subject="service:indexer", tenant="acme")
    assert client.get("/v1/whoami", headers=bearer(key)).status_code == 200
    keys.revoke(key.removeprefix("rwk_").split(".")[0])
    refused(client.get("/v1/whoami", headers=bearer(key)), "revoked")
    assert [k.revoked for k in keys.list()] == [True]


def test_an_api_key_with_a_wrong_secret_is_refused(keyed):
    client, keys = keyed
    key = keys.create(subject="service:indexer", tenant="acme")
    key_id, secret = key.split(".")
    refused(client.get("/v1/whoami", headers=bearer(f"{key_id}.{secret[::-1]}")), "unknown API key")
    refused(client.get("/v1/whoami", headers=bearer(f"{key_id}.")), "malformed")


def test_a_credential_is_decided_on_the_event_loop_only_where_that_needs_no_io(demo_warehouse, idp, jwks_url, mint):
    """The search route decides a shared-secret token (or a missing one) on the event loop, and
    leaves what needs the warehouse (an API key) or the published keys (an asymmetric token) to a
    worker thread: ``at_hand`` answers None for those, never a guess."""
    from ragwarden.errors import AuthenticationError

    settings = AuthSettings(jwt_secret=JWT_SECRET, jwt_jwks=jwks_url, issuer=ISSUER, audience=AUDIENCE)
    authenticator = demo_warehouse.authenticator(settings)
    decided = authenticator.at_hand(f"Bearer {mint('alice')}")
    assert decided is not None and decided.subject == "user:alice" and decided.tenant == "acme"
    assert authenticator.at_hand(f"Bearer {idp.sign('rsa-1', claims())}") is None
    assert authenticator.at_hand("Bearer rwk_0123456789abcdef.secret") is None
    for refused_header in (None, "Basic xyz", "Bearer not-a-token"):
        with pytest.raises(AuthenticationError):
            authenticator.at_hand(refused_header)
    forged = jwt.encode(claims(), "not the shared secret, but as long as one", algorithm="HS256")
    with pytest.raises(AuthenticationError, match="signature"):
        authenticator.at_hand(f"Bearer {forged}")
