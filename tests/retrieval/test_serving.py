"""The resident serving index: a broad caller's top-k through an in-memory graph equals the exact
top-k of its visible rows (recall@10 >= 0.99), rows written after the index was built are found
and filtered, a revocation applies at the next search although the index still holds the row,
an index over budget leaves searches to Lance and says why, and an artifact stored in the
warehouse is what a new replica loads, gone with an erasure's purge. (Rows written after the
index was built: ``test_indexed_search.py``, with every plan.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from support.raw_tables import raw_table

from ragwarden.api.cli import main
from ragwarden.bench.world import TENANT, World
from ragwarden.governance.caller import Caller
from ragwarden.retrieval import resident, serving
from ragwarden.retrieval.resident_state import index_terms
from ragwarden.retrieval.search import Searcher
from ragwarden.warehouse import Warehouse

K = 10
BUDGET = 256 * 2**20


def resident_searcher(warehouse: Warehouse, *, budget: int = BUDGET) -> Searcher:
    """A searcher whose every broad search may use the serving index (no row floor)."""
    return Searcher(warehouse.store.read_doors(), None, flat_max_rows=-1, resident_index_bytes=budget, resident_min_rows=0)  # type: ignore[arg-type]


def exact_searcher(warehouse: Warehouse) -> Searcher:
    return Searcher(warehouse.store.read_doors(), None, flat_max_rows=10**9)  # type: ignore[arg-type]


def queries(world: World, count: int, seed: int = 3) -> np.ndarray:
    """Query vectors near rows of the world, as real queries lie near the texts they find."""
    rng = np.random.default_rng(seed)
    base = world.rows.vectors[rng.choice(len(world.rows.ids), count, replace=False)]
    noisy = base + rng.standard_normal(base.shape).astype(np.float32) * 0.05
    return (noisy / np.linalg.norm(noisy, axis=1, keepdims=True)).astype(np.float32)


def top_ids(searcher: Searcher, warehouse: Warehouse, subject: str, vector: np.ndarray) -> list[str]:
    found = searcher.search(
        "q", policy=warehouse.policy, caller=Caller(subject=subject, tenant=TENANT), k=K, vector=vector
    )
    return [hit.chunk_id for hit in found.hits]


@pytest.fixture
def served(indexed_warehouse: Warehouse) -> Searcher:
    """A searcher whose serving index is built and ready."""
    searcher = resident_searcher(indexed_warehouse)
    searcher.serving.build_now()
    return searcher


@pytest.mark.parametrize("share", [0.5, 0.1])
def test_a_broad_caller_gets_the_exact_top_k_of_its_visible_rows_through_the_serving_index(
    indexed_warehouse: Warehouse, small_world: World, served: Searcher, share: float
) -> None:
    subject = small_world.subjects[share]
    view = served.view(indexed_warehouse.policy, Caller(subject=subject, tenant=TENANT))  # type: ignore[arg-type]
    where = served.prefilter(view)
    assert served.plan(where, indexed_warehouse.store.chunks.version) == "resident"
    exact = exact_searcher(indexed_warehouse)
    found = expected = 0
    for vector in queries(small_world, 40):
        got, want = (
            top_ids(served, indexed_warehouse, subject, vector),
            top_ids(exact, indexed_warehouse, subject, vector),
        )
        assert len(got) == len(want) == K  # k always filled
        assert set(got) <= {row["chunk_id"] for row in indexed_warehouse.store.chunks.rows_where(where, ["chunk_id"])}
        found += len(set(got) & set(want))
        expected += K
    assert found / expected >= 0.99


def test_a_row_taken_from_a_reader_is_gone_at_the_next_search_though_the_index_still_holds_it(
    indexed_warehouse: Warehouse, small_world: World, served: Searcher
) -> None:
    reader = small_world.subjects[0.5]
    vector = queries(small_world, 1, seed=11)[0]
    first = top_ids(served, indexed_warehouse, reader, vector)[0]
    raw_table(indexed_warehouse.store).update(where=f"chunk_id = '{first}'", values={"tenant": "elsewhere"})
    after = top_ids(served, indexed_warehouse, reader, vector)
    assert first not in after and len(after) == K
    index = served.serving.usable(indexed_warehouse.store.chunks.count())
    assert index is not None and index.positions(pa.array([first]))[0] >= 0  # still in the graph, never returned


def test_an_index_over_budget_leaves_searches_to_lance_and_says_why(
    indexed_warehouse: Warehouse, small_world: World
) -> None:
    searcher = resident_searcher(indexed_warehouse, budget=2**20)
    subject = small_world.subjects[0.5]
    vector = queries(small_world, 1)[0]
    assert len(top_ids(searcher, indexed_warehouse, subject, vector)) == K
    status = searcher.serving.status()
    assert status.state == "over budget" and "resident_index_mb" in status.reason
    view = searcher.view(indexed_warehouse.policy, Caller(subject=subject, tenant=TENANT))  # type: ignore[arg-type]
    assert searcher.plan(searcher.prefilter(view), indexed_warehouse.store.chunks.version) == "index"


def test_the_first_search_starts_a_build_in_the_background_and_later_ones_use_it_once_warm(
    indexed_warehouse: Warehouse, small_world: World
) -> None:
    searcher = resident_searcher(indexed_warehouse)
    subject, vector = small_world.subjects[0.5], queries(small_world, 1)[0]
    before = top_ids(searcher, indexed_warehouse, subject, vector)  # answered through Lance meanwhile
    deadline = time.monotonic() + 60
    while not searcher.serving.status().warm and time.monotonic() < deadline:  # ready, then its codes made
        time.sleep(0.05)
    assert searcher.serving.status().state == "ready" and searcher.serving.status().warm
    assert top_ids(searcher, indexed_warehouse, subject, vector)[:3] == before[:3]


def test_closing_stops_the_index_being_built_and_a_later_search_builds_it_again(
    indexed_warehouse: Warehouse, small_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that exits while the build or warm-up thread is inside faiss is aborted by the C++
    runtime, not ended: close() stops them at their next block (here, 100 rows) and waits."""
    monkeypatch.setattr(resident, "ADD_ROWS", 100)
    searcher = resident_searcher(indexed_warehouse)
    subject, vector = small_world.subjects[0.5], queries(small_world, 1)[0]
    top_ids(searcher, indexed_warehouse, subject, vector)  # starts the build
    assert any(t.name.startswith("resident-index") for t in searcher.serving._threads)
    assert searcher.serving.close(60) and not any(t.is_alive() for t in searcher.serving._threads)
    assert searcher.serving.status().state in ("idle", "ready"), "stopped (or done before the stop came)"
    top_ids(searcher, indexed_warehouse, subject, vector)  # builds again
    deadline = time.monotonic() + 60
    while not searcher.serving.status().warm and time.monotonic() < deadline:
        time.sleep(0.05)
    assert searcher.serving.status().state == "ready" and searcher.serving.status().warm


