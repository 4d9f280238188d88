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

from ..retrieval.collapse import GroupBy
from ..retrieval.search import MAX_K, Mode
from ..warehouse import Warehouse
from .binding import Binding, SearchOptions, bind, hit_metadata
from .options import DEFAULT_K, requested_k

__all__ = ["WardenRetriever"]


class WardenRetriever(BaseRetriever):
    """The top ``k`` chunks the bound caller may read, as LangChain ``Document``s.

    Bind it with ``warehouse=`` (in process) or ``url=`` (a ragwarden service), and name the caller
    with ``token=`` (a JWT or API key, verified) or, in process only, ``subject=`` and ``tenant=``.
    ``invoke(query, k=n)`` overrides ``k`` for one call.
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

    _bound: tuple[tuple[Any, ...], Binding] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_binding(self) -> WardenRetriever:
        self._binding()  # a contradiction or a refused token fails here, at construction
        return self

    def _binding(self) -> Binding:
        """The binding of the fields as they are now: a copy or an assignment that changes whom or
        how it searches gets a new one (and a token given anew is verified anew)."""
        token = self.token.get_secret_value() if self.token is not None else None
        fields = (id(self.warehouse), self.url, token, self.subject, self.tenant, self.actor, self.mode, self.purpose,
                  self.group_by, self.per_group, self.distinct)  # fmt: skip
        if self._bound is None or self._bound[0] != fields:
            binding = bind(
                warehouse=self.warehouse,
                url=self.url,
                token=token,
                subject=self.subject,
                tenant=self.tenant,
                actor=self.actor,
                options=SearchOptions(mode=self.mode, purpose=self.purpose, group_by=self.group_by,
                                      per_group=self.per_group, distinct=self.distinct),  # fmt: skip
            )
            self._bound = (fields, binding)
        return self._bound[1]

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
