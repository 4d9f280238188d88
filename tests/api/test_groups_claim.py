"""A groups claim, off by default: when the service trusts it, the groups a token names are the
caller's for that request, beside the policy's own memberships; explain says where each came from."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.live_server import serving
from support.mcp_clients import mcp_over_http
from support.readme import README_SERVICE, readme_block

from ragwarden.api.http import create_app
from ragwarden.config import AuthSettings, Settings
from ragwarden.errors import ConfigurationError, InvalidRequestError
from ragwarden.governance.caller import Identity
from ragwarden.warehouse import Warehouse

FINANCE_QUERY = "quarterly budget forecast"


@pytest.fixture
def trusting(auth_settings: AuthSettings) -> AuthSettings:
    """The test identity provider's tokens, their ``groups`` claim trusted."""
    return AuthSettings(jwt_secret=auth_settings.jwt_secret, issuer=auth_settings.issuer,
                        audience=auth_settings.audience, groups_claim="groups")  # fmt: skip


@pytest.fixture
def trusting_service(demo_warehouse: Warehouse, trusting: AuthSettings) -> Iterator[str]:
    """The demo warehouse served (API and MCP) by a service that trusts the tokens' ``groups`` claim."""
    with serving(create_app(Settings(warehouse=demo_warehouse.uri, auth=trusting), warehouse=demo_warehouse)) as url:
        yield url


def _finance_docs(url: str, token: str) -> set[str]:
    response = httpx.post(f"{url}/v1/search", json={"query": FINANCE_QUERY, "k": 20},
                          headers={"Authorization": f"Bearer {token}"}, timeout=30)  # fmt: skip
    assert response.status_code == 200, response.text
    return {hit["doc_id"] for hit in response.json()["hits"] if hit["doc_id"].startswith("acme-fin-")}


def test_a_trusted_claim_makes_its_groups_the_callers_for_that_request(
    trusting_service: str, demo_service_url: str, mint: Callable[..., str], demo_warehouse: Warehouse
):
    """zed is in no group of the policy; a token naming finance reads finance's rows, until the
    next token names none (nothing is stored); a service that does not trust the claim ignores it."""
    claimed = mint("zed", groups=["finance"])
    assert _finance_docs(trusting_service, claimed), "finance's rows, read through the claimed group"
    assert _finance_docs(trusting_service, mint("zed")) == set(), "the next token claims nothing: closed at once"
    assert _finance_docs(demo_service_url, claimed) == set(), "a service that does not trust the claim ignores it"
    receipt = demo_warehouse.audit.query(subject="user:zed", limit=3)[2]
    assert receipt.policy_version is not None and "+groups-" in receipt.policy_version
    assert receipt.details["claimed_groups"] == ["group:finance"]


@pytest.mark.anyio
async def test_an_agent_over_mcp_reads_through_its_users_claimed_groups(trusting_service: str, mint: Callable[..., str]):
    async with mcp_over_http(trusting_service, mint("zed", act="agent:notes", groups=["finance"])) as agent:
        claimed = await agent.call_tool("search", {"query": FINANCE_QUERY, "k": 20})
    async with mcp_over_http(trusting_service, mint("zed", act="agent:notes")) as agent:
        unclaimed = await agent.call_tool("search", {"query": FINANCE_QUERY, "k": 20})
    assert claimed.structured_content is not None and unclaimed.structured_content is not None
    assert any(hit["doc_id"].startswith("acme-fin-") for hit in claimed.structured_content["hits"])
    assert not any(hit["doc_id"].startswith("acme-fin-") for hit in unclaimed.structured_content["hits"])


def test_what_a_claimed_group_reads_is_what_the_policy_grants_that_group(
    trusting_service: str, mint: Callable[..., str], demo_warehouse: Warehouse
):
    """The oracle: alice holds finance by the policy's own lines; zed by the claim alone."""
    body = {"query": FINANCE_QUERY, "k": 50}
    as_zed = httpx.post(f"{trusting_service}/v1/search", json=body, timeout=30,
                        headers={"Authorization": f"Bearer {mint('zed', groups=['group:finance', 'group:staff'])}"})
    as_member = demo_warehouse.policy.principals("user:olivia", "acme")  # type: ignore[union-attr]
    assert as_member >= {"group:finance", "group:staff"}, "olivia is in finance and staff by the policy"
    hits = [(hit["doc_id"], hit["labels"], hit["classification"]) for hit in as_zed.json()["hits"]]
    olivia = demo_warehouse.search(FINANCE_QUERY, subject="user:olivia", tenant="acme", k=50)
    assert any(doc.startswith("acme-fin-") for doc, _, _ in hits)
    assert {doc for doc, _, _ in hits} <= {hit.doc_id for hit in olivia}  # never more than a member reads


