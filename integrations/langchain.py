"""LangChain: ``WardenRetriever``, a ``BaseRetriever`` that searches ragwarden as one caller.

    retriever = WardenRetriever(warehouse=ragwarden.open(), subject="user:alice", tenant="acme", k=4)
    retriever = WardenRetriever(url="https://rag.example", token=user_token)   # over the service

Each ``Document`` carries the chunk's id, labels, classification, lineage and the reason it was
visible in ``metadata``, so a chain can cite it and label what it writes from it.
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, model_validator

from ..errors import InvalidRequestError
from ..retrieval.collapse import GroupBy
from ..retrieval.search import MAX_K, Mode
from ..warehouse import Warehouse
from .binding import Binding, SearchOptions, bind, hit_metadata
from .options import DEFAULT_K, check_k, requested_k

__all__ = ["WardenRetriever"]


class WardenRetriever(BaseRetriever):
    """The top ``k`` chunks the bound caller may read, as LangChain ``Document``s.

    Bind it with ``warehouse=`` (in process) or ``url=`` (a ragwarden service), and name the caller
    with ``token=`` (a JWT or API key, verified) or, in process only, ``subject=`` and ``tenant=``.
    ``invoke(query, k=n)`` overrides ``k`` for one call. ``search_kwargs={"filter": {...}}`` (or
    ``filter=``) narrows every search to chunks matching it, as LangChain's vector store
    retrievers do; ``search_kwargs={"k": n}`` sets ``k``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    warehouse: Warehouse | None = None
    url: str | None = None
    token: SecretStr | None = None
    subject: str | None = None
    tenant: str | None = None
    actor: str | None = None
    k: int = Field(DEFAULT_K, ge=1, le=MAX_K)
    mode: Mode = "vector"
    purpose: str | None = None
    group_by: GroupBy | None = None
    per_group: int = 1
    distinct: bool = False
    filter: dict[str, Any] | None = None
    search_kwargs: dict[str, Any] = Field(default_factory=dict)

    _bound: tuple[tuple[Any, ...], Binding] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_binding(self) -> WardenRetriever:
        unknown = sorted(set(self.search_kwargs) - {"filter", "k"})
        if unknown:
            raise InvalidRequestError(f"search_kwargs {unknown} are not understood here; give filter or k")
        if "k" in self.search_kwargs:
            self.k = check_k(self.search_kwargs["k"])
        if self.filter is not None and self.search_kwargs.get("filter") not in (None, self.filter):
            raise InvalidRequestError("filter is given twice (filter= and search_kwargs['filter']) with different values; give one")
        self._binding()  # a contradiction or a refused token fails here, at construction
        return self

    def _binding(self) -> Binding:
        """The binding of the fields as they are now: a copy or an assignment that changes whom or
        how it searches gets a new one (and a token given anew is verified anew)."""
        token = self.token.get_secret_value() if self.token is not None else None
        fields = (id(self.warehouse), self.url, token, self.subject, self.tenant, self.actor, self.mode, self.purpose,
                  self.group_by, self.per_group, self.distinct, repr(self._filter()))  # fmt: skip
        if self._bound is None or self._bound[0] != fields:
            binding = bind(
                warehouse=self.warehouse,
                url=self.url,
                token=token,
                subject=self.subject,
                tenant=self.tenant,
                actor=self.actor,
                options=SearchOptions(mode=self.mode, purpose=self.purpose, group_by=self.group_by,
                                      per_group=self.per_group, distinct=self.distinct, filter=self._filter()),
            )
            self._bound = (fields, binding)
        return self._bound[1]

    def _filter(self) -> dict[str, Any] | None:
        return self.filter if self.filter is not None else self.search_kwargs.get("filter")

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        return [_document(hit) for hit in self._binding().search(query, requested_k(self.k, kwargs))]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        return [_document(hit) for hit in await self._binding().asearch(query, requested_k(self.k, kwargs))]


def _document(hit: dict[str, Any]) -> Document:
    return Document(id=hit["chunk_id"], page_content=hit["text"], metadata=hit_metadata(hit))
