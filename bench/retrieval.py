"""Governed retrieval side by side with its peers, on one synthetic world and one set of queries.

Systems: ragwarden governed search (indexed prefilter, planner, post-check, receipt); the same
table with no filter (the speed reference); "k then drop" (unfiltered top-k' then a Casbin check
per row, k' = k and 10k); exact numpy search over the permitted rows (ground truth and the
memory-bandwidth floor); and the peers of ``peers.py`` that are installed.
"""

from __future__ import annotations

import gc
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragwarden.config import Settings
from ragwarden.governance.caller import Caller as WarehouseCaller
from ragwarden.governance.policy import Policy
from ragwarden.governance.visibility import check_row
from ragwarden.retrieval.hits import Hit
from ragwarden.retrieval.search import INDEX_NPROBES, INDEX_REFINE_FACTOR, RESULT_COLUMNS, Searcher
from ragwarden.retrieval.serving import store_artifact
from ragwarden.warehouse import Warehouse

from .peer_data import Caller, RowIndex, row_index
from .peers import available_peers
from .world import CORRELATIONS, TENANT, World, append_rows, caller_of, queries, write_warehouse

K = 10


@dataclass(kw_only=True)
class Cell:
    """One system at one (N, selectivity, correlation): its figures."""

    system: str
    n: int
    selectivity: float
    visible_share: float
    correlation: str
    p50_ms: float
    p95_ms: float
    qps: float
    recall: float
    k_fill: float
    leaks: int
    extra: dict[str, Any] = field(default_factory=dict)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def exact_top(vectors: np.ndarray, mask: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    """Row numbers of the exact top-k among rows where ``mask`` holds (ground truth)."""
    visible = int(np.count_nonzero(mask))
    if visible == 0:
        return np.flatnonzero(mask)
    scores = np.where(mask, vectors @ query, -np.inf)
    take = min(k, visible)
    best = np.argpartition(-scores, take - 1)[:take]
    return best[np.argsort(-scores[best])]


def _measure(search: Callable[[np.ndarray], list[str]], qs: np.ndarray) -> tuple[list[list[str]], list[float], float]:
    """Answers and latencies of each query, after one warm-up query whose latency is returned
    apart (the cold cost: caches filled, pages read, indexes loaded)."""
    started = time.perf_counter()
    search(qs[0])
    cold = time.perf_counter() - started
    answers, latencies = [], []
    for q in qs:
        started = time.perf_counter()
        answers.append(search(q))
        latencies.append(time.perf_counter() - started)
    return answers, latencies, cold


def _score(
    system: str, world: World, mask: np.ndarray, index_of: dict[str, int], truth: list[np.ndarray],
    answers: list[list[str]], latencies: list[float], cold: float, selectivity: float, correlation: str,
) -> Cell:  # fmt: skip
    recalls, fills, leaks = [], [], 0
    for answer, expected in zip(answers, truth, strict=True):
        rows = [index_of[i] for i in answer]
        leaks += sum(1 for r in rows if not mask[r])
        if len(expected):
            recalls.append(len(set(rows[:K]) & set(expected.tolist())) / len(expected))
        if len(expected) >= K:
            fills.append(len(answer) >= K)
    latency = np.array(latencies) * 1000
    return Cell(
        system=system,
        n=len(world.rows.ids),
        selectivity=selectivity,
        visible_share=float(mask.mean()),
        correlation=correlation,
        p50_ms=float(np.percentile(latency, 50)),
        p95_ms=float(np.percentile(latency, 95)),
        qps=float(1000 / latency.mean()),
        recall=float(np.mean(recalls)) if recalls else 1.0,
        k_fill=float(np.mean(fills)) if fills else 1.0,
        leaks=leaks,
        extra={"cold_ms": cold * 1000},
    )


class RagwardenSystems:
    """ragwarden's own systems over one warehouse: governed, unfiltered, k-then-drop."""

    def __init__(self, world: World, folder: Path) -> None:
        started = time.perf_counter()
        store = write_warehouse(world, folder)
        self.write_seconds = time.perf_counter() - started
        self.index_report = store.maintenance.optimize()
        started = time.perf_counter()
        stored = store_artifact(store.read_doors()) if store.chunks.has_vector_index() else None
        self.serving_build_seconds = time.perf_counter() - started if stored is not None else None
        self.warehouse = Warehouse(Settings(warehouse=str(folder)), embedder=None)  # type: ignore[arg-type]
        self.store = self.warehouse.store
        self.policy = self.warehouse.policy
        self.searcher = self.warehouse._searcher
        self.serving: dict[str, Any] = {}
        if stored is not None:  # a replica's cold start: the stored artifact loaded, then one search
            started = time.perf_counter()
            loaded = self.searcher.serving.build_now()
            self.serving = {"build_seconds": self.serving_build_seconds, "load_seconds": time.perf_counter() - started,
                            "rows": loaded.rows, "bytes": loaded.nbytes, "version": loaded.version}  # fmt: skip

    def governed(self, subject: str, searcher: Searcher | None = None) -> Callable[[np.ndarray], list[str]]:
        """Compiled prefilter, planned search, post-check: the search of ``Warehouse.search``
        without its audit receipt, whose cost the stage breakdown reports on its own."""
        searcher = searcher or self.searcher
        caller = WarehouseCaller(subject=subject, tenant=TENANT)

        def search(q: np.ndarray) -> list[str]:
            with self.store.pinned():  # one freshness check per search, as the permission gate takes it
                found = searcher.search("benchmark query", policy=self.policy, caller=caller, k=K, vector=q)
            return [h.chunk_id for h in found.hits]

        return search

    def forced(self, plan: str) -> Searcher:
        """A searcher that always takes one plan ("flat", "index": Lance's vector index, or
        "resident": the serving index), to measure the crossover."""
        if plan == "resident":
            searcher = Searcher(self.store.read_doors(), None, flat_max_rows=-1, resident_index_bytes=2**40)  # type: ignore[arg-type]
            searcher.serving.build_now()
            return searcher
        return Searcher(self.store.read_doors(), None, flat_max_rows=10**12 if plan == "flat" else -1)  # type: ignore[arg-type]

    def _unfiltered(self, q: np.ndarray, limit: int, columns: list[str]) -> list[dict[str, Any]]:
        indexed = self.store.chunks.has_vector_index()
        return self.store.chunks.nearest(q, where=None, limit=limit, columns=columns, exact=not indexed,
                                  nprobes=INDEX_NPROBES, refine_factor=INDEX_REFINE_FACTOR)  # fmt: skip

    def unfiltered(self) -> Callable[[np.ndarray], list[str]]:
        """The same columns a governed search returns (a RAG caller needs the text), no filter."""
        return lambda q: [row["chunk_id"] for row in self._unfiltered(q, K, RESULT_COLUMNS)]

    def k_then_drop(self, subject: str, factor: int) -> Callable[[np.ndarray], list[str]]:
        columns = RESULT_COLUMNS

        def search(q: np.ndarray) -> list[str]:
            registry = self.store.registries.clauses()
            rows = self._unfiltered(q, K * factor, columns)
            kept = [r["chunk_id"] for r in rows if check_row(self.policy, subject, TENANT, r, registry).allowed]
            return kept[:K]

        return search

    def stages(self, subject: str, qs: np.ndarray) -> dict[str, float]:
        """Median milliseconds of each stage of a governed search: the freshness check (the
        versions every read depends on, once per search, as the permission gate takes it), the
        cached compile (the filter cache lookup), plan and search, the post-check's decisions,
        building the hits, receipt. The freshness check is timed on its own so the lookup is not
        charged with it, and the hits apart from the check, since any search, governed or not,
        builds its results."""
        timings: dict[str, list[float]] = {
            "freshness check": [], "compile": [], "search": [], "check": [], "hits": [], "receipt": []
        }  # fmt: skip
        from ragwarden.governance.audit import Receipt

        view = self.searcher.view(self.policy, WarehouseCaller(subject=subject, tenant=TENANT))
        for q in qs:
            t0 = time.perf_counter()
            with self.store.pinned():
                registries = self.store.registries.current()
                t1 = time.perf_counter()
                where = self.searcher.prefilter(view, registries)
                t2 = time.perf_counter()
                ranked, version = self.searcher.rank("q", q, where, K, "vector")
                t3 = time.perf_counter()
                admitted, _ = self.searcher.admitted(ranked, view, registries.clauses)
                t4 = time.perf_counter()
            hits = [Hit.of_row(row, score=score, reason=reason, table_version=version, policy_version=self.policy.version)
                    for row, score, reason in admitted]  # fmt: skip
            t4b = time.perf_counter()
            self.warehouse.audit.append(
                Receipt(kind="retrieval", operation="search", subject=subject, tenant=TENANT, allowed=True,
                        reason="stage timing", chunk_ids=tuple(h.chunk_id for h in hits))
            )  # fmt: skip
            t5 = time.perf_counter()
            spans = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4b - t4, t5 - t4b)
            for name, seconds in zip(timings, spans, strict=True):
                timings[name].append(seconds * 1000)
        return {name: float(np.median(values)) for name, values in timings.items()}