def test_explain_names_the_token_as_where_a_membership_came_from(trusting_service: str, mint: Callable[..., str],
                                                                  demo_warehouse: Warehouse):  # fmt: skip
    chunk_id = demo_warehouse.store.chunks.chunk_ids_of("acme-fin-001")[0]
    token = mint("zed", groups=["fpa"])
    answer = httpx.get(f"{trusting_service}/v1/chunks/{chunk_id}/explain", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    details = " ".join(step["detail"] for step in answer.json()["steps"])
    assert "user:zed -> group:fpa (the token's groups claim) -> group:finance (policy line 22)" in details


@pytest.mark.parametrize(
    ("claim", "status", "named"),
    [
        ("finance", 401, "must be a list of group names"),
        ([1, 2], 401, "must be a list of group names"),
        (["user:admin"], 200, None),  # a map or plain name only ever makes group: principals
        ([""], 401, "refused"),
    ],
)
def test_a_claim_that_is_not_a_list_of_group_names_is_refused(
    trusting_service: str, mint: Callable[..., str], claim: Any, status: int, named: str | None
):
    response = httpx.get(f"{trusting_service}/v1/whoami", headers={"Authorization": f"Bearer {mint('zed', groups=claim)}"}, timeout=30)
    assert response.status_code == status, response.text
    if named is not None:
        assert named in response.json()["error"]["message"]
    else:
        assert response.json()["groups"] == ["group:user:admin"]


def test_a_prefix_map_renames_the_identity_providers_groups_and_ignores_the_rest(
    serve: Callable[..., str], demo_warehouse: Warehouse, trusting: AuthSettings, mint: Callable[..., str]
):
    mapped = replace(trusting, groups_map={"okta-": "group:"})
    url = serve(demo_warehouse, auth=mapped)
    token = mint("zed", groups=["okta-finance", "Everyone", "group:admins", "okta-staff"])
    who = httpx.get(f"{url}/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=30).json()
    assert who["groups"] == ["group:finance", "group:staff"], "with a map, group:admins is not the provider's to name"


def test_a_map_that_could_make_anything_but_a_group_is_refused_at_start():
    with pytest.raises(ConfigurationError, match="must map to group: prefixes"):
        AuthSettings.from_env({"RAGWARDEN_JWT_GROUPS_CLAIM": "groups", "RAGWARDEN_JWT_GROUPS_MAP": '{"a-": "user:"}'})
    with pytest.raises(ConfigurationError, match="needs RAGWARDEN_JWT_GROUPS_CLAIM"):
        AuthSettings(groups_map={"a-": "group:"})


def test_claimed_memberships_that_would_nest_too_deep_are_refused_not_half_honoured(
    serve: Callable[..., str], demo_policy_warehouse: Warehouse, trusting: AuthSettings, mint: Callable[..., str],
    tmp_path: Path,
):  # fmt: skip
    chain = "\n".join(f"g, group:l{n}, group:l{n + 1}, acme" for n in range(9))
    deep = tmp_path / "deep.csv"
    deep.write_text(f"{chain}\np, group:l9, acme, classification:public, read, allow\n", encoding="utf-8")
    demo_policy_warehouse.install_policy(deep)
    url = serve(demo_policy_warehouse, auth=trusting)
    response = httpx.post(f"{url}/v1/search", json={"query": "q"}, timeout=30,
                          headers={"Authorization": f"Bearer {mint('zed', groups=['l0'])}"})  # fmt: skip
    assert response.status_code == 403 and "cannot be honoured" in response.json()["error"]["message"], response.text


def test_an_identity_can_only_carry_group_principals():
    for wrong in ({"user:bob"}, {"everyone"}, {"group:"}):
        with pytest.raises(InvalidRequestError, match="refused"):
            Identity(subject="user:alice", tenant="acme", groups=frozenset(wrong))
    with pytest.raises(InvalidRequestError, match="frozenset"):
        Identity(subject="user:alice", tenant="acme", groups="group:finance")  # type: ignore[arg-type]


def test_the_readme_example_reads_through_the_tokens_groups(trusting_service: str, mint: Callable[..., str],
                                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    source = readme_block("RAGWARDEN_JWT_GROUPS_CLAIM")
    assert README_SERVICE in source
    namespace: dict[str, Any] = {"zed_token": mint("zed", groups=["fpa"])}
    exec(compile(source.replace(README_SERVICE, trusting_service), "README.md", "exec"), namespace)  # noqa: S102 - our README
    printed = capsys.readouterr().out
    assert namespace["hits"] and namespace["hits"][0]["doc_id"].startswith("acme-fin-")
    assert "(the token's groups claim)" in printed
