"""LlamaIndex: ``WardenRetriever``, a ``BaseRetriever`` that searches ragwarden as one caller.

    retriever = WardenRetriever(warehouse=ragwarden.open(), subject="user:alice", tenant="acme")
    nodes = retriever.retrieve("parental leave policy")

Each ``NodeWithScore`` holds a ``TextNode`` whose id is the chunk's and whose metadata carries its
labels, classification, lineage and the reason it was visible. That metadata is kept out of the
text LlamaIndex embeds or hands to an LLM: it is governance, not content.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from ..retrieval.collapse import GroupBy
from ..retrieval.search import Mode
from ..warehouse import Warehouse
from .binding import SearchOptions, bind, hit_metadata
from .options import DEFAULT_K, check_k

__all__ = ["WardenRetriever"]


class WardenRetriever(BaseRetriever):
    """The top ``k`` chunks the bound caller may read, as LlamaIndex nodes with their scores.

    Bind it with ``warehouse=`` (in process) or ``url=`` (a ragwarden service), and name the caller
    with ``token=`` (a JWT or API key, verified) or, in process only, ``subject=`` and ``tenant=``.
    """

    def __init__(
        self,
        *,
        warehouse: Warehouse | None = None,
        url: str | None = None,
        token: str | None = None,
        subject: str | None = None,
        tenant: str | None = None,
        actor: str | None = None,
        k: int = DEFAULT_K,
        mode: Mode = "vector",
        purpose: str | None = None,
        group_by: GroupBy | None = None,
        per_group: int = 1,
        distinct: bool = False,
        filter: Mapping[str, Any] | None = None,  # only chunks matching it
        **kwargs: Any,
    ) -> None:
        self._binding = bind(
            warehouse=warehouse,
            url=url,
            token=token,
            subject=subject,
            tenant=tenant,
            actor=actor,
            options=SearchOptions(
                mode=mode, purpose=purpose, group_by=group_by, per_group=per_group, distinct=distinct, filter=filter
            ),
        )
        self.k = check_k(k)
        super().__init__(**kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [_node(hit) for hit in self._binding.search(query_bundle.query_str, self.k)]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [_node(hit) for hit in await self._binding.asearch(query_bundle.query_str, self.k)]


def _node(hit: dict[str, Any]) -> NodeWithScore:
    metadata = hit_metadata(hit)
    node = TextNode(
        id_=hit["chunk_id"],
        text=hit["text"],
        metadata=metadata,
        excluded_embed_metadata_keys=list(metadata),
        excluded_llm_metadata_keys=list(metadata),
    )
    return NodeWithScore(node=node, score=hit["score"])
