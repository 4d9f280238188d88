"""The SDK's own MCP client against a live server's streamable HTTP endpoint, as an agent uses it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client


@asynccontextmanager
async def mcp_over_http(url: str, token: str, **options: Any) -> AsyncIterator[Client]:
    """A client session with ``url``'s ``/mcp/`` endpoint, carrying ``token`` on every request."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        Client(streamable_http_client(f"{url}/mcp/", http_client=http), **options) as client,
    ):
        yield client
