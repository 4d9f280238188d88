"""The README's retriever examples run as written, against the demo warehouse and service."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.readme import README, README_SERVICE, readme_block

from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse


def readme_example(module: str, name: str = "WardenRetriever") -> str:
    """The README's python block that imports ``name`` from ``module``."""
    return readme_block(f"from {module} import {name}")


@pytest.fixture
def run_example(demo_warehouse: Warehouse, onnx_workers: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str]) -> Callable[..., dict[str, Any]]:  # fmt: skip
    """Run a README block with ``ragwarden.open()`` opening the demo warehouse; its variables."""
    monkeypatch.setenv("RAGWARDEN_WAREHOUSE", demo_warehouse.uri)

    def run(source: str, **names: Any) -> dict[str, Any]:
        namespace = dict(names)
        exec(compile(source, str(README), "exec"), namespace)  # noqa: S102 - our own README
        namespace["printed"] = capsys.readouterr().out
        return namespace

    return run


def test_the_langchain_example_runs_in_process_and_over_the_service(
    run_example: Callable[..., dict[str, Any]], demo_service_url: str, mint: Callable[..., str], demo_oracle
) -> None:
    source = readme_example("ragwarden.integrations.langchain")
    assert README_SERVICE in source
    found = run_example(source.replace(README_SERVICE, demo_service_url), alice_token=mint("alice"))
    docs, fewer, remote = found["docs"], found["fewer"], found["remote_docs"]
    assert len(docs) == 4 and len(fewer) == 2 and [d.id for d in fewer] == [d.id for d in docs[:2]]
    assert [d.id for d in remote] == [d.id for d in docs]
    assert {d.id for d in docs} <= demo_oracle("user:alice", "acme")
    assert "acme-fin-002" in {d.metadata["doc_id"] for d in docs}, "alice, in finance, should get the budget"
    assert all(d.id in found["printed"] for d in docs)
    public = found["only_public"].invoke("When is the office open?")
    assert public and {d.metadata["doc_id"] for d in public} <= {"acme-pub-004", "acme-pub-005"}
    assert str([d.metadata["title"] for d in public]) in found["printed"]


def test_the_llamaindex_example_runs(run_example: Callable[..., dict[str, Any]], demo_oracle) -> None:
    found = run_example(readme_example("ragwarden.integrations.llamaindex"))
    nodes = found["nodes"]
    assert len(nodes) == 4 and {n.node.node_id for n in nodes} <= demo_oracle("user:alice", "acme")
    assert all(n.node.node_id in found["printed"] for n in nodes)


def test_the_collapse_example_returns_one_chunk_a_document(run_example: Callable[..., dict[str, Any]],
                                                            demo_warehouse: Warehouse) -> None:  # fmt: skip
    found = run_example(readme_block('group_by="doc"'))
    hits = found["hits"]
    ranked = demo_warehouse.search("Who signs off on the FY27 budget?", subject="user:alice", tenant="acme", k=1000)
    docs: set[str] = set()
    texts: set[str] = set()
    collapsed = []
    for hit in ranked:  # best first: a hit is kept unless a kept one has its document or its text
        if hit.doc_id not in docs and hit.text not in texts:
            collapsed.append(hit.chunk_id)
            docs.add(hit.doc_id)
            texts.add(hit.text)
    assert len(hits) == 5 and [hit.chunk_id for hit in hits] == collapsed[:5]
    assert str([hit.doc_id for hit in hits]) in found["printed"]


def test_the_filter_example_returns_only_matching_chunks_with_their_titles(
    run_example: Callable[..., dict[str, Any]], demo_warehouse: Warehouse
) -> None:
    found = run_example(readme_block('filter={"$or"'))
    hits = found["hits"]
    assert hits and {hit.doc_id for hit in hits} <= {"acme-pub-004", "acme-pub-005"}
    assert {hit.metadata["title"] for hit in hits} <= {"Acme holiday schedule 2026", "Visiting Acme: office opening hours"}
    assert all(hit.metadata["title"] in found["printed"] for hit in hits)
    unfiltered = demo_warehouse.search("When is the office open?", subject="user:alice", tenant="acme", k=1000)
    assert [h.chunk_id for h in hits] == [h.chunk_id for h in unfiltered if h.doc_id in ("acme-pub-004", "acme-pub-005")][:3]


