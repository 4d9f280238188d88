"""The LangChain vector store: langchain-tests' standard vector store suite, in process and over the
service, and what that suite cannot know: whose rows come back, what a write must say about who
may read it, and that deleting erases."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_tests.integration_tests import VectorStoreIntegrationTests
from support.team_policy import TEAM_TAGS

from ragwarden.embedder import Embedder
from ragwarden.errors import ConfigurationError, InvalidRequestError, PermissionDeniedError
from ragwarden.ingest.importers import AclFromMetadata
from ragwarden.integrations.langchain import RagwardenVectorStore
from ragwarden.integrations.stores import ERASED_BY_STORE
from ragwarden.warehouse import Warehouse

SHOP = {"subject": "user:ada", "tenant": "shop"}


@pytest.mark.anyio
class TestStandardSuiteInProcess(VectorStoreIntegrationTests):
    """The standard suite against an empty warehouse opened in this process, as ada of the team."""

    @pytest.fixture
    def vectorstore(self, team_warehouse: Warehouse) -> Iterator[RagwardenVectorStore]:  # type: ignore[override]
        yield RagwardenVectorStore(warehouse=team_warehouse, tags=TEAM_TAGS, **SHOP)


@pytest.mark.anyio
class TestStandardSuiteOverTheService(VectorStoreIntegrationTests):
    """The same suite against the HTTP service, the caller named by ada's token alone."""

    @pytest.fixture
    def vectorstore(self, team_warehouse: Warehouse, serve: Callable[..., str],  # type: ignore[override]
                    mint: Callable[..., str]) -> Iterator[RagwardenVectorStore]:  # fmt: skip
        url = serve(team_warehouse)
        yield RagwardenVectorStore(url=url, token=mint("ada", tenant="shop"), tags=TEAM_TAGS)


def test_a_store_finds_only_what_its_caller_may_read(team_warehouse: Warehouse) -> None:
    ada = RagwardenVectorStore(warehouse=team_warehouse, tags="allow=readers,labels=labels,classification=level", **SHOP)
    ada.add_texts(
        ["Team price list for the spring sale", "Pricing floor for the spring sale, team only", "Opening hours for everyone"],
        [{"readers": "group:team", "level": "internal"},
         {"readers": "group:team", "labels": ["pricing"], "level": "internal"},
         {"readers": "group:team,group:outsiders", "level": "internal"}],
        ids=["list", "floor", "hours"],
    )  # fmt: skip
    olga = RagwardenVectorStore(warehouse=team_warehouse, subject="user:olga", tenant="shop")
    assert {d.id for d in olga.similarity_search("spring sale prices", k=10)} == {"hours"}
    assert {d.id for d in ada.similarity_search("spring sale prices", k=10)} == {"list", "floor", "hours"}
    assert olga.get_by_ids(["list", "floor", "hours"]) == [Document(id="hours", page_content="Opening hours for everyone",
                                                                    metadata={"readers": "group:team,group:outsiders", "level": "internal"})]  # fmt: skip
    narrowed = ada.similarity_search("spring sale prices", k=10, filter={"level": "internal", "readers": "group:team"})
    assert {d.id for d in narrowed} == {"list", "floor"}
    assert olga.similarity_search("spring sale prices", k=10, filter={"readers": "group:team"}) == []


def test_a_store_without_tags_or_a_text_without_an_acl_writes_nothing_open(team_warehouse: Warehouse) -> None:
    with pytest.raises(ConfigurationError, match="given no tags"):
        RagwardenVectorStore(warehouse=team_warehouse, **SHOP).add_texts(["an untagged note"])
    with pytest.raises(ConfigurationError, match="must name classification"):
        RagwardenVectorStore(warehouse=team_warehouse, tags={"allow": ["group:team"]}, **SHOP)
    with pytest.raises(ConfigurationError, match="tenant"):
        RagwardenVectorStore(warehouse=team_warehouse, tags={**TEAM_TAGS, "tenant": "other"}, **SHOP)
    by_metadata = RagwardenVectorStore(warehouse=team_warehouse, tags=AclFromMetadata.parse("allow=readers,classification=level"), **SHOP)
    with pytest.raises(InvalidRequestError, match=r"1 of 2 texts refused .*no ACL"):
        by_metadata.add_texts(["shared note", "note with no readers"], [{"readers": "group:team", "level": "internal"}, {"level": "internal"}],
                              ids=["shared", "loose"])  # fmt: skip
    assert [d.id for d in by_metadata.get_by_ids(["shared", "loose"])] == ["shared"]


