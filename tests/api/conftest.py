"""Fixtures for the services: credentials, and the demo warehouse served on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import jwt
import pytest
from support.identity_provider import AUDIENCE, ISSUER, JWT_SECRET
from support.live_server import serving

from ragwarden.api.http import create_app
from ragwarden.config import AuthSettings, Settings
from ragwarden.warehouse import Warehouse



@pytest.fixture(scope="session")
def auth_settings() -> AuthSettings:
    """HS256 tokens from the test identity provider."""
    return AuthSettings(jwt_secret=JWT_SECRET, issuer=ISSUER, audience=AUDIENCE)


@pytest.fixture(scope="session")
def mint() -> Callable[..., str]:
    """Mint a token: mint("alice", tenant="acme", act="agent:x", exp=..., key=..., algorithm=...);
    any other keyword overrides or (as None) removes a claim."""

    def build(sub: str, *, tenant: str = "acme", act: str | None = None, key: Any = JWT_SECRET,
              algorithm: str = "HS256", headers: dict[str, Any] | None = None, **claims: Any) -> str:
        now = int(time.time())
        payload: dict[str, Any] = {"sub": sub, "tenant": tenant, "iss": ISSUER, "aud": AUDIENCE,
                                   "iat": now, "nbf": now, "exp": now + 600}
        if act:
            payload["act"] = {"sub": act}
        for name, value in claims.items():
            if value is None:
                payload.pop(name, None)
            else:
                payload[name] = value
        return jwt.encode(payload, key, algorithm=algorithm, headers=headers)

    return build  # fmt: skip


@pytest.fixture(scope="session")
def demo_service_url(demo_warehouse: Warehouse, auth_settings: AuthSettings) -> Iterator[str]:
    """The demo warehouse served over HTTP (API and MCP) on 127.0.0.1, for the whole run."""
    settings = Settings(warehouse=demo_warehouse.uri, auth=auth_settings)
    with serving(create_app(settings, warehouse=demo_warehouse)) as url:
        yield url


@pytest.fixture
def as_user(demo_service_url: str, mint: Callable[..., str]) -> Iterator[Callable[..., httpx.Client]]:
    """An HTTP client for a demo user: as_user("alice"), as_user("carol", act="agent:notes")."""
    clients: list[httpx.Client] = []

    def client(sub: str, **token_claims: Any) -> httpx.Client:
        made = httpx.Client(base_url=demo_service_url, headers={"Authorization": f"Bearer {mint(sub, **token_claims)}"}, timeout=60)
        clients.append(made)
        return made

    yield client
    for made in clients:
        made.close()
