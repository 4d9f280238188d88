"""States the framework stores are tested in: an empty warehouse whose policy lets a team write,
erase and read in one tenant, and an outsider read there."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.team_policy import TEAM_POLICY

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.warehouse import Warehouse


@pytest.fixture
def team_warehouse(tmp_path: Path, embedder: Embedder) -> Warehouse:
    """An empty warehouse where ada and ben (the team) may write, erase and read in tenant shop,
    and olga may only read what is allowed to her."""
    warehouse = Warehouse(Settings(warehouse=str(tmp_path / "warehouse")), embedder=embedder)
    policy = tmp_path / "team.csv"
    policy.write_text(TEAM_POLICY, encoding="utf-8")
    warehouse.install_policy(policy)
    return warehouse
