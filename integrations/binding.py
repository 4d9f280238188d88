"""How a framework retriever reaches ragwarden for one caller: in process, or over the HTTP service.

Both ways search as a single subject in a single tenant, so the framework only ever sees what that
caller may read. The identity comes from a verified credential whenever one is given; naming a
subject directly is for applications that embed the warehouse and have authenticated the user
themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from ..errors import ConfigurationError, NotFoundError, WarehouseError, error_of, error_of_status
from ..governance.caller import Identity
from ..retrieval.collapse import Collapse, GroupBy
from ..retrieval.narrowing import narrowing
from ..retrieval.search import Mode
from ..warehouse import Warehouse

SEARCH_PATH = "/v1/search"
INGEST_PATH = "/v1/ingest"
FORGET_PATH = "/v1/forget"


@dataclass(frozen=True, kw_only=True)
class Written:
    """What a store's write did: the ids written (or found unchanged) and each record refused."""

    ids: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]  # (source, reason)


class Binding(Protocol):
    """Acts on behalf of one caller; each hit is a ``Hit.as_dict()`` (the HTTP ``HitModel`` shape).
    ``options`` carries what every search carries besides the query and k."""

    options: SearchOptions

    def search(self, query: str, k: int) -> list[dict[str, Any]]: ...

    async def asearch(self, query: str, k: int) -> list[dict[str, Any]]: ...

    def ingest(self, records: list[dict[str, Any]], *, restore_erased: bool = False) -> Written: ...

    def forget(self, doc_id: str, *, reason: str) -> bool: ...


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """What every search of a retriever carries besides the query and k."""

    mode: Mode = "vector"
    purpose: str | None = None
    group_by: GroupBy | None = None  # "doc": at most per_group chunks of one document
    per_group: int = 1
    distinct: bool = False  # one chunk of each text
    filter: Mapping[str, Any] | None = None  # only chunks matching it (``retrieval.narrowing``)

    def __post_init__(self) -> None:
        # refused here, at construction
        Collapse(group_by=self.group_by, per_group=self.per_group, distinct=self.distinct)
        narrowing(self.filter)

    def arguments(self) -> dict[str, Any]:
        """The collapse and filter arguments of a search (only those set, so an older service is not
        sent new fields)."""
        given = {"group_by": self.group_by, "per_group": self.per_group, "distinct": self.distinct,
                 "filter": dict(self.filter) if self.filter else None}  # fmt: skip
        defaults = {"group_by": None, "per_group": 1, "distinct": False, "filter": None}
        return {name: value for name, value in given.items() if value != defaults[name]}


@dataclass(frozen=True, kw_only=True)
class InProcess:
    """Search a warehouse opened in this process, as the caller ``identity()`` names at each search
    (a token is verified every time, so an expired or revoked one stops working)."""

    warehouse: Warehouse
    identity: Callable[[], Identity] = field(repr=False)
    options: SearchOptions

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        caller = self.identity()
        hits = self.warehouse.search(
            query,
            subject=caller.subject,
            tenant=caller.tenant,
            actor=caller.actor,
            k=k,
            mode=self.options.mode,
            purpose=self.options.purpose,
            **self.options.arguments(),
        )
        return [hit.as_dict() for hit in hits]

    async def asearch(self, query: str, k: int) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.search, query, k)

    def ingest(self, records: list[dict[str, Any]], *, restore_erased: bool = False) -> Written:
        caller = self.identity()
        report = self.warehouse.ingest_records(records, subject=caller.subject, tenant=caller.tenant, actor=caller.actor,
                                               restore_erased=restore_erased)  # fmt: skip
        return Written(ids=tuple(report.written), refused=tuple((r.source, r.reason) for r in report.rejected))

    def forget(self, doc_id: str, *, reason: str) -> bool:
        caller = self.identity()
        try:
            self.warehouse.forget(doc_id, reason=reason, subject=caller.subject, tenant=caller.tenant, actor=caller.actor)
        except NotFoundError:
            return False
        return True