def test_at_exit_a_build_a_process_never_closed_is_stopped(
    indexed_warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short-lived process (one ``ragwarden search``) that started a build and exits without
    closing its warehouse has the build stopped by the exit hook, not left inside faiss (where the
    C++ runtime aborted a 1M-row benchmark at exit)."""
    monkeypatch.setattr(resident, "ADD_ROWS", 1)  # thousands of additions: the stop comes before the last
    searcher = resident_searcher(indexed_warehouse)
    searcher.serving._start_build(indexed_warehouse.store.chunks.count())
    serving._stop_at_exit()
    assert not any(t.is_alive() for t in searcher.serving._threads)
    assert searcher.serving.status().state == "idle" and not searcher.serving.status().warm


def test_a_stored_artifact_is_what_a_new_replica_loads_and_an_erasure_s_purge_removes_it(
    indexed_warehouse: Warehouse, small_world: World, tmp_path: Path
) -> None:
    stored = serving.store_artifact(indexed_warehouse.store.read_doors())
    assert stored is not None
    folder = Path(indexed_warehouse.uri) / "resident_index"
    assert sorted(path.suffix for path in folder.iterdir()) == [".faiss", ".rows", ".terms"]
    replica = resident_searcher(indexed_warehouse)
    loaded = replica.serving.build_now()
    assert loaded.version == stored.version and loaded.rows == stored.rows
    terms = serving.load_terms(indexed_warehouse.store.read_doors(), loaded)
    assert terms is not None and np.array_equal(terms.lengths, index_terms(loaded).lengths), "the rows' terms, stored"
    state = replica.serving.state(loaded.version)
    assert state is not None and np.array_equal(state.terms.lengths.dense(), terms.lengths)
    base = state.terms.segments[0]
    assert np.array_equal(np.sort(base.slot_of), terms.slot_of) and np.array_equal(np.sort(base.terms()), np.sort(terms.term_of))
    subject, vector = small_world.subjects[0.5], queries(small_world, 1)[0]
    exact = top_ids(exact_searcher(indexed_warehouse), indexed_warehouse, subject, vector)
    assert top_ids(replica, indexed_warehouse, subject, vector)[0] == exact[0]
    indexed_warehouse.store.maintenance.purge_history()
    assert list(folder.iterdir()) == []


def test_ragwarden_optimize_stores_the_artifact_of_a_table_with_a_vector_index(indexed_warehouse: Warehouse) -> None:
    result = CliRunner().invoke(main, ["optimize", "--warehouse", indexed_warehouse.uri])
    assert result.exit_code == 0, result.output
    version = indexed_warehouse.store.chunks.version
    assert f"serving index of {indexed_warehouse.store.chunks.count()} rows at version {version} stored" in result.output
    loaded = serving.load_artifact(indexed_warehouse.store.read_doors())
    assert loaded is not None and loaded.version == version


@pytest.mark.slow  # a second process loads the artifact: about ten seconds
def test_a_revocation_by_one_process_applies_at_the_next_search_of_a_replica_process(
    indexed_warehouse: Warehouse, small_world: World
) -> None:
    """Two processes on one warehouse: a replica answering from the serving index it loaded, and
    a writer taking a row from the reader. The replica's next search never returns the row."""
    stored = serving.store_artifact(indexed_warehouse.store.read_doors())
    assert stored is not None
    support = Path(__file__).resolve().parents[1] / "support"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(support), os.environ.get("PYTHONPATH", "")])}
    reader, vector = small_world.subjects[0.5], queries(small_world, 1, seed=11)[0]
    line = f"{reader} {TENANT} {','.join(repr(float(x)) for x in vector)}\n"
    with subprocess.Popen([sys.executable, str(support / "serving_replica.py"), indexed_warehouse.uri], env=env,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as replica:  # fmt: skip
        assert replica.stdin is not None and replica.stdout is not None

        def ask() -> dict:
            replica.stdin.write(line)
            replica.stdin.flush()
            return json.loads(replica.stdout.readline())

        assert json.loads(replica.stdout.readline())["loaded"] == stored.version
        before = ask()
        assert before["plan"] == "resident" and len(before["ids"]) == K
        first = before["ids"][0]
        raw_table(indexed_warehouse.store).update(where=f"chunk_id = '{first}'", values={"tenant": "elsewhere"})
        after = ask()
        replica.stdin.close()
        assert replica.wait(30) == 0
    assert first not in after["ids"] and len(after["ids"]) == K
