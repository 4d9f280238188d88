"""The demo world (demo corpus under the demo policy) built in a folder of the caller's choosing."""

from __future__ import annotations

from pathlib import Path

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse

REPO = Path(__file__).resolve().parents[2]
DEMO_CORPUS = REPO / "examples" / "demo" / "corpus.jsonl"


def demo_world(folder: Path, embedder: Embedder, *, audit_key: bytes | None = None) -> Warehouse:
    """A warehouse in `folder` holding the demo corpus, ingested under the demo policy (its
    receipts hashed under ``audit_key``, when given)."""
    return with_demo_corpus(Warehouse(Settings(warehouse=str(folder / "warehouse"), audit_key=audit_key), embedder=embedder))


def with_demo_corpus(warehouse: Warehouse) -> Warehouse:
    """``warehouse`` (empty) given the demo policy and the demo corpus."""
    warehouse.install_policy(policy_file("demo.csv"))
    report = warehouse.ingest(DEMO_CORPUS)
    assert report.ok, report.rejected
    return warehouse
