"""Fixtures for retrieval: the demo warehouse and an oracle of what each subject may read."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ragwarden.governance.visibility import check_row
from ragwarden.warehouse import Warehouse


@pytest.fixture(scope="session")
def demo_rows(demo_warehouse: Warehouse) -> list[dict]:
    """Every chunk of the demo warehouse, vectors included."""
    return demo_warehouse.store.chunks.search().limit(None).to_list()


@pytest.fixture(scope="session")
def visible_to(demo_warehouse: Warehouse, demo_rows: list[dict]) -> Callable[[str, str], list[dict]]:
    """The rows a subject may read, asked of the enforcer row by row over the whole table."""
    policy = demo_warehouse.policy
    registry = demo_warehouse.store.clause_registry()

    def visible(subject: str, tenant: str) -> list[dict]:
        return [row for row in demo_rows if check_row(policy, subject, tenant, row, registry).allowed]

    return visible
