"""A collection another store holds comes in as it is: a real LanceDB table's (and a real Chroma
folder's, a real Qdrant local storage's) ids, texts, vectors and metadata, each row's ACL from its metadata or a manifest, through the real command line. A
row with no ACL is refused and counted, never imported open; another model's vectors are refused;
an import killed halfway and run again writes only what is missing; and the rows imported are
searched under the policy like any other."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from support.raw_tables import raw_table

from ragwarden.api.cli import main
from ragwarden.config import Settings
from ragwarden.embedder import MODEL_NAME, Embedder
from ragwarden.errors import InvalidValueError
from ragwarden.ingest.importers import AclFromMetadata, AclManifest, Collected, lancedb_rows
from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse

ROWS = 40


@pytest.fixture
def prototype(tmp_path: Path, embedder: Embedder) -> tuple[str, np.ndarray]:
    """A team's LanceDB table: every fourth row readable by finance, the others by hr, rows 30-39
    with no owner at all (never given an ACL); vectors of the warehouse's own model."""
    texts = [f"{'finance' if i % 4 == 0 else 'hr'} note number {i}" for i in range(ROWS)]
    vectors = embedder.encode(texts)
    owners = [None if i >= 30 else ("group:finance" if i % 4 == 0 else "group:hr,group:hr-managers") for i in range(ROWS)]
    table = pa.table({"id": [f"p{i:02d}" for i in range(ROWS)], "text": texts, "owner_groups": owners,
                      "written": [datetime(2026, 11, 1 + i % 28, tzinfo=timezone.utc) for i in range(ROWS)],
                      "level": ["internal"] * ROWS,
                      "tags": [["finance"] if i % 4 == 0 else ["hr"] for i in range(ROWS)], "page": list(range(ROWS)),
                      "vector": pa.array(list(vectors), pa.list_(pa.float32(), vectors.shape[1]))})  # fmt: skip
    uri = str(tmp_path / "prototype")
    lancedb.connect(uri).create_table("notes", table)
    return uri, vectors


def _import(warehouse: Warehouse, uri: str, *more: str) -> Any:
    return CliRunner().invoke(main, ["import", "lancedb", uri, "--table", "notes", "--tenant", "acme",
                                     "--warehouse", warehouse.uri, *more, "--json"])  # fmt: skip


def test_a_lancedb_collection_comes_in_with_its_vectors_and_the_acls_its_metadata_names(
    demo_policy_warehouse: Warehouse, prototype: tuple[str, np.ndarray], embedder: Embedder, monkeypatch: pytest.MonkeyPatch
):  # fmt: skip
    uri, vectors = prototype
    done = _import(demo_policy_warehouse, uri, "--model", MODEL_NAME,
                   "--acl-from-metadata", "allow=owner_groups,labels=tags,classification=level")  # fmt: skip
    report = json.loads(done.stdout)
    assert done.exit_code == 1, "rows were refused, so the exit says so"
    assert (report["documents"], report["without_acl"], len(report["rejected"])) == (30, 10, 10)
    assert all("p3" in r["source"] and "no ACL" in r["reason"] for r in report["rejected"])
    rows = {row["doc_id"]: row for row in raw_table(demo_policy_warehouse.store).to_arrow().to_pylist()}
    assert sorted(rows) == [f"p{i:02d}" for i in range(30)], "no row without an ACL was written"
    assert np.array_equal(np.asarray(rows["p05"]["vector"], np.float32), vectors[5]), "the vector as it was, not embedded again"
    assert rows["p05"]["acl_allow"] == ["group:hr", "group:hr-managers"] and rows["p05"]["labels"] == ["hr"]
    assert json.loads(rows["p05"]["metadata"])["page"] == 5
    assert json.loads(rows["p05"]["metadata"])["written"] == "2026-11-06T00:00:00+00:00", "a time kept as ISO 8601 text"
    hits = demo_policy_warehouse.search("finance note", subject="user:alice", tenant="acme", k=20)
    assert hits and {hit.doc_id for hit in hits} <= {f"p{i:02d}" for i in range(0, 30, 4)}, "alice reads finance's rows only"


