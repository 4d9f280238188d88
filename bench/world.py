"""A synthetic permission world for the benchmark: clustered vectors under a realistic ACL structure.

About 50 groups of Zipf-distributed sizes (some nested in others), 20 labels, two tenants and deny
entries; a row's group follows its cluster's "home" group most of the time, so what a subject may
see and what it asks about can be made to correlate (positively, negatively or not at all).
The world is written straight into a ragwarden warehouse (same schema, tags and clause registry
as ingest writes) so the benchmark measures the product's own read path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from ragwarden.governance.policy import Policy
from ragwarden.governance.tags import Classification, clause_token
from ragwarden.state import Store, chunks_schema

from .peer_data import BenchRows, Caller

DIMENSION = 384
GROUPS = 50
LABELS = 20
ZIPF_EXPONENT = 1.5
SELECTIVITIES = (0.5, 0.1, 0.01, 0.001)
CORRELATIONS = ("none", "positive", "negative")
TENANT, OTHER_TENANT = "t1", "t2"
_WRITE_BATCH = 100_000


@dataclass(frozen=True, kw_only=True)
class World:
    """The rows, the policy text, the cluster structure and one subject per target selectivity."""

    rows: BenchRows
    policy_text: str
    centers: np.ndarray  # (clusters, d)
    home_group: np.ndarray  # (clusters,) group index of each cluster's home
    cluster_of: np.ndarray  # (N,) cluster of each row
    subjects: dict[float, str]  # target selectivity -> subject
    seed: int
    query_pool: np.ndarray | None = None  # real query vectors (None: queries are drawn near centres)


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _zipf_shares(count: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, count + 1) ** exponent
    return weights / weights.sum()


def _nesting() -> dict[int, int]:
    """Child group -> parent group: members of a child read what its parent reads (Casbin g)."""
    return {child: child - 30 for child in range(40, GROUPS)}


def generate(n: int, *, seed: int = 7, clusters: int | None = None) -> World:
    """A world of ``n`` rows; the same seed gives the same world."""
    rng = np.random.default_rng(seed)
    clusters = clusters or max(16, n // 1000)
    centers = _unit(rng.standard_normal((clusters, DIMENSION)))
    cluster_of = rng.integers(0, clusters, n)
    vectors = np.empty((n, DIMENSION), dtype=np.float32)
    for start in range(0, n, _WRITE_BATCH):
        part = cluster_of[start : start + _WRITE_BATCH]
        noise = rng.standard_normal((len(part), DIMENSION)).astype(np.float32) * 0.06
        vectors[start : start + len(part)] = _unit(centers[part] + noise)
    return _governed(rng, [f"r{i:07d}" for i in range(n)], vectors, centers, cluster_of, seed=seed)


def from_embeddings(
    ids: list[str], vectors: np.ndarray, query_vectors: np.ndarray, *, seed: int = 7, clusters: int = 64
) -> World:
    """A world over real embeddings (SciFact's): k-means clusters stand in for the synthetic ones,
    access is drawn exactly as ``generate`` draws it, and queries come from ``query_vectors``."""
    rng = np.random.default_rng(seed)
    vectors = _unit(np.asarray(vectors, dtype=np.float32))
    centers, cluster_of = _kmeans(vectors, clusters, rng)
    world = _governed(rng, ids, vectors, centers, cluster_of, seed=seed)
    return replace(world, query_pool=_unit(np.asarray(query_vectors, dtype=np.float32)))


def _kmeans(vectors: np.ndarray, clusters: int, rng: np.random.Generator, rounds: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Spherical k-means: unit centres and each row's cluster."""
    centers = vectors[rng.choice(len(vectors), clusters, replace=False)]
    for _ in range(rounds):
        cluster_of = np.argmax(vectors @ centers.T, axis=1)
        for c in range(clusters):
            members = vectors[cluster_of == c]
            if len(members):
                centers[c] = members.sum(axis=0)
        centers = _unit(centers)
    return centers, np.argmax(vectors @ centers.T, axis=1)


def _governed(
    rng: np.random.Generator, ids: list[str], vectors: np.ndarray, centers: np.ndarray, cluster_of: np.ndarray,
    *, seed: int,
) -> World:  # fmt: skip
    """Groups, tenants, labels, classifications and denies drawn for each row, and the policy."""
    n = len(ids)
    clusters = len(centers)
    shares = _zipf_shares(GROUPS, ZIPF_EXPONENT)
    home_group = rng.choice(GROUPS, clusters, p=shares)
    at_home = rng.random(n) < 0.7
    group_of = np.where(at_home, home_group[cluster_of], rng.choice(GROUPS, n, p=shares))
    tenant = np.where(rng.random(n) < 0.9, TENANT, OTHER_TENANT)
    has_label = rng.random(n) < 0.3
    label_of = rng.choice(LABELS, n, p=_zipf_shares(LABELS, 1.0))
    classification = rng.choice(4, n, p=[0.3, 0.4, 0.2, 0.1]).astype(np.int8)
    denied = rng.random(n) < 0.01
    deny_target = rng.integers(0, 8, n)

    rows = BenchRows(
        ids=ids,
        vectors=vectors,
        tenant=tenant.tolist(),
        acl_allow=[[f"group:g{g}"] for g in group_of.tolist()],
        acl_deny=[[f"user:s{d}"] if x else [] for x, d in zip(denied.tolist(), deny_target.tolist(), strict=True)],
        labels=[[f"l{label}"] if x else [] for x, label in zip(has_label.tolist(), label_of.tolist(), strict=True)],
        classification=classification,
    )
    subjects, lines = _subjects(rows, group_of, tenant, denied, deny_target)
    return World(
        rows=rows,
        policy_text="\n".join(lines) + "\n",
        centers=centers,
        home_group=home_group,
        cluster_of=cluster_of,
        subjects=subjects,
        seed=seed,
    )


def _subjects(
    rows: BenchRows, group_of: np.ndarray, tenant: np.ndarray, denied: np.ndarray, deny_target: np.ndarray
) -> tuple[dict[float, str], list[str]]:
    """One subject per target selectivity (groups chosen greedily, nesting counted), and the policy."""
    nesting = _nesting()
    lines = ["# synthetic benchmark policy: 50 groups (10 nested), 20 labels, two tenants"]
    lines += [f"g, group:g{child}, group:g{parent}, {TENANT}" for child, parent in nesting.items()]
    for label in range(LABELS):
        lines.append(f"p, group:g{label}, {TENANT}, label:l{label}, read, allow")
    n = len(group_of)
    in_tenant = tenant == TENANT
    subjects: dict[float, str] = {}
    for index, target in enumerate(SELECTIVITIES):
        subject = f"user:s{index}"
        chosen: list[int] = []
        for group in np.argsort(-np.bincount(group_of, minlength=GROUPS)).tolist():
            reach = {group, *([nesting[group]] if group in nesting else [])}
            share = np.count_nonzero(np.isin(group_of, [*chosen, *reach]) & in_tenant) / n
            if share <= target * 1.15:
                chosen.extend(reach)
                if share >= target * 0.85:
                    break
        lines += [f"g, {subject}, group:g{g}, {TENANT}" for g in sorted(set(chosen))]
        lines += [f"p, {subject}, {TENANT}, label:l{label}, read, allow" for label in range(LABELS - 2)]
        lines.append(f"p, {subject}, {TENANT}, classification:restricted, read, allow")
        subjects[target] = subject
    return subjects, lines


def _level(clearance: Classification | None) -> int:
    """A clearance as the peers compare it: -1 when a deny on public leaves nothing readable."""
    return -1 if clearance is None else int(clearance)


def caller_of(world: World, subject: str, policy: Policy) -> Caller:
    """The subject as the peers see it: its principals, cleared labels and clearance, from the policy."""
    return Caller(
        tenant=TENANT,
        principals=policy.principals(subject, TENANT),
        cleared_labels=frozenset(
            f"l{label}" for label in range(LABELS) if policy.label_allowed(subject, TENANT, f"l{label}")
        ),
        clearance=_level(policy.clearance(subject, TENANT)),
    )


def queries(world: World, subject: str, policy: Policy, correlation: str, count: int, *, seed: int) -> np.ndarray:
    """Queries about any cluster (none), about clusters whose home group the subject reads
    (positive), or about clusters whose home group it does not (negative): drawn near the centres,
    or, for a world of real embeddings, picked from its real queries by their nearest centre."""
    rng = np.random.default_rng(seed)
    principals = policy.principals(subject, TENANT)
    readable = np.array([f"group:g{g}" in principals for g in world.home_group])
    if world.query_pool is not None:
        about = np.argmax(world.query_pool @ world.centers.T, axis=1)
        wanted = {"positive": readable[about], "negative": ~readable[about]}.get(correlation)
        pool = np.flatnonzero(wanted) if wanted is not None and wanted.any() else np.arange(len(about))
        picked = rng.choice(pool, count, replace=len(pool) < count)
        return world.query_pool[picked]
    if correlation == "positive" and readable.any():
        pool = np.flatnonzero(readable)
    elif correlation == "negative" and (~readable).any():
        pool = np.flatnonzero(~readable)
    else:
        pool = np.arange(len(world.centers))
    picked = rng.choice(pool, count)
    noise = rng.standard_normal((count, DIMENSION)).astype(np.float32) * 0.06
    return _unit(world.centers[picked] + noise)


def write_warehouse(world: World, folder: Path, *, extra: BenchRows | None = None) -> Store:
    """The world's rows as a ragwarden ``chunks`` table (one document per row), its clause
    registry and its policy, in ``folder``."""
    store = Store(str(folder), dimension=DIMENSION)
    append_rows(store, world.rows)
    store.policies.install(Policy.from_text(world.policy_text, source="bench world"))
    return store


METADATA_BUCKETS = 100


def append_rows(
    store: Store, rows: BenchRows, *, register_labels: bool = True, metadata: list[str] | None = None,
    texts: list[str] | None = None,
) -> None:  # fmt: skip
    """Append rows with tags and clause tokens exactly as ingest writes them (``register_labels``
    False writes them as a writer racing the label registry would); ``metadata`` (JSON texts) and
    ``texts``, one per row, replace the default ones."""
    tokens = [clause_token(allow) for allow in rows.acl_allow]
    store.registries.register_clauses({token: allow for token, allow in zip(tokens, rows.acl_allow, strict=True)})
    if register_labels:
        store.registries.register_labels(label for labels in rows.labels for label in labels)
    schema = chunks_schema(DIMENSION)
    now = datetime.now(UTC)
    n = len(rows.ids)
    for start in range(0, n, _WRITE_BATCH):
        end = min(n, start + _WRITE_BATCH)
        ids = rows.ids[start:end]
        flat = pa.array(rows.vectors[start:end].reshape(-1), type=pa.float32())
        columns = {
            "chunk_id": ids,
            "doc_id": ids,
            "source_uri": [f"bench://{i}" for i in ids],
            "doc_version": ["v1"] * len(ids),
            "kind": ["chunk"] * len(ids),
            "position": [0] * len(ids),
            "text": texts[start:end] if texts is not None else [f"synthetic row {i}" for i in ids],
            "vector": pa.FixedSizeListArray.from_arrays(flat, DIMENSION),
            "tenant": rows.tenant[start:end],
            "acl_allow": rows.acl_allow[start:end],
            "acl_deny": rows.acl_deny[start:end],
            "acl_clauses": [[t] for t in tokens[start:end]],
            "labels": rows.labels[start:end],
            "classification": rows.classification[start:end],
            "parents": [[] for _ in ids],
            "ingest_run_id": ["bench"] * len(ids),
            "embedding_model": ["synthetic"] * len(ids),
            "created_at": [now] * len(ids),
            # what a narrowing filter can select: a row's place modulo 100 (1%, 10%, ... of the world)
            "metadata": metadata[start:end] if metadata is not None
            else [f'{{"bucket": {row % METADATA_BUCKETS}}}' for row in range(start, end)],
        }
        store.chunks.load_rows(pa.table(columns, schema=schema))