def test_writing_and_deleting_need_the_callers_rights(team_warehouse: Warehouse) -> None:
    RagwardenVectorStore(warehouse=team_warehouse, tags=TEAM_TAGS, **SHOP).add_texts(["team note"], ids=["note"])
    olga = RagwardenVectorStore(warehouse=team_warehouse, subject="user:olga", tenant="shop", tags=TEAM_TAGS)
    with pytest.raises(PermissionDeniedError):
        olga.add_texts(["olga's note"])
    with pytest.raises(PermissionDeniedError):
        olga.delete(["note"])
    assert [d.id for d in RagwardenVectorStore(warehouse=team_warehouse, **SHOP).get_by_ids(["note"])] == ["note"]


def test_delete_erases_so_an_erased_id_comes_back_only_when_restored(team_warehouse: Warehouse) -> None:
    store = RagwardenVectorStore(warehouse=team_warehouse, tags=TEAM_TAGS, **SHOP)
    store.add_texts(["the old supplier contract"], ids=["contract"])
    assert store.delete(["contract"]) is True
    assert store.get_by_ids(["contract"]) == []
    receipts = team_warehouse.receipts(caller=None, tenant="shop", operation="forget")
    assert [(r.subject, r.doc_ids, r.reason) for r in receipts] == [("user:ada", ("contract",), ERASED_BY_STORE)]
    with pytest.raises(InvalidRequestError, match="erased"):
        store.add_texts(["the old supplier contract"], ids=["contract"])
    store.add_texts(["the old supplier contract"], ids=["contract"], restore_erased=True)
    assert [d.id for d in store.get_by_ids(["contract"])] == ["contract"]


def test_a_store_refuses_what_it_does_not_understand(team_warehouse: Warehouse) -> None:
    store = RagwardenVectorStore(warehouse=team_warehouse, tags=TEAM_TAGS, **SHOP)
    with pytest.raises(InvalidRequestError, match="fetch_k"):
        store.similarity_search("sale", k=2, fetch_k=9)
    with pytest.raises(InvalidRequestError, match="name the ids"):
        store.delete()
    with pytest.raises(InvalidRequestError, match="k must be"):
        store.similarity_search("sale", k=0)
    with pytest.raises(InvalidRequestError, match="governs who may read"):
        store.similarity_search("sale", filter={"classification": "internal"})


class NamedEmbeddings(Embeddings):
    """An application's own embedding model: the warehouse's model, under its name."""

    def __init__(self, embedder: Embedder, model_name: str) -> None:
        self.embedder, self.model_name = embedder, model_name

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embedder.encode(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def test_an_applications_embeddings_are_written_only_when_they_are_the_warehouses_model(
    team_warehouse: Warehouse, embedder: Embedder
) -> None:
    same = NamedEmbeddings(embedder, embedder.model_id)
    store = RagwardenVectorStore.from_texts(["a note about the spring sale"], same, ids=["sale"], warehouse=team_warehouse,
                                            tags=TEAM_TAGS, **SHOP)  # fmt: skip
    assert store.embeddings is same and [d.id for d in store.similarity_search("spring sale", k=1)] == ["sale"]
    other = RagwardenVectorStore(warehouse=team_warehouse, tags=TEAM_TAGS, embedding=DeterministicFakeEmbedding(size=384),
                                 embedding_model="fake-model", **SHOP)  # fmt: skip
    with pytest.raises(InvalidRequestError, match="fake-model"):
        other.add_texts(["a note"], ids=["fake"])
    with pytest.raises(ConfigurationError, match="embedding_model"):
        RagwardenVectorStore(warehouse=team_warehouse, tags=TEAM_TAGS, embedding=DeterministicFakeEmbedding(size=384), **SHOP)


def test_as_retriever_and_relevance_scores(team_warehouse: Warehouse) -> None:
    store = RagwardenVectorStore.from_documents(
        [Document(page_content="spring sale prices", metadata={"n": 1}), Document(page_content="winter coats", metadata={"n": 2})],
        warehouse=team_warehouse, tags=TEAM_TAGS, **SHOP,
    )  # fmt: skip
    assert [d.metadata for d in store.as_retriever(search_kwargs={"k": 1}).invoke("prices of the sale")] == [{"n": 1}]
    scored = store.similarity_search_with_relevance_scores("prices of the sale", k=2)
    assert [d.metadata["n"] for d, _ in scored] == [1, 2] and 1 >= scored[0][1] > scored[1][1] >= 0


