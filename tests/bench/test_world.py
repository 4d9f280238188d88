"""The benchmark's worlds: one over real embeddings keeps its vectors and asks its own queries."""

from __future__ import annotations

import numpy as np

from ragwarden.bench.world import TENANT, from_embeddings, generate, queries
from ragwarden.governance.policy import Policy


def test_a_world_over_real_embeddings_asks_its_own_queries_by_correlation():
    donor = generate(2_000, seed=3)  # clustered unit vectors standing in for real embeddings
    pool = donor.rows.vectors[:300] + 0.01
    world = from_embeddings([f"d{i}" for i in range(1_700)], donor.rows.vectors[300:], pool, clusters=32)
    policy = Policy.from_text(world.policy_text, source="world")
    subject = world.subjects[0.1]
    principals = policy.principals(subject, TENANT)
    readable = np.array([f"group:g{g}" in principals for g in world.home_group])
    unit_pool = pool / np.linalg.norm(pool, axis=1, keepdims=True)
    assert world.rows.ids[0] == "d0" and np.allclose(world.rows.vectors, donor.rows.vectors[300:], atol=1e-6)
    for correlation, wanted in (("positive", True), ("negative", False)):
        asked = queries(world, subject, policy, correlation, 20, seed=1)
        assert all(np.isclose(unit_pool @ q, 1.0, atol=1e-5).any() for q in asked)  # each is one of the pool
        about = np.argmax(asked @ world.centers.T, axis=1)
        assert (readable[about] == wanted).all()
