"""Retrieval quality is not lost to governance: SciFact nDCG@10 through the governed path.

The published figure for all-MiniLM-L6-v2 with exact search is 0.6451; ingest chunks by the
model's tokenizer and search goes through the compiled filter and the post-check.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ragwarden.bench import scifact as sf
from ragwarden.config import Settings
from ragwarden.governance.policy import Policy
from ragwarden.warehouse import Warehouse

pytestmark = [pytest.mark.slow, pytest.mark.data, pytest.mark.quality]


@pytest.fixture(scope="module")
def scifact(data_dir: Path) -> Path:
    folder = data_dir / "scifact"
    if not (folder / "corpus.jsonl").is_file():
        pytest.skip(f"SciFact not found at {folder} (set RAGWARDEN_DATA to the shared data folder)")
    return folder


def test_scifact_ndcg_at_10_through_governed_search(scifact, tmp_path, embedder, record_property):
    policy_path = tmp_path / "policy.csv"
    policy_path.write_text(sf.POLICY, encoding="utf-8")
    warehouse = Warehouse(Settings(warehouse=str(tmp_path / "wh"), policy=str(policy_path)), embedder=embedder)
    assert isinstance(warehouse.policy, Policy)

    report = warehouse.ingest_records(sf.records(scifact))
    assert report.ok and report.documents == sf.CORPUS_SIZE

    queries, qrels = sf.judged_queries(scifact)
    ndcg = sf.governed_ndcg_at_10(warehouse, queries, qrels)
    record_property("scifact_ndcg_at_10", round(ndcg, 4))
    print(f"SciFact: {report.documents} documents, {report.chunks} chunks, ingest {report.seconds:.0f} s, nDCG@10 = {ndcg:.4f}")
    assert len(qrels) == sf.TEST_QUERIES
    assert ndcg >= 0.64