def test_an_import_killed_halfway_and_run_again_writes_only_what_is_missing(
    tmp_path: Path, embedder: Embedder, prototype: tuple[str, np.ndarray]
):
    uri, _ = prototype
    demo_policy_warehouse = Warehouse(Settings(warehouse=str(tmp_path / "warehouse"), import_batch_rows=10), embedder=embedder)
    demo_policy_warehouse.install_policy(policy_file("demo.csv"))  # commits of 10 rows
    tags = AclFromMetadata.parse("allow=owner_groups,classification=level")
    total, batches = lancedb_rows(uri, "notes", batch_rows=5)

    def killed() -> Any:
        for number, batch in enumerate(batches):
            if number == 5:
                raise KeyboardInterrupt  # the process dies here, 25 rows read; what was committed stays
            yield batch

    with pytest.raises(KeyboardInterrupt):
        demo_policy_warehouse.import_collection(killed(), tags=tags, model=MODEL_NAME, origin="lancedb:notes", tenant="acme",
                                                total=total, progress=False)  # fmt: skip
    first = {row["doc_id"] for row in raw_table(demo_policy_warehouse.store).to_arrow().to_pylist()}
    assert len(first) == 20, "the chunks committed before the kill"
    _, again = lancedb_rows(uri, "notes")
    report = demo_policy_warehouse.import_collection(again, tags=tags, model=MODEL_NAME, origin="lancedb:notes", tenant="acme",
                                                     total=total, progress=False)  # fmt: skip
    assert (report.unchanged, report.documents, report.without_acl) == (20, 10, 10)


def test_vectors_another_model_made_are_refused_and_a_model_never_named_is_asked_for(
    demo_policy_warehouse: Warehouse, prototype: tuple[str, np.ndarray]
):
    uri, _ = prototype
    unnamed = _import(demo_policy_warehouse, uri, "--acl-from-metadata", "allow=owner_groups")
    assert unnamed.exit_code == 2 and "name it with --model" in unnamed.output
    other = _import(demo_policy_warehouse, uri, "--model", "openai/text-embedding-3-small", "--classification", "internal",
                    "--acl-from-metadata", "allow=owner_groups")  # fmt: skip
    report = json.loads(other.stdout)
    assert report["documents"] == 0 and all("openai/text-embedding-3-small" in r["reason"] for r in report["rejected"][:30])


def test_a_chroma_collection_comes_in_the_same_way_its_recorded_model_checked(
    demo_policy_warehouse: Warehouse, tmp_path: Path, embedder: Embedder
):
    chromadb = pytest.importorskip("chromadb", reason="the import extra's chromadb is not installed")
    from chromadb.config import Settings as ChromaSettings

    texts = [f"{'finance' if i % 2 == 0 else 'hr'} memo {i}" for i in range(12)]
    vectors = embedder.encode(texts)
    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"), settings=ChromaSettings(anonymized_telemetry=False))
    notes = client.create_collection("memos", embedding_function=None)
    notes.add(ids=[f"m{i:02d}" for i in range(12)], documents=texts, embeddings=vectors,
              metadatas=[{"owner": "group:finance" if i % 2 == 0 else "group:hr", "level": "internal", "tags": "finance" if i % 2 == 0 else "hr"}
                         if i < 10 else {"level": "internal"} for i in range(12)])  # fmt: skip
    args = ["import", "chroma", str(tmp_path / "chroma"), "--collection", "memos", "--tenant", "acme", "--warehouse",
            demo_policy_warehouse.uri, "--acl-from-metadata", "allow=owner,labels=tags,classification=level", "--json"]  # fmt: skip
    unnamed = CliRunner().invoke(main, args)
    assert unnamed.exit_code == 2 and "name it with --model" in unnamed.output, "Chroma recorded no model for these"
    done = CliRunner().invoke(main, [*args, "--model", MODEL_NAME])
    report = json.loads(done.stdout)
    assert (report["documents"], report["without_acl"]) == (10, 2)
    rows = {row["doc_id"]: row for row in raw_table(demo_policy_warehouse.store).to_arrow().to_pylist()}
    assert np.array_equal(np.asarray(rows["m03"]["vector"], np.float32), vectors[3]) and rows["m03"]["acl_allow"] == ["group:hr"]
    hits = demo_policy_warehouse.search("finance memo", subject="user:alice", tenant="acme", k=12)
    assert hits and {hit.doc_id for hit in hits} <= {f"m{i:02d}" for i in range(0, 10, 2)}