def test_the_vectors_brought_in_example_writes_one_chunk_and_refuses_another_model(
    run_example: Callable[..., dict[str, Any]], demo_policy_warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGWARDEN_WAREHOUSE", demo_policy_warehouse.uri)  # it writes: not the shared demo warehouse
    found = run_example(readme_block('"model": MODEL_NAME'))
    assert found["report"].documents == 1 and found["report"].chunks == 1
    assert "openai/text-embedding-3-small" in found["refused"].rejected[0].reason
    assert found["refused"].rejected[0].reason in found["printed"]
    (hit,) = demo_policy_warehouse.search("Where do visitors sign in?", subject="user:alice", tenant="acme", k=1)
    assert hit.doc_id == "acme-pub-visitors"


@pytest.fixture
def alice_writes(demo_policy_warehouse: Warehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Warehouse:
    """An empty warehouse under the demo policy in which alice may also write and erase, opened by
    ``ragwarden.open()``: the vector store examples write."""
    policy = tmp_path / "alice-writes.csv"
    policy.write_text(policy_file("demo.csv").read_text(encoding="utf-8")
                      + "p, user:alice, acme, ingest, execute, allow\np, user:alice, acme, forget, execute, allow\n", encoding="utf-8")  # fmt: skip
    demo_policy_warehouse.install_policy(policy)
    monkeypatch.setenv("RAGWARDEN_WAREHOUSE", demo_policy_warehouse.uri)
    return demo_policy_warehouse


def test_the_langchain_store_example_writes_finds_and_erases_as_alice(
    run_example: Callable[..., dict[str, Any]], alice_writes: Warehouse, mint: Callable[..., str]
) -> None:
    from langchain_core.documents import Document

    docs = [Document(id="budget-memo", page_content="Olivia signs off on the FY27 budget.", metadata={"year": 2026}),
            Document(id="old-memo", page_content="The FY24 budget was signed off in March.", metadata={"year": 2024})]  # fmt: skip
    found = run_example(readme_example("ragwarden.integrations.langchain", "RagwardenVectorStore"), docs=docs,
                        alice_token=mint("alice"))  # fmt: skip
    assert [d.id for d in found["found"]] == ["budget-memo"] and [d.id for d in found["memo"]] == ["budget-memo"]
    assert found["store"].get_by_ids(["budget-memo", "old-memo"]) == [docs[1]]
    assert [d.id for d in alice_writes.search("budget", subject="user:dave", tenant="acme", k=10)] == []  # fpa and confidential
    assert found["chain_retriever"].invoke("FY24 budget") == [docs[1]]


def test_the_llamaindex_store_example_indexes_and_erases_as_alice(run_example: Callable[..., dict[str, Any]],
                                                                  alice_writes: Warehouse) -> None:  # fmt: skip
    from llama_index.core import Document

    docs = [Document(id_="budget-memo", text="Olivia signs off on the FY27 budget.", metadata={"owner_groups": "group:fpa", "level": "confidential"}),
            Document(id_="canteen", text="The canteen opens at noon.", metadata={"owner_groups": "group:staff", "level": "internal"})]  # fmt: skip
    found = run_example(readme_example("ragwarden.integrations.llamaindex", "RagwardenVectorStore"), docs=docs)
    assert [n.node.ref_doc_id for n in found["nodes"]] == ["budget-memo", "canteen"]
    after = found["index"].as_retriever(similarity_top_k=4).retrieve("FY27 budget sign-off")
    assert [n.node.ref_doc_id for n in after] == ["canteen"]
    dave = alice_writes.search("canteen", subject="user:dave", tenant="acme", k=10)  # a node is a document of its own
    assert [h.metadata["ref_doc_id"] for h in dave] == ["canteen"]
