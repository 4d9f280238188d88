"""Shared fixtures, named for the state they hand over."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.demo_world import demo_world

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The packaged model, loaded once for the whole run."""
    return Embedder()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared data sets (RAGWARDEN_DATA, default ../shared/data beside the checkout)."""
    return Path(os.environ.get("RAGWARDEN_DATA") or REPO.parent / "shared" / "data")


@pytest.fixture
def fresh_warehouse(tmp_path: Path, embedder: Embedder) -> Warehouse:
    """An empty warehouse with no policy at all (nothing is visible)."""
    return Warehouse(Settings(warehouse=str(tmp_path / "warehouse")), embedder=embedder)


@pytest.fixture
def demo_policy_warehouse(tmp_path: Path, embedder: Embedder) -> Warehouse:
    """An empty warehouse whose installed policy is the demo policy."""
    warehouse = Warehouse(Settings(warehouse=str(tmp_path / "warehouse")), embedder=embedder)
    warehouse.install_policy(policy_file("demo.csv"))
    return warehouse


@pytest.fixture(scope="session")
def demo_warehouse(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Warehouse:
    """The demo corpus ingested under the demo policy; shared, so tests must only read it."""
    return demo_world(tmp_path_factory.mktemp("demo"), embedder)


BASE_RECORD: dict[str, Any] = {
    "id": "doc-1",
    "text": "The quarterly budget review is on Thursday.",
    "tenant": "acme",
    "acl": {"allow": ["group:finance"], "deny": []},
    "labels": ["finance"],
    "classification": "internal",
    "uri": "test://doc-1",
}


@pytest.fixture
def make_record() -> Callable[..., dict[str, Any]]:
    """Build a valid JSONL-shaped record, with keyword overrides (None removes a key)."""

    def build(**overrides: Any) -> dict[str, Any]:
        record = copy.deepcopy(BASE_RECORD)
        for key, value in overrides.items():
            if value is None:
                record.pop(key, None)
            else:
                record[key] = value
        return record

    return build
