"""The LangChain retriever: langchain-tests' standard retriever suite, run in process and over the
service, and what that suite cannot know: whose rows come back, and what they carry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_tests.integration_tests import RetrieversIntegrationTests
from pydantic import ValidationError
from support.loopback_http import LoopbackHTTPServer, fixed_answer

from ragwarden.api_keys import ApiKeys
from ragwarden.errors import AuthenticationError, ConfigurationError, InvalidRequestError, WarehouseError
from ragwarden.integrations.langchain import WardenRetriever
from ragwarden.warehouse import Warehouse

QUERY = "Acme acquisition of Brightline Sensors"
LEGAL_QUERY = "Ruiz matter investigation legal hold"


@pytest.mark.anyio
class TestStandardSuiteInProcess(RetrieversIntegrationTests):
    """The standard suite against a warehouse opened in this process, searching as alice."""

    @pytest.fixture(autouse=True)
    def _demo(self, demo_warehouse: Warehouse) -> None:
        self.params = {"warehouse": demo_warehouse, "subject": "user:alice", "tenant": "acme"}

    @property
    def retriever_constructor(self) -> type[WardenRetriever]:
        return WardenRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return self.params

    @property
    def retriever_query_example(self) -> str:
        return QUERY


@pytest.mark.anyio
class TestStandardSuiteOverTheService(TestStandardSuiteInProcess):
    """The same suite against the HTTP service, the caller named by alice's token alone."""

    @pytest.fixture(autouse=True)
    def _demo(self, demo_service_url: str, mint: Callable[..., str]) -> None:
        self.params = {"url": demo_service_url, "token": mint("alice")}


def test_documents_are_the_callers_top_k_with_governance_in_metadata(demo_warehouse: Warehouse) -> None:
    retriever = WardenRetriever(warehouse=demo_warehouse, subject="user:carol", tenant="acme", k=6)
    documents = retriever.invoke(LEGAL_QUERY)
    hits = demo_warehouse.search(LEGAL_QUERY, subject="user:carol", tenant="acme", k=6)
    assert [d.id for d in documents] == [h.chunk_id for h in hits] and len(documents) == 6
    for document, hit in zip(documents, hits, strict=True):
        assert document.page_content == hit.text
        meta = document.metadata
        assert meta["chunk_id"] == hit.chunk_id and meta["doc_id"] == hit.doc_id
        assert meta["labels"] == list(hit.labels) and meta["classification"] == hit.classification.label
        assert meta["lineage"] == {"doc_id": hit.doc_id, "doc_version": hit.doc_version, "source_uri": hit.source_uri,
                                   "position": hit.position, "parents": list(hit.parents)}  # fmt: skip
        assert meta["reason"] == hit.reason and meta["reason"]
        assert meta["policy_version"] == demo_warehouse.policy.version
    assert any(d.metadata["labels"] for d in documents), "the legal query should reach labelled rows"


@pytest.mark.parametrize("subject", ["user:dave", "user:bob", "user:alice"])
def test_a_retriever_returns_only_what_its_caller_may_read(
    demo_warehouse: Warehouse, demo_oracle: Callable[[str, str], set[str]], subject: str
) -> None:
    documents = WardenRetriever(warehouse=demo_warehouse, subject=subject, tenant="acme", k=50).invoke(LEGAL_QUERY)
    assert {d.id for d in documents} == demo_oracle(subject, "acme")  # each sees fewer than 50 rows


def test_over_the_service_the_token_alone_names_the_caller(
    demo_warehouse: Warehouse, demo_service_url: str, mint: Callable[..., str]
) -> None:
    remote = WardenRetriever(url=demo_service_url, token=mint("dave"), k=5).invoke(LEGAL_QUERY)
    local = WardenRetriever(warehouse=demo_warehouse, subject="user:dave", tenant="acme", k=5).invoke(LEGAL_QUERY)
    assert [d.id for d in remote] == [d.id for d in local]
    assert [d.metadata for d in remote] == [d.metadata for d in local]
    with pytest.raises(ConfigurationError, match="the token says who the caller is"):
        WardenRetriever(url=demo_service_url, token=mint("dave"), subject="user:carol")


