"""SCIM provisioning at /scim/v2: users and groups from the identity provider become memberships in
the caller's tenant, combine with the policy's own, and a removal closes every read path at the
next request, on every replica. Spoken to over HTTP as Okta and Microsoft Entra speak it."""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx2 import Client
from scim2_client.engines.httpx2 import SyncSCIMClient
from scim2_tester import Status, check_server
from support.live_server import serving
from support.readme import README_SERVICE, readme_block

from ragwarden.api.http import create_app
from ragwarden.config import Settings
from ragwarden.errors import PolicyError
from ragwarden.governance.policy import Policy
from ragwarden.warehouse import Warehouse

USER_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
BUDGET_QUERY = "quarterly budget review forecasts"


def _created(client: httpx.Client, endpoint: str, body: dict[str, Any]) -> str:
    response = client.post(endpoint, json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _user(client: httpx.Client, name: str, **attributes: Any) -> str:
    return _created(client, "/Users", {"schemas": [USER_SCHEMA], "userName": name, "active": True, **attributes})


def _group(client: httpx.Client, name: str, members: list[str]) -> str:
    return _created(client, "/Groups", {"schemas": [GROUP_SCHEMA], "displayName": name,
                                        "members": [{"value": member} for member in members]})  # fmt: skip


def _patch(client: httpx.Client, path: str, *operations: dict[str, Any]) -> httpx.Response:
    return client.patch(path, json={"schemas": [PATCH_SCHEMA], "Operations": list(operations)})


def _reads_budget(url: str, bearer: dict[str, str]) -> bool:
    """Whether the caller's search returns acme's budget (readable by group:finance only)."""
    response = httpx.post(f"{url}/v1/search", json={"query": BUDGET_QUERY, "k": 5}, headers=bearer, timeout=60)
    assert response.status_code == 200, response.text
    return "acme-budget" in {hit["doc_id"] for hit in response.json()["hits"]}


@pytest.mark.slow
def test_scim2_tester_finds_the_live_server_conformant(provisioning_service: str, okta: httpx.Client):
    """scim2-tester runs every check it has (discovery, create, read, replace, PATCH add, remove
    and replace on every attribute, delete, unknown URLs) for Users and Groups: all pass."""
    with Client(base_url=f"{provisioning_service}/scim/v2", headers=dict(okta.headers), timeout=60) as http:
        results = check_server(SyncSCIMClient(http))
    failed = [f"{r.title}: {r.reason}" for r in results if r.status not in (Status.SUCCESS, Status.COMPLIANT)]
    assert not failed, failed
    checked = collections.Counter(tag for r in results for tag in (r.tags or ()))
    for tag in ("discovery", "crud:create", "crud:read", "crud:update", "crud:delete", "patch:add", "patch:remove",
                "patch:replace"):  # fmt: skip
        assert checked[tag] > 0, f"no {tag} check ran: {dict(checked)}"
    assert {r.resource_type for r in results if getattr(r, "resource_type", None)} >= {"User", "Group"}


def test_a_provisioned_membership_opens_reads_and_an_okta_removal_closes_them_at_the_next_request(
    provisioning_service: str, okta: httpx.Client, bearer: Callable[..., dict[str, str]], provisionable_warehouse: Warehouse
):
    """zed is in no group of the policy. Provisioned into finance, zed reads finance's budget;
    Okta's removal (a PATCH with a filtered path) closes it for zed's very next search."""
    zed = bearer("zed")
    assert not _reads_budget(provisioning_service, zed)
    zed_id = _user(okta, "zed")
    finance = _group(okta, "finance", [zed_id])
    assert _reads_budget(provisioning_service, zed), "the provisioned membership opens finance's rows"
    (chunk,) = provisionable_warehouse.store.chunks.chunk_ids_of("acme-budget", "acme")
    assert httpx.get(f"{provisioning_service}/v1/chunks/{chunk}", headers=zed).status_code == 200
    removed = _patch(okta, f"/Groups/{finance}", {"op": "remove", "path": f'members[value eq "{zed_id}"]'})
    assert removed.status_code in (200, 204), removed.text
    assert not _reads_budget(provisioning_service, zed), "closed at the next request"
    assert httpx.get(f"{provisioning_service}/v1/chunks/{chunk}", headers=zed).status_code == 404, "by id too"
    added = _patch(okta, f"/Groups/{finance}", {"op": "add", "path": "members", "value": [{"value": zed_id}]})
    assert added.status_code in (200, 204), added.text
    assert _reads_budget(provisioning_service, zed)
    assert okta.delete(f"/Users/{zed_id}").status_code == 204
    assert not _reads_budget(provisioning_service, zed), "a deleted user's memberships count for nothing"
    assert okta.get(f"/Groups/{finance}").json().get("members", []) == [], "a deleted user leaves its groups"
    renamed = _patch(okta, f"/Groups/{finance}", {"op": "replace", "path": "externalId", "value": "fin-1"})
    assert renamed.status_code in (200, 204), "and the group takes updates again"


def test_a_removal_on_one_replica_closes_reads_on_another_at_its_next_request(
    provisionable_warehouse: Warehouse, okta: httpx.Client, bearer: Callable[..., dict[str, str]], auth_settings
):
    """A second replica (its own process state over the same warehouse) serves zed's searches;
    the membership it never saw being added or removed opens and closes there at once."""
    other = Warehouse(Settings(warehouse=provisionable_warehouse.uri), embedder=provisionable_warehouse.embedder)
    app = create_app(Settings(warehouse=other.uri, auth=auth_settings), warehouse=other, with_mcp=False)
    with serving(app) as replica:
        zed = bearer("zed")
        assert not _reads_budget(replica, zed)
        zed_id = _user(okta, "zed")
        finance = _group(okta, "finance", [zed_id])
        assert _reads_budget(replica, zed)
        replaced = okta.put(f"/Groups/{finance}", json={"schemas": [GROUP_SCHEMA], "displayName": "finance", "members": []})
        assert replaced.status_code == 200, replaced.text
        assert not _reads_budget(replica, zed)


def test_entra_style_patches_add_and_remove_members_and_deactivate_a_user(
    provisioning_service: str, scim_client: Callable[[str, str], httpx.Client], bearer: Callable[..., dict[str, str]],
    provisionable_warehouse: Warehouse,
):  # fmt: skip
    """Microsoft Entra capitalises its ops, removes members by listing them in ``value`` and
    deactivates with ``"False"`` as text: each works. A deactivated user is refused everything in
    the tenant, its own policy grants included, with the reason in its receipt."""
    entra = scim_client("service:entra", "globex")
    hank = bearer("hank", tenant="globex")  # the policy makes hank a member of globex's finance
    globex_search = {"query": "widget line warehouse Springfield", "k": 5}
    assert httpx.post(f"{provisioning_service}/v1/search", json=globex_search, headers=hank).status_code == 200
    hank_id, ivy_id = _user(entra, "hank"), _user(entra, "ivy")
    staff = _group(entra, "staff", [])
    ivy = bearer("ivy", tenant="globex")

    def ivy_reads_plan() -> bool:
        response = httpx.post(f"{provisioning_service}/v1/search", json=globex_search, headers=ivy, timeout=60)
        assert response.status_code == 200, response.text
        return "globex-plan" in {hit["doc_id"] for hit in response.json()["hits"]}

    assert not ivy_reads_plan()
    assert _patch(entra, f"/Groups/{staff}", {"op": "Add", "path": "members", "value": [{"value": ivy_id}]}).status_code == 204
    assert ivy_reads_plan()
    assert _patch(entra, f"/Groups/{staff}", {"op": "Remove", "path": "members", "value": [{"value": ivy_id}]}).status_code == 204
    assert not ivy_reads_plan()
    assert entra.get(f"/Groups/{staff}").json().get("members", []) == []

    deactivated = _patch(entra, f"/Users/{hank_id}", {"op": "Replace", "path": "active", "value": "False"})
    assert deactivated.status_code == 204, deactivated.text
    refused = httpx.post(f"{provisioning_service}/v1/search", json=globex_search, headers=hank)
    assert refused.status_code == 403
    assert "deactivated" in refused.json()["error"]["message"]
    receipt = provisionable_warehouse.audit.query(subject="user:hank", limit=1)[0]
    assert not receipt.allowed and "deactivated in globex by the identity provider" in receipt.reason
    (plan,) = provisionable_warehouse.store.chunks.chunk_ids_of("globex-plan", "globex")
    erin = "user:erin"  # globex's auditor asks about hank
    assert not provisionable_warehouse.explain(plan, subject="user:hank", caller=erin, tenant="globex").allowed
    assert provisionable_warehouse.access_review(subject="user:hank", caller=erin, tenant="globex").rows == 0
    assert _patch(entra, f"/Users/{hank_id}", {"op": "replace", "value": {"active": True}}).status_code == 204
    assert httpx.post(f"{provisioning_service}/v1/search", json=globex_search, headers=hank).status_code == 200


def test_provisioning_needs_the_provision_grant_and_stays_in_the_credentials_tenant(
    provisioning_service: str, okta: httpx.Client, scim_client: Callable[[str, str], httpx.Client],
    bearer: Callable[..., dict[str, str]], provisionable_warehouse: Warehouse,
):  # fmt: skip
    """No credential: 401, in SCIM's error shape; a user without ``provision``: 403, recorded; a
    provisioner of globex sees none of acme's users. The service provider configuration is public."""
    zed_id = _user(okta, "zed")
    scim = f"{provisioning_service}/scim/v2"
    assert httpx.get(f"{scim}/ServiceProviderConfig").status_code == 200
    anonymous = httpx.get(f"{scim}/Users")
    assert anonymous.status_code == 401 and anonymous.json()["schemas"] == ["urn:ietf:params:scim:api:messages:2.0:Error"]
    alice = httpx.get(f"{scim}/Users", headers=bearer("alice"))
    assert alice.status_code == 403 and "does not grant provision to user:alice in acme" in alice.json()["detail"]
    refusal = provisionable_warehouse.audit.query(subject="user:alice", limit=1)[0]
    assert (refusal.operation, refusal.allowed) == ("provision", False)
    entra = scim_client("service:entra", "globex")
    assert entra.get("/Users").json()["totalResults"] == 0
    assert entra.get(f"/Users/{zed_id}").status_code == 404
    assert entra.post("/Groups", json={"schemas": [GROUP_SCHEMA], "displayName": "finance",
                                       "members": [{"value": zed_id}]}).status_code == 400  # fmt: skip
    granted = provisionable_warehouse.audit.query(subject="service:okta", limit=1)[0]
    assert (granted.operation, granted.allowed, granted.tenant) == ("provision", True, "acme")
    assert granted.details == {"method": "POST", "path": "/Users", "status": 201}


def test_a_group_takes_only_users_of_its_tenant_as_members(okta: httpx.Client):
    """A member id naming no user, or a group (nesting), is refused naming it; nothing is stored."""
    ivy_id = _user(okta, "ivy")
    other = _group(okta, "auditors", [ivy_id])
    cases = {"no-such-user": "is not a user of this tenant", other: "a group's members are users"}
    for member, said in cases.items():
        member_type = "Group" if member == other else "User"
        response = okta.post("/Groups", json={"schemas": [GROUP_SCHEMA], "displayName": "finance",
                                              "members": [{"value": member, "type": member_type}]})  # fmt: skip
        assert response.status_code == 400 and said in response.json()["detail"] and member in response.json()["detail"]
    assert okta.get("/Groups", params={"filter": 'displayName eq "finance"'}).json()["totalResults"] == 0


def test_names_that_cannot_be_principals_are_refused_naming_them(okta: httpx.Client):
    """A userName or displayName that makes no principal (a control character) is refused with
    400 naming it; two groups naming one principal conflict (409) rather than merge silently."""
    bad_user = okta.post("/Users", json={"schemas": [USER_SCHEMA], "userName": "zed\u0007"})
    assert bad_user.status_code == 400 and "cannot name a ragwarden user" in bad_user.json()["detail"]
    bad_group = okta.post("/Groups", json={"schemas": [GROUP_SCHEMA], "displayName": "fin\u200bance"})
    assert bad_group.status_code == 400 and "cannot name a ragwarden group" in bad_group.json()["detail"]
    _group(okta, "finance", [])
    twin = okta.post("/Groups", json={"schemas": [GROUP_SCHEMA], "displayName": "group:finance"})
    assert twin.status_code == 409 and "group:finance is already provisioned" in twin.json()["detail"]
    _user(okta, "zed")
    twin = okta.post("/Users", json={"schemas": [USER_SCHEMA], "userName": "user:zed"})
    assert twin.status_code == 409 and "user:zed is already provisioned" in twin.json()["detail"]


def test_passwords_are_never_stored(okta: httpx.Client, provisionable_warehouse: Warehouse):
    """An identity provider that sends a password: the user is created, the password is nowhere."""
    zed_id = _user(okta, "zed", password="correct horse battery staple")
    assert "password" not in okta.get(f"/Users/{zed_id}").json()
    snapshot = provisionable_warehouse.store.directory.snapshot("acme")
    (stored,) = [row for row in snapshot.rows() if row.resource_id == zed_id]
    assert "correct horse" not in stored.body and "password" not in json.loads(stored.body)


def test_concurrent_member_additions_through_two_replicas_all_land(
    provisionable_warehouse: Warehouse, okta: httpx.Client, auth_settings
):
    """Eight PATCHes adding eight users to one group, at once, half through a second replica: a
    write planned from a snapshot another write changed is planned again, so none is lost."""
    other = Warehouse(Settings(warehouse=provisionable_warehouse.uri), embedder=provisionable_warehouse.embedder)
    app = create_app(Settings(warehouse=other.uri, auth=auth_settings), warehouse=other, with_mcp=False)
    users = [_user(okta, f"member-{n}") for n in range(8)]
    group = _group(okta, "crowd", [])
    with serving(app) as replica:
        second = httpx.Client(base_url=f"{replica}/scim/v2", headers=dict(okta.headers), timeout=120)
        answers: list[int] = []

        def add(client: httpx.Client, user: str) -> None:
            response = _patch(client, f"/Groups/{group}", {"op": "add", "path": "members", "value": [{"value": user}]})
            answers.append(response.status_code)

        threads = [threading.Thread(target=add, args=(second if n % 2 else okta, user)) for n, user in enumerate(users)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        second.close()
    assert answers == [204] * 8
    members = {member["value"] for member in okta.get(f"/Groups/{group}").json()["members"]}
    assert members == set(users)
    provisioned = {rule.values[0] for rule in provisionable_warehouse.policy.rules if rule.values[1:] == ("group:crowd", "acme")}
    assert provisioned == {f"user:member-{n}" for n in range(8)}


def test_explain_names_the_scim_group_a_membership_came_from(okta: httpx.Client, provisionable_warehouse: Warehouse):
    """Explain's membership path says the link from zed to finance is a provisioned group's, by id."""
    zed_id = _user(okta, "zed")
    finance = _group(okta, "finance", [zed_id])
    (chunk,) = provisionable_warehouse.store.chunks.chunk_ids_of("acme-budget", "acme")
    explanation = provisionable_warehouse.explain(chunk, subject="user:zed", tenant="acme")
    assert explanation.allowed
    assert f"SCIM group 'finance' (id {finance})" in json.dumps(explanation.as_dict())


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_an_unknown_resource_is_404_in_scims_shape(okta: httpx.Client, method: str):
    response = okta.request(method, "/Users/no-such-id")
    assert response.status_code == 404
    assert response.json()["schemas"] == ["urn:ietf:params:scim:api:messages:2.0:Error"]


def test_no_write_and_no_policy_can_nest_groups_past_the_limit_through_a_provisioned_membership(
    okta: httpx.Client, provisionable_warehouse: Warehouse, bearer: Callable[..., dict[str, str]],
    provisioning_service: str, provisioning_policy: Path, tmp_path: Path,
):  # fmt: skip
    """A membership that would make a chain deeper than Casbin resolves would fail every later
    request, so neither side may make one: the SCIM write is refused (400, naming why) while a
    policy nests nine deep, and a policy nesting nine deep is refused while the membership exists."""
    chain = "".join(f"g, group:g{n}, group:g{n + 1}, acme\n" for n in range(9))
    deep = tmp_path / "deep.csv"
    deep.write_text(provisioning_policy.read_text() + chain)
    zed_id = _user(okta, "zed")
    innermost = _group(okta, "g0", [])
    provisionable_warehouse.install_policy(deep)
    refused = _patch(okta, f"/Groups/{innermost}", {"op": "add", "path": "members", "value": [{"value": zed_id}]})
    assert refused.status_code == 400 and "nest" in refused.json()["detail"], refused.text
    assert okta.get(f"/Groups/{innermost}").json().get("members", []) == []
    assert _reads_budget(provisioning_service, bearer("alice")), "the service goes on serving"

    provisionable_warehouse.install_policy(provisioning_policy)  # back to the shallow policy
    assert _patch(okta, f"/Groups/{innermost}", {"op": "add", "path": "members", "value": [{"value": zed_id}]}).status_code == 204
    with pytest.raises(PolicyError, match="provisioned memberships cannot be combined"):
        provisionable_warehouse.install_policy(deep)

    # Were a write and an install to race past both checks, only that tenant would be refused,
    # everything but provisioning and administration, which can put it right.
    provisionable_warehouse.store.policies.install(Policy.from_file(deep))
    refused = httpx.post(f"{provisioning_service}/v1/search", json={"query": BUDGET_QUERY}, headers=bearer("alice"))
    assert refused.status_code == 403 and "provisioned in acme cannot be combined" in refused.json()["error"]["message"]
    globex = httpx.post(f"{provisioning_service}/v1/search", json={"query": BUDGET_QUERY}, headers=bearer("hank", tenant="globex"))
    assert globex.status_code == 200, "another tenant is served"
    assert _patch(okta, f"/Groups/{innermost}", {"op": "remove", "path": "members"}).status_code == 204
    assert _reads_budget(provisioning_service, bearer("alice")), "the membership removed, acme is served again"


def test_the_readme_example_provisions_zed_into_finance_and_takes_it_back(
    provisioning_service: str, okta: httpx.Client, mint: Callable[..., str], capsys: pytest.CaptureFixture[str]
):
    source = readme_block("okta_key")
    assert README_SERVICE in source
    namespace: dict[str, Any] = {"okta_key": okta.headers["Authorization"].removeprefix("Bearer "), "zed_token": mint("zed")}
    exec(compile(source.replace(README_SERVICE, provisioning_service), "README.md", "exec"), namespace)  # noqa: S102 - our README
    first, second = capsys.readouterr().out.splitlines()
    assert "acme-budget" in first and "acme-budget" not in second and "acme-memo" in second


def test_users_are_listed_with_a_filter_and_in_pages_with_their_total(okta: httpx.Client):
    for n in range(5):
        _user(okta, f"pager-{n}")
    _user(okta, "someone-else")
    page = okta.get("/Users", params={"filter": 'userName sw "pager-"', "sortBy": "userName", "startIndex": 3, "count": 2})
    assert page.status_code == 200, page.text
    body = page.json()
    assert (body["totalResults"], body["startIndex"], body["itemsPerPage"]) == (5, 3, 2)
    assert [user["userName"] for user in body["Resources"]] == ["pager-2", "pager-3"]