@dataclass(frozen=True, kw_only=True)
class OverHttp:
    """Search a ragwarden service at ``url`` with a bearer credential; the service decides who that is."""

    url: str
    token: str = field(repr=False)
    options: SearchOptions
    timeout: float = 30.0

    def _request(self, query: str, k: int) -> dict[str, Any]:
        body = {"query": query, "k": k, "mode": self.options.mode, **self.options.arguments()}
        if self.options.purpose is not None:
            body["purpose"] = self.options.purpose
        return {
            "url": self.url.rstrip("/") + SEARCH_PATH,
            "json": body,
            "headers": {"Authorization": f"Bearer {self.token}"},
        }

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        """A transport failure as a ``WarehouseError`` naming the service."""
        try:
            yield
        except httpx.HTTPError as exc:
            raise WarehouseError(f"cannot reach the ragwarden service at {self.url}: {exc}") from None

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        with self._reaching(), httpx.Client(timeout=self.timeout) as client:
            return _hits(client.post(**self._request(query, k)))

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._reaching(), httpx.Client(timeout=self.timeout) as client:
            response = client.post(self.url.rstrip("/") + path, json=body, headers={"Authorization": f"Bearer {self.token}"})
        return _answer(response, lambda answer: True)

    def ingest(self, records: list[dict[str, Any]], *, restore_erased: bool = False) -> Written:
        sendable = [{**r, "vector": r["vector"].tolist()} if hasattr(r.get("vector"), "tolist") else r for r in records]
        answer = self._post(INGEST_PATH, {"records": sendable, "restore_erased": restore_erased})
        return Written(ids=tuple(answer["written"]), refused=tuple((r["source"], r["reason"]) for r in answer["rejected"]))

    def forget(self, doc_id: str, *, reason: str) -> bool:
        try:
            self._post(FORGET_PATH, {"doc_id": doc_id, "reason": reason})
        except NotFoundError:
            return False
        return True

    async def asearch(self, query: str, k: int) -> list[dict[str, Any]]:
        with self._reaching():
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                return _hits(await client.post(**self._request(query, k)))


def _hits(response: httpx.Response) -> list[dict[str, Any]]:
    """The hits of a search answer (``_answer``)."""
    return list(_answer(response, lambda body: isinstance(body.get("hits"), list))["hits"])


def _answer(response: httpx.Response, expected: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The service's answer if it is one (``expected`` of it), or its error raised as the
    ragwarden error it maps from (by the service's error code, else by status, for an answer from a
    proxy in between)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.is_success and isinstance(body, dict) and expected(body):
        return body
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        raise error_of(error["code"], str(error.get("message", "")))
    raise error_of_status(
        response.status_code,
        f"the service answered {response.status_code} without a ragwarden answer: {response.text[:200]!r}",
    )


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
    token = token.strip() if token is not None else None
    if (warehouse is None) == (url is None):
        raise ConfigurationError(
            "give either warehouse= (in process) or url= (a ragwarden service), not both or neither"
        )
    if token is not None and (subject is not None or tenant is not None or actor is not None):
        raise ConfigurationError("the token says who the caller is: drop subject=, tenant= and actor=")
    if url is not None:
        if token is None:
            raise ConfigurationError(f"url={url!r} needs token= (a JWT or an API key of the user to search as)")
        return OverHttp(url=url, token=token, options=options)
    assert warehouse is not None
    if token is not None:
        authenticator = warehouse.authenticator()
        authenticator.verify(token)  # a bad token is refused now, not at the first search

        def verified() -> Identity:
            return authenticator.verify(token)

        return InProcess(warehouse=warehouse, identity=verified, options=options)
    if subject is None or tenant is None:
        raise ConfigurationError("name the caller: token=, or subject= and tenant= (and actor= for an agent)")
    named = Identity(subject=subject, tenant=tenant, actor=actor)
    return InProcess(warehouse=warehouse, identity=lambda: named, options=options)


def hit_metadata(hit: dict[str, Any]) -> dict[str, Any]:
    """A hit's governance and citation, as framework metadata: everything but the text.

    The source record's own metadata comes first, so a chain reads ``metadata["title"]``; what
    ragwarden says of the row is laid over it, so a record's metadata can never pose as a label
    or a reason. ``source`` is the source URI (LangChain's convention); ``lineage`` gathers where
    the row comes from (document, version, source, parents); ``reason`` says why the caller
    could see it.
    """
    return {
        **hit.get("metadata", {}),
        "source": hit["source_uri"],
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


def with_options(binding: Binding, **changes: Any) -> Binding:
    """``binding`` with its search options changed for one call (``filter=``, ``mode=``)."""
    return dataclasses.replace(binding, options=dataclasses.replace(binding.options, **changes))  # type: ignore[type-var]