def test_a_qdrant_collection_comes_in_the_same_way_its_text_and_metadata_from_the_payload(
    demo_policy_warehouse: Warehouse, tmp_path: Path, embedder: Embedder
):
    pytest.importorskip("qdrant_client", reason="the import extra's qdrant-client is not installed")
    from qdrant_client import QdrantClient, models

    texts = [f"{'finance' if i % 2 == 0 else 'hr'} brief {i}" for i in range(8)]
    vectors = embedder.encode(texts)
    client = QdrantClient(path=str(tmp_path / "qdrant"))
    client.create_collection("briefs", vectors_config=models.VectorParams(size=vectors.shape[1], distance=models.Distance.COSINE))
    client.upsert("briefs", points=[models.PointStruct(id=i, vector=vectors[i].tolist(), payload={
        "page_content": texts[i], "metadata": {"owner": "group:finance" if i % 2 == 0 else "group:hr", "level": "internal",
                                               "tags": "finance" if i % 2 == 0 else "hr"} if i < 7 else {"level": "internal"}})
        for i in range(8)])  # fmt: skip
    client.close()
    done = CliRunner().invoke(main, ["import", "qdrant", str(tmp_path / "qdrant"), "--collection", "briefs", "--tenant", "acme",
                                     "--model", MODEL_NAME, "--warehouse", demo_policy_warehouse.uri, "--json",
                                     "--acl-from-metadata", "allow=owner,labels=tags,classification=level"])  # fmt: skip
    report = json.loads(done.stdout)
    assert (report["documents"], report["without_acl"]) == (7, 1)
    rows = {row["doc_id"]: row for row in raw_table(demo_policy_warehouse.store).to_arrow().to_pylist()}
    assert rows["3"]["text"] == texts[3] and np.array_equal(np.asarray(rows["3"]["vector"], np.float32), vectors[3])
    assert rows["3"]["acl_allow"] == ["group:hr"] and json.loads(rows["3"]["metadata"])["owner"] == "group:hr"


@pytest.mark.filterwarnings("ignore:`langchain-community` is being sunset:DeprecationWarning")
def test_a_langchain_faiss_folder_comes_in_the_same_way_its_pickle_never_run(
    demo_policy_warehouse: Warehouse, tmp_path: Path, embedder: Embedder
):
    pytest.importorskip("langchain_community", reason="the test extra's langchain-community is not installed")
    from langchain_community.vectorstores import FAISS
    from langchain_core.embeddings import Embeddings

    class Warehouses(Embeddings):  # the team embedded with the warehouse's own model
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return embedder.encode(texts).tolist()

        def embed_query(self, text: str) -> list[float]:
            return self.embed_documents([text])[0]

    texts = [f"{'finance' if i % 2 == 0 else 'hr'} minute {i}" for i in range(10)]
    metadatas = [{"owner": "group:finance" if i % 2 == 0 else "group:hr", "level": "internal"} if i < 8 else {"level": "internal"}
                 for i in range(10)]  # fmt: skip
    FAISS.from_texts(texts, Warehouses(), metadatas=metadatas, ids=[f"f{i}" for i in range(10)]).save_local(str(tmp_path / "faiss"))
    args = ["import", "faiss-langchain", str(tmp_path / "faiss"), "--tenant", "acme", "--model", MODEL_NAME, "--warehouse",
            demo_policy_warehouse.uri, "--acl-from-metadata", "allow=owner,classification=level", "--json"]  # fmt: skip
    report = json.loads(CliRunner().invoke(main, args).stdout)
    assert (report["documents"], report["without_acl"]) == (8, 2)
    rows = {row["doc_id"]: row for row in raw_table(demo_policy_warehouse.store).to_arrow().to_pylist()}
    assert rows["f3"]["text"] == texts[3] and rows["f3"]["acl_allow"] == ["group:hr"]
    assert np.allclose(np.asarray(rows["f3"]["vector"], np.float32), embedder.encode([texts[3]])[0], atol=1e-6)
    hits = demo_policy_warehouse.search("finance minute", subject="user:alice", tenant="acme", k=10)
    assert hits and {hit.doc_id for hit in hits} <= {f"f{i}" for i in range(0, 8, 2)}
    again = json.loads(CliRunner().invoke(main, args).stdout)
    assert (again["documents"], again["unchanged"]) == (0, 8), "run again, it finds every row written"


