"""States of a warehouse provisioned over SCIM: the policy grants provisioning, a service serves it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from ragwarden.api_keys import api_keys_at
from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse

PROVISIONING_LINES = """
p, service:okta, acme, provision, execute, allow
p, service:entra, globex, provision, execute, allow
p, user:erin, globex, audit, read, allow
"""


@pytest.fixture
def provisioning_policy(tmp_path: Path) -> Path:
    """The demo policy, also granting ``provision`` to service:okta in acme and service:entra in
    globex, and ``audit`` in globex to user:erin."""
    policy = tmp_path / "provisioning.csv"
    policy.write_text(policy_file("demo.csv").read_text() + PROVISIONING_LINES)
    return policy


@pytest.fixture
def provisionable_warehouse(small_warehouse: Warehouse, provisioning_policy: Path) -> Warehouse:
    """SMALL_CORPUS under the provisioning policy."""
    small_warehouse.install_policy(provisioning_policy)
    return small_warehouse


@pytest.fixture
def provisioning_service(provisionable_warehouse: Warehouse, serve: Callable[..., str]) -> str:
    """The provisionable warehouse served on 127.0.0.1."""
    return serve(provisionable_warehouse)


@pytest.fixture
def scim_client(provisioning_service: str, provisionable_warehouse: Warehouse) -> Iterator[Callable[[str, str], httpx.Client]]:
    """A SCIM client of the provisioning service holding an API key: scim_client("service:okta", "acme")."""
    keys = api_keys_at(provisionable_warehouse.uri)
    clients: list[httpx.Client] = []

    def client(subject: str, tenant: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {keys.create(subject=subject, tenant=tenant)}"}
        clients.append(httpx.Client(base_url=f"{provisioning_service}/scim/v2", headers=headers, timeout=60))
        return clients[-1]

    yield client
    for made in clients:
        made.close()


@pytest.fixture
def okta(scim_client: Callable[[str, str], httpx.Client]) -> httpx.Client:
    """The identity provider provisioning tenant acme (service:okta, granted provision there)."""
    return scim_client("service:okta", "acme")
