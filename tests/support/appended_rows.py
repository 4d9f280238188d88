"""Rows appended to a benchmark world's warehouse after it was indexed, as a racing writer would."""

from __future__ import annotations

import numpy as np

from ragwarden.bench.peer_data import BenchRows
from ragwarden.bench.world import TENANT, World
from ragwarden.warehouse import Warehouse


def new_rows(world: World, count: int, allow: str, *, labels: list[str] | None = None, seed: int = 1) -> BenchRows:
    """``count`` rows readable by ``allow``, each close to an existing row of the world."""
    rng = np.random.default_rng(seed)
    base = world.rows.vectors[rng.choice(len(world.rows.ids), count, replace=False)]
    vectors = base + rng.standard_normal(base.shape).astype(np.float32) * 0.01
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    return BenchRows(
        ids=[f"appended-{seed}-{i}" for i in range(count)], vectors=vectors, tenant=[TENANT] * count,
        acl_allow=[[allow]] * count, acl_deny=[[] for _ in range(count)],
        labels=[list(labels or []) for _ in range(count)], classification=np.zeros(count, dtype=np.int8),
    )  # fmt: skip


def group_of(warehouse: Warehouse, subject: str) -> str:
    """One group ``subject`` reads through."""
    assert warehouse.policy is not None
    return min(p for p in warehouse.policy.principals(subject, TENANT) if p.startswith("group:"))
