"""The LlamaIndex retriever: nodes with scores for exactly the caller's top k, governance in their
metadata and out of the text an LLM is given; in process and over the service, sync and async."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from ragwarden.errors import AuthenticationError, ConfigurationError, InvalidRequestError
from ragwarden.integrations.llamaindex import WardenRetriever
from ragwarden.warehouse import Warehouse

LEGAL_QUERY = "Ruiz matter investigation legal hold"


def test_nodes_are_the_callers_top_k_with_scores_and_governance(demo_warehouse: Warehouse) -> None:
    nodes = WardenRetriever(warehouse=demo_warehouse, subject="user:carol", tenant="acme", k=5).retrieve(LEGAL_QUERY)
    hits = demo_warehouse.search(LEGAL_QUERY, subject="user:carol", tenant="acme", k=5)
    assert len(nodes) == 5 and all(isinstance(n, NodeWithScore) and isinstance(n.node, TextNode) for n in nodes)
    assert [(n.node.node_id, n.score) for n in nodes] == [(h.chunk_id, pytest.approx(h.score)) for h in hits]
    for node, hit in zip(nodes, hits, strict=True):
        meta = node.node.metadata
        assert meta["labels"] == list(hit.labels) and meta["classification"] == hit.classification.label
        assert meta["lineage"]["doc_id"] == hit.doc_id and meta["lineage"]["source_uri"] == hit.source_uri
        assert meta["reason"] == hit.reason
        assert node.node.get_content(metadata_mode=MetadataMode.LLM) == hit.text
        assert node.node.get_content(metadata_mode=MetadataMode.EMBED) == hit.text


@pytest.mark.parametrize("subject", ["user:dave", "user:bob"])
def test_a_retriever_returns_only_what_its_caller_may_read(
    demo_warehouse: Warehouse, demo_oracle: Callable[[str, str], set[str]], subject: str
) -> None:
    nodes = WardenRetriever(warehouse=demo_warehouse, subject=subject, tenant="acme", k=50).retrieve(LEGAL_QUERY)
    assert {n.node.node_id for n in nodes} == demo_oracle(subject, "acme")


@pytest.mark.anyio
async def test_over_the_service_async_retrieval_matches_in_process_for_the_tokens_caller(
    demo_warehouse: Warehouse, demo_service_url: str, mint: Callable[..., str]
) -> None:
    remote = await WardenRetriever(url=demo_service_url, token=mint("bob"), k=4).aretrieve(QueryBundle(LEGAL_QUERY))
    local = WardenRetriever(warehouse=demo_warehouse, subject="user:bob", tenant="acme", k=4).retrieve(LEGAL_QUERY)
    assert [(n.node.node_id, n.node.metadata) for n in remote] == [(n.node.node_id, n.node.metadata) for n in local]
    with pytest.raises(AuthenticationError, match="signature"):
        await WardenRetriever(url=demo_service_url, token=mint("bob", key=b"y" * 32)).aretrieve(LEGAL_QUERY)


def test_bad_bindings_are_refused(demo_warehouse: Warehouse) -> None:
    with pytest.raises(ConfigurationError, match="name the caller"):
        WardenRetriever(warehouse=demo_warehouse, tenant="acme")
    with pytest.raises(InvalidRequestError, match="k must be"):
        WardenRetriever(warehouse=demo_warehouse, subject="user:alice", tenant="acme", k=0)


def test_a_retriever_collapses_by_document_as_the_warehouse_does(demo_warehouse: Warehouse) -> None:
    retriever = WardenRetriever(warehouse=demo_warehouse, subject="user:carol", tenant="acme", k=5, group_by="doc", per_group=1)
    nodes = retriever.retrieve(LEGAL_QUERY)
    hits = demo_warehouse.search(LEGAL_QUERY, subject="user:carol", tenant="acme", k=5, group_by="doc")
    assert [n.node.node_id for n in nodes] == [h.chunk_id for h in hits]
    with pytest.raises(InvalidRequestError, match="group_by 'folder'"):
        WardenRetriever(warehouse=demo_warehouse, subject="user:carol", tenant="acme", group_by="folder")  # type: ignore[arg-type]


def test_a_retriever_filter_narrows_and_nodes_carry_the_records_metadata(demo_warehouse: Warehouse) -> None:
    only = {"doc_id": "acme-pub-005"}
    retriever = WardenRetriever(warehouse=demo_warehouse, subject="user:carol", tenant="acme", k=5, filter=only)
    nodes = retriever.retrieve(LEGAL_QUERY)
    assert nodes and {n.node.metadata["doc_id"] for n in nodes} == {"acme-pub-005"}
    assert nodes[0].node.metadata["title"] == "Acme holiday schedule 2026"
    assert nodes[0].node.metadata["source"] == demo_warehouse.get_chunk(nodes[0].node.node_id, subject="user:carol", tenant="acme").source_uri
    with pytest.raises(InvalidRequestError, match="governs who may read"):
        WardenRetriever(warehouse=demo_warehouse, subject="user:carol", tenant="acme", filter={"tenant": "globex"})
