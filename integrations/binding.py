"""How a framework retriever reaches ragwarden for one caller: in process, or over the HTTP service.

Both ways search as a single subject in a single tenant, so the framework only ever sees what that
caller may read. The identity comes from a verified credential whenever one is given; naming a
subject directly is for applications that embed the warehouse and have authenticated the user
themselves.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from ..api.auth import Identity, authenticator_for
from ..api.http_errors import error_of
from ..errors import ConfigurationError, RagwardenError
from ..warehouse import Warehouse

SEARCH_PATH = "/v1/search"


class Binding(Protocol):
    """Searches on behalf of one caller; each hit is a ``Hit.as_dict()`` (the HTTP ``HitModel`` shape)."""

    def search(self, query: str, k: int) -> list[dict[str, Any]]: ...

    async def asearch(self, query: str, k: int) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """What every search of a retriever carries besides the query and k."""

    mode: str = "vector"
    purpose: str | None = None


@dataclass(frozen=True, kw_only=True)
class InProcess:
    """Search a warehouse opened in this process, as ``identity``."""

    warehouse: Warehouse
    identity: Identity
    options: SearchOptions

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        hits = self.warehouse.search(
            query,
            subject=self.identity.subject,
            tenant=self.identity.tenant,
            actor=self.identity.actor,
            k=k,
            mode=self.options.mode,
            purpose=self.options.purpose,
        )
        return [hit.as_dict() for hit in hits]

    async def asearch(self, query: str, k: int) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.search, query, k)


@dataclass(frozen=True, kw_only=True)
class OverHttp:
    """Search a ragwarden service at ``url`` with a bearer credential; the service decides who that is."""

    url: str
    token: str
    options: SearchOptions
    timeout: float = 30.0

    def _request(self, query: str, k: int) -> dict[str, Any]:
        body = {"query": query, "k": k, "mode": self.options.mode}
        if self.options.purpose is not None:
            body["purpose"] = self.options.purpose
        return {"url": self.url.rstrip("/") + SEARCH_PATH, "json": body, "headers": {"Authorization": f"Bearer {self.token}"}}

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        with httpx.Client(timeout=self.timeout) as client:
            return _hits(client.post(**self._request(query, k)))

    async def asearch(self, query: str, k: int) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            return _hits(await client.post(**self._request(query, k)))


def _hits(response: httpx.Response) -> list[dict[str, Any]]:
    """The hits of a search answer, or the service's error raised as the ragwarden error it maps from."""
    try:
        body = response.json()
    except ValueError:
        raise RagwardenError(f"the service answered {response.status_code} with no JSON body") from None
    if response.is_success:
        return list(body["hits"])
    error = body.get("error", {}) if isinstance(body, dict) else {}
    raise error_of(str(error.get("code", "")), str(error.get("message", f"HTTP {response.status_code}")))


def bind(
    *,
    warehouse: Warehouse | None,
    url: str | None,
    token: str | None,
    subject: str | None,
    tenant: str | None,
    actor: str | None,
    options: SearchOptions,
) -> Binding:
    """The binding a retriever's settings describe; a contradiction is refused, never guessed at."""
    if (warehouse is None) == (url is None):
        raise ConfigurationError("give either warehouse= (in process) or url= (a ragwarden service), not both or neither")
    if token is not None and (subject is not None or tenant is not None or actor is not None):
        raise ConfigurationError("the token says who the caller is: drop subject=, tenant= and actor=")
    if url is not None:
        if token is None:
            raise ConfigurationError(f"url={url!r} needs token= (a JWT or an API key of the user to search as)")
        return OverHttp(url=url, token=token, options=options)
    assert warehouse is not None
    if token is not None:
        return InProcess(warehouse=warehouse, identity=authenticator_for(warehouse).verify(token), options=options)
    if subject is None or tenant is None:
        raise ConfigurationError("name the caller: token=, or subject= and tenant= (and actor= for an agent)")
    return InProcess(warehouse=warehouse, identity=Identity(subject=subject, tenant=tenant, actor=actor), options=options)


def hit_metadata(hit: dict[str, Any]) -> dict[str, Any]:
    """A hit's governance and citation, as framework metadata: everything but the text.

    ``lineage`` gathers where the row comes from (document, version, source, parents); ``reason``
    says why the caller could see it.
    """
    return {
        "chunk_id": hit["chunk_id"],
        "doc_id": hit["doc_id"],
        "score": hit["score"],
        "labels": list(hit["labels"]),
        "classification": hit["classification"],
        "reason": hit["reason"],
        "kind": hit["kind"],
        "lineage": {
            "doc_id": hit["doc_id"],
            "doc_version": hit["doc_version"],
            "source_uri": hit["source_uri"],
            "position": hit["position"],
            "parents": list(hit["parents"]),
        },
        "table_version": hit["table_version"],
        "policy_version": hit["policy_version"],
    }
