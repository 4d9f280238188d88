"""LlamaIndex: ``WardenRetriever``, a ``BaseRetriever`` that searches ragwarden as one caller, and
``RagwardenVectorStore``, a ``BasePydanticVectorStore`` that reads and writes as one.

    retriever = WardenRetriever(warehouse=ragwarden.open(), subject="user:alice", tenant="acme")
    nodes = retriever.retrieve("parental leave policy")
    store = RagwardenVectorStore(warehouse=ragwarden.open(), subject="user:alice", tenant="acme",
                                 tags={"allow": ["group:fpa"], "classification": "internal"})
    index = VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(vector_store=store))

Each ``NodeWithScore`` holds a ``TextNode`` whose id is the chunk's and whose metadata carries its
labels, classification, lineage and the reason it was visible. That metadata is kept out of the
text LlamaIndex embeds or hands to an LLM: it is governance, not content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle, TextNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict
from pydantic import PrivateAttr

from ..errors import InvalidRequestError
from ..ingest.importers import AclFromMetadata
from ..retrieval.collapse import GroupBy
from ..retrieval.search import MAX_K, Mode
from ..warehouse import Warehouse
from .binding import Binding, SearchOptions, bind, hit_metadata, with_options
from .options import DEFAULT_K, check_k
from .stores import ERASED_BY_STORE, WriteTags, by_ids, erase, write_texts

__all__ = ["RagwardenVectorStore", "WardenRetriever"]

OPERATORS = {FilterOperator.EQ: "$eq", FilterOperator.NE: "$ne", FilterOperator.GT: "$gt", FilterOperator.GTE: "$gte",
             FilterOperator.LT: "$lt", FilterOperator.LTE: "$lte", FilterOperator.IN: "$in", FilterOperator.NIN: "$nin"}  # fmt: skip
MODES: dict[VectorStoreQueryMode, Mode] = {VectorStoreQueryMode.HYBRID: "hybrid", VectorStoreQueryMode.TEXT_SEARCH: "fts"}


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


class RagwardenVectorStore(BasePydanticVectorStore):
    """A LlamaIndex vector store over ragwarden, acting as one caller: a query finds only what that
    caller may read, and nodes are written (and deleted) with its rights (``ingest``, ``forget``).

    Bound as ``WardenRetriever`` is; ``tags`` says who may read the nodes it writes, as for the
    LangChain store (``integrations.stores``). The warehouse embeds each node's text with its own
    model, the one queries are compared in, so the vectors LlamaIndex made are not written and the
    query goes as text (``is_embedding_query`` is False). ``delete(ref_doc_id)`` erases every node
    of that document the caller may read.
    """

    stores_text: bool = True
    is_embedding_query: bool = False
    flat_metadata: bool = False

    _binding: Binding = PrivateAttr()
    _tags: WriteTags | None = PrivateAttr()

    def __init__(
        self,
        *,
        warehouse: Warehouse | None = None,
        url: str | None = None,
        token: str | None = None,
        subject: str | None = None,
        tenant: str | None = None,
        actor: str | None = None,
        tags: Mapping[str, Any] | AclFromMetadata | str | None = None,
        mode: Mode = "vector",
        purpose: str | None = None,
    ) -> None:
        super().__init__()
        self._binding = bind(warehouse=warehouse, url=url, token=token, subject=subject, tenant=tenant, actor=actor,
                             options=SearchOptions(mode=mode, purpose=purpose))  # fmt: skip
        self._tags = WriteTags.of(tags)

    @property
    def client(self) -> Binding:
        return self._binding

    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        """Write each node as a document of its own id, its text embedded by the warehouse."""
        texts = [node.get_content(metadata_mode=MetadataMode.NONE) for node in nodes]
        metadatas = [node_to_metadata_dict(node, remove_text=True, flat_metadata=False) for node in nodes]
        return write_texts(self._binding, self._tags, texts, metadatas, [node.node_id for node in nodes],
                           restore_erased=bool(kwargs.pop("restore_erased", False)))  # fmt: skip

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Erase every node of document ``ref_doc_id`` the caller may read."""
        while found := by_ids(self._binding, [ref_doc_id], field="ref_doc_id"):
            if not erase(self._binding, {hit["doc_id"] for hit in found}, reason=delete_kwargs.get("reason", ERASED_BY_STORE)):
                return  # what is left the caller may read but not erase

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:  # fmt: skip
        if node_ids is None or filters is not None:
            raise InvalidRequestError("name the node ids to delete (node_ids=...), without filters")
        erase(self._binding, node_ids, reason=delete_kwargs.get("reason", ERASED_BY_STORE))

    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None) -> list[BaseNode]:
        if node_ids is None or filters is not None:
            raise InvalidRequestError("name the node ids to get (node_ids=...), without filters")
        return [_stored(hit) for hit in by_ids(self._binding, node_ids)]

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The caller's top ``similarity_top_k`` nodes for the query's text, narrowed by its filters,
        ``doc_ids`` and ``node_ids``."""
        if not query.query_str:
            raise InvalidRequestError("this store searches by the query's text (its model is the warehouse's); give query_str")
        if query.mode != VectorStoreQueryMode.DEFAULT and query.mode not in MODES:
            raise InvalidRequestError(f"query mode {query.mode.value!r} is not served here: use default, hybrid or text_search")
        binding = with_options(self._binding, filter=_narrowing(query), mode=MODES.get(query.mode, self._binding.options.mode))
        hits = binding.search(query.query_str, check_k(min(query.similarity_top_k, MAX_K)))
        return VectorStoreQueryResult(nodes=[_stored(hit) for hit in hits], similarities=[hit["score"] for hit in hits],
                                      ids=[hit["doc_id"] for hit in hits])  # fmt: skip


def _stored(hit: dict[str, Any]) -> BaseNode:
    """A hit as the node that was written (its metadata and relationships as LlamaIndex keeps them)."""
    return metadata_dict_to_node(dict(hit["metadata"]), text=hit["text"])


def _narrowing(query: VectorStoreQuery) -> dict[str, Any] | None:
    """The query's filters, ``doc_ids`` and ``node_ids`` as one ragwarden filter (None: none)."""
    parts = [_condition(query.filters)] if query.filters is not None and query.filters.filters else []
    if query.doc_ids:
        parts.append({"ref_doc_id": {"$in": list(query.doc_ids)}})
    if query.node_ids:
        parts.append({"doc_id": {"$in": list(query.node_ids)}})
    return None if not parts else parts[0] if len(parts) == 1 else {"$and": parts}


def _condition(filters: MetadataFilters | MetadataFilter) -> dict[str, Any]:
    if isinstance(filters, MetadataFilter):
        if filters.operator not in OPERATORS:
            raise InvalidRequestError(f"filter operator {filters.operator.value!r} on {filters.key!r} is not served here: "
                                      f"use one of {', '.join(o.value for o in OPERATORS)}")  # fmt: skip
        return {f"metadata.{filters.key}": {OPERATORS[filters.operator]: filters.value}}
    if filters.condition not in (FilterCondition.AND, FilterCondition.OR, None):
        raise InvalidRequestError(f"filter condition {filters.condition.value!r} is not served here: use and, or")
    inner = [_condition(f) for f in filters.filters]
    return inner[0] if len(inner) == 1 else {"$or" if filters.condition == FilterCondition.OR else "$and": inner}