def test_in_process_a_token_is_verified_against_the_warehouse(small_warehouse: Warehouse) -> None:
    keys = ApiKeys(small_warehouse.store.api_keys)
    key = keys.create(subject="user:alice", tenant="acme")
    by_key = WardenRetriever(warehouse=small_warehouse, token=key, k=3).invoke("quarterly budget review")
    named = WardenRetriever(warehouse=small_warehouse, subject="user:alice", tenant="acme", k=3).invoke("quarterly budget review")
    assert [d.id for d in by_key] == [d.id for d in named] and "acme-budget" in {d.metadata["doc_id"] for d in by_key}
    bound = WardenRetriever(warehouse=small_warehouse, token=key + "\n", k=3)  # a key read from a file
    keys.revoke(keys.verify(key).key_id)
    with pytest.raises(AuthenticationError):
        bound.invoke("quarterly budget review")  # verified at every search, not only when bound
    with pytest.raises(AuthenticationError):
        WardenRetriever(warehouse=small_warehouse, token=key)


def test_over_the_service_a_refused_token_is_an_authentication_error(demo_service_url: str, mint: Callable[..., str]) -> None:
    with pytest.raises(AuthenticationError, match="expired"):
        WardenRetriever(url=demo_service_url, token=mint("alice", exp=1)).invoke(QUERY)
    with pytest.raises(AuthenticationError, match="signature"):
        WardenRetriever(url=demo_service_url, token=mint("alice", key=b"x" * 32)).invoke(QUERY)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "either warehouse= .* or url="),
        ({"url": "http://127.0.0.1:9"}, "needs token="),
        ({"subject": "user:alice"}, "name the caller"),
    ],
)
def test_a_retriever_that_names_no_caller_or_two_places_is_refused(
    demo_warehouse: Warehouse, params: dict[str, Any], message: str
) -> None:
    if "url" not in params and params:
        params = {**params, "warehouse": demo_warehouse}
    with pytest.raises(ConfigurationError, match=message):
        WardenRetriever(**params)
    with pytest.raises(ConfigurationError, match="not both"):
        WardenRetriever(warehouse=demo_warehouse, url="http://127.0.0.1:9", token="t")


def test_an_unknown_argument_is_refused_by_name(demo_warehouse: Warehouse) -> None:
    retriever = WardenRetriever(warehouse=demo_warehouse, subject="user:alice", tenant="acme")
    with pytest.raises(InvalidRequestError, match="filter"):
        retriever.invoke(QUERY, filter={"labels": []})
    with pytest.raises(InvalidRequestError, match="k must be"):
        retriever.invoke(QUERY, k=0)
    assert len(retriever.invoke(QUERY, verbose=True)) == retriever.k  # LangChain's own keyword passes
    with pytest.raises((ValidationError, InvalidRequestError), match="fetch_k"):
        WardenRetriever(warehouse=demo_warehouse, subject="user:alice", tenant="acme", search_kwargs={"fetch_k": 9})


def test_a_copy_or_an_assignment_searches_as_the_caller_it_names(
    demo_warehouse: Warehouse, demo_oracle: Callable[[str, str], set[str]]
) -> None:
    carol = WardenRetriever(warehouse=demo_warehouse, subject="user:carol", tenant="acme", k=50)
    assert {d.id for d in carol.invoke(LEGAL_QUERY)} == demo_oracle("user:carol", "acme")
    dave = carol.model_copy(update={"subject": "user:dave"})
    assert {d.id for d in dave.invoke(LEGAL_QUERY)} == demo_oracle("user:dave", "acme")
    carol.subject = "user:bob"
    assert {d.id for d in carol.invoke(LEGAL_QUERY)} == demo_oracle("user:bob", "acme")


