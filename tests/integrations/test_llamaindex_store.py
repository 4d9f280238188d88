"""The LlamaIndex vector store under a real ``VectorStoreIndex``: nodes written with the caller's
rights and tags, a query that finds only what its caller may read, LlamaIndex's filters, and
deleting a document erases every node of it; in process and over the service."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)
from support.team_policy import TEAM_TAGS

from ragwarden.errors import ConfigurationError, InvalidRequestError, PermissionDeniedError
from ragwarden.integrations.llamaindex import RagwardenVectorStore
from ragwarden.warehouse import Warehouse

SHOP = {"subject": "user:ada", "tenant": "shop"}
DOCUMENTS = [
    Document(id_="prices", text="Spring sale prices for the team.", metadata={"readers": "group:team", "year": 2026, "level": "internal"}),
    Document(id_="hours", text="Opening hours of the shop for everyone.",
             metadata={"readers": "group:team,group:outsiders", "year": 2025, "level": "internal"}),
]  # fmt: skip
BY_METADATA = "allow=readers,classification=level"


def index_of(store: RagwardenVectorStore, documents: list[Document] = DOCUMENTS) -> VectorStoreIndex:
    """``documents`` written through a real index, split into nodes of at most 64 tokens (its
    embedding model is a stand-in: the store's warehouse embeds what is written and what is asked,
    so LlamaIndex's vectors are never used)."""
    return VectorStoreIndex.from_documents(documents, storage_context=StorageContext.from_defaults(vector_store=store),
                                           embed_model=MockEmbedding(embed_dim=8),
                                           transformations=[SentenceSplitter(chunk_size=64, chunk_overlap=0)])  # fmt: skip


@pytest.fixture(params=["in process", "over the service"])
def as_caller(request: pytest.FixtureRequest, team_warehouse: Warehouse, serve: Callable[..., str],
              mint: Callable[..., str]) -> Callable[..., RagwardenVectorStore]:  # fmt: skip
    """A store acting as the named person of tenant shop, in process or through the service."""
    url = serve(team_warehouse) if request.param == "over the service" else None

    def store(name: str, **kwargs: object) -> RagwardenVectorStore:
        if url is None:
            return RagwardenVectorStore(warehouse=team_warehouse, subject=f"user:{name}", tenant="shop", **kwargs)  # type: ignore[arg-type]
        return RagwardenVectorStore(url=url, token=mint(name, tenant="shop"), **kwargs)  # type: ignore[arg-type]

    return store


def test_an_index_retrieves_only_what_its_caller_may_read(as_caller: Callable[..., RagwardenVectorStore]) -> None:
    index_of(as_caller("ada", tags=BY_METADATA))
    ada = VectorStoreIndex.from_vector_store(as_caller("ada"), embed_model=MockEmbedding(embed_dim=8))
    olga = VectorStoreIndex.from_vector_store(as_caller("olga"), embed_model=MockEmbedding(embed_dim=8))
    ada_nodes = ada.as_retriever(similarity_top_k=10).retrieve("spring sale prices")
    assert {n.node.ref_doc_id for n in ada_nodes} == {"prices", "hours"}
    assert ada_nodes[0].node.ref_doc_id == "prices" and ada_nodes[0].node.get_content() == DOCUMENTS[0].text
    assert ada_nodes[0].node.metadata["year"] == 2026 and ada_nodes[0].score > ada_nodes[1].score
    assert {n.node.ref_doc_id for n in olga.as_retriever(similarity_top_k=10).retrieve("spring sale prices")} == {"hours"}


def test_llamaindex_filters_doc_ids_and_modes_narrow_the_callers_rows(as_caller: Callable[..., RagwardenVectorStore]) -> None:
    store = as_caller("ada", tags=TEAM_TAGS)
    index_of(store)

    def found(query_str: str = "shop", **query: object) -> set[str]:
        result = store.query(VectorStoreQuery(query_str=query_str, similarity_top_k=10, **query))  # type: ignore[arg-type]
        return {node.ref_doc_id for node in result.nodes or []}

    assert found() == {"prices", "hours"}
    assert found(filters=MetadataFilters(filters=[MetadataFilter(key="year", value=2026, operator=FilterOperator.GTE)])) == {"prices"}
    either = MetadataFilters(filters=[MetadataFilter(key="year", value=2025), MetadataFilter(key="year", value=2026)],
                             condition=FilterCondition.OR)  # fmt: skip
    assert found(filters=either) == {"prices", "hours"}
    assert found(doc_ids=["hours"]) == {"hours"}
    assert found(mode=VectorStoreQueryMode.TEXT_SEARCH, query_str="opening hours") == {"hours"}
    with pytest.raises(InvalidRequestError, match="text_match"):
        found(filters=MetadataFilters(filters=[MetadataFilter(key="readers", value="team", operator=FilterOperator.TEXT_MATCH)]))
    with pytest.raises(InvalidRequestError, match="mmr"):
        found(mode=VectorStoreQueryMode.MMR)
    with pytest.raises(InvalidRequestError, match="query_str"):
        store.query(VectorStoreQuery(query_embedding=[0.1] * 8))


def test_deleting_a_document_erases_all_its_nodes_with_the_callers_rights(as_caller: Callable[..., RagwardenVectorStore]) -> None:
    store = as_caller("ada", tags=BY_METADATA)
    long_text = " ".join(f"Sentence {n} of the long handbook about returns and refunds." for n in range(60))
    index = index_of(store, [*DOCUMENTS, Document(id_="handbook", text=long_text, metadata=DOCUMENTS[0].metadata)])
    handbook = {n.node.node_id for n in index.as_retriever(similarity_top_k=50).retrieve("returns and refunds")
                if n.node.ref_doc_id == "handbook"}  # fmt: skip
    assert len(handbook) > 1 and [n.node_id for n in store.get_nodes(sorted(handbook))] == sorted(handbook)
    with pytest.raises(PermissionDeniedError):
        as_caller("olga").delete("hours")  # she reads it, but may not erase it
    store.delete("handbook")
    assert store.get_nodes(sorted(handbook)) == []
    assert {n.node.ref_doc_id for n in index.as_retriever(similarity_top_k=50).retrieve("returns and refunds")} == {"prices", "hours"}


def test_a_store_with_no_tags_writes_nothing(as_caller: Callable[..., RagwardenVectorStore]) -> None:
    with pytest.raises(ConfigurationError, match="given no tags"):
        index_of(as_caller("ada"))
    assert as_caller("ada").query(VectorStoreQuery(query_str="shop", similarity_top_k=5)).nodes == []
