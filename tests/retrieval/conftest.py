"""Fixtures for retrieval: the demo warehouse, an oracle of what each subject may read, and a
synthetic world written with its scalar and vector indexes built."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.built import Built
from support.raw_tables import raw_table

from ragwarden.bench.world import World, generate, write_warehouse
from ragwarden.config import Settings
from ragwarden.governance.visibility import check_row
from ragwarden.warehouse import Warehouse


@pytest.fixture(scope="session")
def demo_rows(demo_warehouse: Warehouse) -> list[dict]:
    """Every chunk of the demo warehouse, vectors included."""
    return raw_table(demo_warehouse.store).search().limit(None).to_list()


@pytest.fixture(scope="session")
def visible_to(demo_warehouse: Warehouse, demo_rows: list[dict]) -> Callable[[str, str], list[dict]]:
    """The rows a subject may read, asked of the enforcer row by row over the whole table."""
    policy = demo_warehouse.policy
    registry = demo_warehouse.store.registries.clauses()

    def visible(subject: str, tenant: str) -> list[dict]:
        return [row for row in demo_rows if check_row(policy, subject, tenant, row, registry).allowed]

    return visible


@pytest.fixture(scope="session")
def small_world() -> World:
    return generate(3_000, seed=4)


@pytest.fixture
def indexed_warehouse(small_world: World, built: Built, tmp_path: Path) -> Warehouse:
    """The world written, scalar and vector indexes built (the row floor lowered to fit a test):
    built once, a copy of its own for each test."""

    def build(folder: Path) -> None:
        store = write_warehouse(small_world, folder)
        report = store.maintenance.optimize(vector_index_min_rows=1_000)
        assert report.vector_index is not None and store.chunks.has_vector_index()

    return Warehouse(Settings(warehouse=built.copy("indexed", build, tmp_path / "wh")), embedder=None)  # type: ignore[arg-type]