@pytest.mark.parametrize(("status", "body", "error"), [
    (502, b"<html>bad gateway</html>", WarehouseError),
    (502, b'{"error": "bad gateway"}', WarehouseError),
    (401, b'{"detail": "no"}', AuthenticationError),
    (200, b'{"unexpected": true}', WarehouseError),
])  # fmt: skip
def test_an_answer_that_is_not_ragwardens_is_a_clear_error(status: int, body: bytes, error: type[Exception]) -> None:
    proxy = LoopbackHTTPServer(fixed_answer(status, body))
    try:
        with pytest.raises(error, match=str(status)):
            WardenRetriever(url=proxy.url, token="t").invoke(QUERY)
    finally:
        proxy.stop()
    with pytest.raises(WarehouseError, match="cannot reach"):
        WardenRetriever(url=proxy.url, token="t").invoke(QUERY)


def test_each_retrieval_leaves_a_receipt_with_its_purpose(demo_warehouse: Warehouse) -> None:
    retriever = WardenRetriever(
        warehouse=demo_warehouse, subject="user:olivia", tenant="acme", actor="agent:langchain", purpose="chain: board memo"
    )
    documents: list[Document] = retriever.invoke(QUERY)
    receipt = demo_warehouse.audit.query(subject="user:olivia", limit=1)[0]
    assert receipt.operation == "search" and receipt.actor == "agent:langchain" and receipt.purpose == "chain: board memo"
    assert list(receipt.chunk_ids) == [d.id for d in documents]


@pytest.fixture(params=["in process", "over the service"])
def carols_binding(
    request: pytest.FixtureRequest, demo_warehouse: Warehouse, demo_service_url: str, mint: Callable[..., str]
) -> dict[str, Any]:
    """A retriever's binding to carol in acme: the demo warehouse in process, or its service and her token."""
    if request.param == "over the service":
        return {"url": demo_service_url, "token": mint("carol")}
    return {"warehouse": demo_warehouse, "subject": "user:carol", "tenant": "acme"}


def test_a_retriever_collapses_by_document_as_the_warehouse_does(
    demo_warehouse: Warehouse, carols_binding: dict[str, Any]
) -> None:
    where = carols_binding
    documents = WardenRetriever(**where, k=6, group_by="doc", per_group=1, distinct=True).invoke(LEGAL_QUERY)
    hits = demo_warehouse.search(LEGAL_QUERY, subject="user:carol", tenant="acme", k=6, group_by="doc", distinct=True)
    assert [d.id for d in documents] == [h.chunk_id for h in hits]
    assert "at most 1 per document, distinct texts" in demo_warehouse.audit.query(subject="user:carol", limit=1)[0].reason
    with pytest.raises((ValidationError, InvalidRequestError), match="per_group"):
        WardenRetriever(**where, group_by="doc", per_group=0)


def test_documents_carry_the_records_metadata_and_search_kwargs_filter_narrows(
    demo_warehouse: Warehouse, carols_binding: dict[str, Any]
) -> None:
    where = carols_binding
    (document,) = WardenRetriever(**where, k=1).invoke(LEGAL_QUERY)
    hit = demo_warehouse.search(LEGAL_QUERY, subject="user:carol", tenant="acme", k=1)[0]
    assert document.metadata["source"] == hit.source_uri and document.metadata["title"] == hit.metadata["title"]
    only = {"doc_id": {"$in": ["acme-pub-004", "acme-pub-005"]}}
    narrowed = WardenRetriever(**where, search_kwargs={"filter": only, "k": 5}).invoke(LEGAL_QUERY)
    assert narrowed and {d.metadata["doc_id"] for d in narrowed} <= {"acme-pub-004", "acme-pub-005"}
    assert [d.id for d in narrowed] == [h.chunk_id for h in demo_warehouse.search(
        LEGAL_QUERY, subject="user:carol", tenant="acme", k=5, filter=only)]  # fmt: skip
    with pytest.raises((ValidationError, InvalidRequestError), match="governs who may read"):
        WardenRetriever(**where, search_kwargs={"filter": {"labels": "legal"}})
    with pytest.raises((ValidationError, InvalidRequestError), match="score_threshold"):
        WardenRetriever(**where, search_kwargs={"score_threshold": 0.5})