def _numpy(world: World, mask: np.ndarray) -> Callable[[np.ndarray], list[str]]:
    permitted = np.flatnonzero(mask)
    subset = np.ascontiguousarray(world.rows.vectors[permitted])
    ids = world.rows.ids

    def search(q: np.ndarray) -> list[str]:
        if len(permitted) == 0:
            return []
        scores = subset @ q
        take = min(K, len(permitted))
        best = np.argpartition(-scores, take - 1)[:take]
        return [ids[permitted[i]] for i in best[np.argsort(-scores[best])]]

    return search


def run_world(
    world: World, *, data: str, queries_per_cell: int, workdir: Path, peers: Collection[str] | None = None,
    log: Callable[[str], None] = print, ours: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Every system at every selectivity and correlation on one world (``data`` names its vectors:
    "synthetic" or the data set's); ``peers`` names the peers to run (None: every one installed).
    ``ours`` False runs the peers alone (and the exact numpy scan), against the same callers, queries
    and exact answers: a peer measured where building ragwarden's side again would add nothing."""
    n = len(world.rows.ids)
    index: RowIndex = row_index(world.rows)
    index_of = {chunk_id: i for i, chunk_id in enumerate(world.rows.ids)}
    rw: RagwardenSystems | None = None
    builds: dict[str, float] = {}
    memory: dict[str, float] = {}
    sizes: dict[str, int] = {}
    if ours:
        folder = workdir / f"ragwarden-{data}-{n}"
        shutil.rmtree(folder, ignore_errors=True)
        rw = RagwardenSystems(world, folder)
        log(f"N={n}: written in {rw.write_seconds:.1f} s; indexes {rw.index_report.seconds}")
        builds["ragwarden"] = sum(rw.index_report.seconds.values())
        memory["ragwarden"] = _peak_rss_mb()
        if rw.serving:
            sizes["ragwarden serving index"] = int(rw.serving["bytes"])
    policy = rw.policy if rw is not None else Policy.from_text(world.policy_text)
    assert policy is not None
    cells: list[Cell] = []
    stages: dict[str, dict[str, float]] = {}
    callers: dict[float, tuple[str, Caller, np.ndarray]] = {}
    for target, subject in world.subjects.items():
        caller = caller_of(world, subject, policy)
        callers[target] = (subject, caller, index.visible(caller))

    truths: dict[tuple[float, str], tuple[np.ndarray, list[np.ndarray]]] = {}

    def cell_queries(target: float, correlation: str) -> tuple[np.ndarray, list[np.ndarray]]:
        """The cell's queries and their exact permitted top-k, computed once for every system."""
        if (target, correlation) not in truths:
            subject, _, mask = callers[target]
            qs = queries(world, subject, policy, correlation, queries_per_cell, seed=int(target * 1e4) + 1)
            truths[target, correlation] = (qs, [exact_top(world.rows.vectors, mask, q, K) for q in qs])
        return truths[target, correlation]

    def run_system(name: str, make: Callable[[str, Caller, np.ndarray], Callable[[np.ndarray], list[str]]]) -> None:
        log(f"N={n}: {name}")
        for target, (subject, caller, mask) in callers.items():
            search = make(subject, caller, mask)
            for correlation in CORRELATIONS:
                qs, truth = cell_queries(target, correlation)
                answers, latencies, cold = _measure(search, qs)
                cells.append(_score(name, world, mask, index_of, truth, answers, latencies, cold, target, correlation))
        gc.collect()

    if rw is not None:
        run_system("ragwarden", lambda s, c, m: rw.governed(s))
        if rw.store.chunks.has_vector_index():
            for plan in ("flat", "index", "resident"):
                searcher = rw.forced(plan)
                run_system(f"ragwarden {plan} only", lambda s, c, m, searcher=searcher: rw.governed(s, searcher))
        run_system("unfiltered", lambda s, c, m: rw.unfiltered())
        run_system("k-then-drop k'=k", lambda s, c, m: rw.k_then_drop(s, 1))
        run_system("k-then-drop k'=10k", lambda s, c, m: rw.k_then_drop(s, 10))
        run_system("k-then-drop k'=2k/s", lambda s, c, m: rw.k_then_drop(s, max(10, round(2 / max(m.mean(), 1e-6)))))
    run_system("numpy exact", lambda s, c, m: _numpy(world, m))
    if rw is not None:
        for target, (subject, _, _) in callers.items():
            qs = queries(world, subject, policy, "none", queries_per_cell, seed=99)
            stages[str(target)] = rw.stages(subject, qs)
    skipped: dict[str, str] = {}
    for name, factory, reason in available_peers():
        if peers is not None and name not in peers:
            skipped[name] = "not selected (--peers)"
            continue
        if factory is None:
            skipped[name] = reason
            continue
        peer = factory()
        if peer.max_rows is not None and n > peer.max_rows:
            skipped[name] = f"runs up to {peer.max_rows:,} rows"
            continue
        peer_dir = Path(tempfile.mkdtemp(dir=workdir))
        started = time.perf_counter()
        peer.build(world.rows, peer_dir)
        builds[name] = time.perf_counter() - started
        if getattr(peer, "size_bytes", 0):
            sizes[name] = int(peer.size_bytes)
        log(f"N={n}: {name} built in {builds[name]:.1f} s")
        run_system(name, lambda s, c, m, peer=peer: (lambda q: peer.search(q, K, c)))
        for value in getattr(peer, "tunings", ()):  # a peer that trades latency for recall, tuned as its users would
            run_system(peer.tune(value), lambda s, c, m, peer=peer: (lambda q: peer.search(q, K, c)))
        memory[name] = _peak_rss_mb()
        peer.close()
        shutil.rmtree(peer_dir, ignore_errors=True)
    appended = appended_rows_found(rw, world) if rw is not None else {}
    return {
        "n": n,
        "data": data,
        "visible_share": {str(t): float(m.mean()) for t, (_, _, m) in callers.items()},
        "cells": [cell.__dict__ for cell in cells],
        "build_seconds": builds,
        "index_report": rw.index_report.seconds if rw is not None else {},
        "serving_index": rw.serving if rw is not None else None,
        "index_bytes": sizes,
        "peak_rss_mb_after": memory,
        "stages_ms": stages,
        "appended_rows": appended,
        "skipped": skipped,
    }


def appended_rows_found(rw: RagwardenSystems, world: World) -> dict[str, Any]:
    """Rows appended after the indexes were built (not optimized in) are filtered and found like
    indexed ones: each new row's own vector, searched by a subject who may read it, returns it
    first; searched by one who may not, never."""
    count = min(200, max(20, len(world.rows.ids) // 1000))
    rng = np.random.default_rng(11)
    picks = rng.choice(len(world.rows.ids), count, replace=False)
    vectors = world.rows.vectors[picks] + rng.standard_normal((count, world.rows.vectors.shape[1])) * 0.01
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    reader, outsider = world.subjects[0.5], world.subjects[0.001]
    allow = "group:" + next(p.split(":", 1)[1] for p in sorted(rw.policy.principals(reader, TENANT)) if p.startswith("group:"))
    from .peer_data import BenchRows

    new = BenchRows(
        ids=[f"appended-{i}" for i in range(count)], vectors=vectors, tenant=[TENANT] * count,
        acl_allow=[[allow]] * count, acl_deny=[[] for _ in range(count)], labels=[[] for _ in range(count)],
        classification=np.zeros(count, dtype=np.int8),
    )  # fmt: skip
    append_rows(rw.store, new)
    found = leaked = 0
    for chunk_id, vector in zip(new.ids, vectors, strict=True):
        hits = rw.warehouse.search("appended", subject=reader, tenant=TENANT, k=K, vector=vector)
        found += bool(hits) and hits[0].chunk_id == chunk_id
        leaked += any(h.chunk_id.startswith("appended-") for h in
                      rw.warehouse.search("appended", subject=outsider, tenant=TENANT, k=K, vector=vector))  # fmt: skip
    return {"appended": count, "found_first": found, "leaked": leaked, "indexed": rw.store.chunks.has_vector_index()}


def compile_times(lines_list: tuple[int, ...] = (1_000, 10_000, 100_000)) -> dict[str, dict[str, float]]:
    """Policy compile time, cold (a new policy version: role expansion and filter text) and cached,
    at policies of 1k, 10k and 100k lines (users in nested groups, label grants)."""
    from ragwarden.governance.compiler import SubjectView, compile_prefilter
    from ragwarden.retrieval.search import LruCache

    results: dict[str, dict[str, float]] = {}
    rng = np.random.default_rng(5)
    for lines in lines_list:
        groups = max(10, lines // 100)
        text = [f"g, group:g{g}, group:g{g // 4}, {TENANT}" for g in range(4, groups)]
        text += [f"p, group:g{g}, {TENANT}, label:l{g % 50}, read, allow" for g in range(groups)]
        users = lines - len(text)
        text += [f"g, user:u{u}, group:g{int(rng.integers(0, groups))}, {TENANT}" for u in range(users)]
        clauses = {f"c{g}": (f"group:g{g}",) for g in range(groups)}
        labels = [f"l{i}" for i in range(50)]
        started = time.perf_counter()
        policy = Policy.from_text("\n".join(text) + "\n", source=f"{lines} lines")
        load = time.perf_counter() - started
        cache: LruCache[str] = LruCache()
        cold, cached = [], []
        for u in range(0, users, max(1, users // 20)):
            subject = f"user:u{u}"
            key = (subject, TENANT, policy.version)
            started = time.perf_counter()
            cache.get(key, lambda s=subject, p=policy, c=clauses, ls=labels: compile_prefilter(SubjectView.of(p, s, TENANT), c, ls))
            cold.append(time.perf_counter() - started)
            started = time.perf_counter()
            for _ in range(100):
                cache.get(key, lambda: "")
            cached.append((time.perf_counter() - started) / 100)
        results[str(lines)] = {
            "policy_load_ms": load * 1000,
            "cold_ms": float(np.median(cold) * 1000),
            "cached_ms": float(np.median(cached) * 1000),
        }
    return results