class Armed:
    """What a crafted pickle would run on load: a file written, if ever its reduce were called."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.marker, "ran"))


def test_a_faiss_folder_whose_pickle_names_anything_else_is_refused_and_nothing_runs(tmp_path: Path):
    import pickle

    import faiss

    folder, marker = tmp_path / "faiss", tmp_path / "ran.txt"
    folder.mkdir()
    index = faiss.IndexFlatL2(4)
    index.add(np.ones((1, 4), np.float32))
    faiss.write_index(index, str(folder / "index.faiss"))
    (folder / "index.pkl").write_bytes(pickle.dumps((Armed(marker), {0: "x"})))
    done = CliRunner().invoke(main, ["import", "faiss-langchain", str(folder), "--model", MODEL_NAME, "--classification", "internal",
                                     "--acl-from-metadata", "allow=owner", "--warehouse", str(tmp_path / "warehouse")])  # fmt: skip
    assert done.exit_code != 0 and "pathlib" in done.output and "refused, not loaded" in done.output
    assert not marker.exists(), "the pickle's code never ran"
    (folder / "index.pkl").unlink()
    missing = CliRunner().invoke(main, ["import", "faiss-langchain", str(folder), "--model", MODEL_NAME, "--classification",
                                        "internal", "--acl-from-metadata", "allow=owner", "--warehouse", str(tmp_path / "w")])  # fmt: skip
    assert missing.exit_code != 0 and "holds no index.pkl" in missing.output


def test_a_table_that_is_not_there_is_named_with_the_tables_that_are(demo_policy_warehouse: Warehouse, prototype: tuple[str, np.ndarray]):
    uri, _ = prototype
    done = CliRunner().invoke(main, ["import", "lancedb", uri, "--table", "nope", "--model", MODEL_NAME, "--warehouse",
                                     demo_policy_warehouse.uri, "--acl-from-metadata", "allow=owner_groups"])  # fmt: skip
    assert done.exit_code != 0 and "no table 'nope'" in done.output and "notes" in done.output


def test_a_manifest_gives_acls_by_id_and_by_source_and_an_id_line_wins(tmp_path: Path):
    path = tmp_path / "acl.jsonl"
    path.write_text('{"source": "wiki", "allow": ["group:staff"], "classification": "internal"}\n'
                    '{"id": "p01", "allow": ["group:hr"]}\n', encoding="utf-8")  # fmt: skip
    manifest = AclManifest.read(path)
    row = Collected(id="p01", text="t", vector=np.ones(3, np.float32), metadata={"source": "wiki"})
    assert manifest.tags_of(row) == {"allow": ["group:hr"]}
    assert manifest.tags_of(Collected(id="p02", text="t", vector=np.ones(3, np.float32), metadata={"source": "wiki"}))["allow"] == ["group:staff"]
    assert manifest.tags_of(Collected(id="p03", text="t", vector=np.ones(3, np.float32))) == {}
    path.write_text('{"id": "p01", "source": "wiki"}\n', encoding="utf-8")
    with pytest.raises(InvalidValueError, match="line 1"):
        AclManifest.read(path)


@pytest.mark.parametrize(("spec", "named"), [("labels=tags", "allow=KEY"), ("allow=a,allow=b", "twice"), ("owner=a", "'owner=a'")])
def test_a_mapping_that_cannot_be_followed_is_refused_naming_its_fault(spec: str, named: str):
    with pytest.raises(InvalidValueError, match=named):
        AclFromMetadata.parse(spec)
