"""``python -m ragwarden.bench.churn``: shared use while the table changes, as a deployment sees it.

Many distinct callers and a writer that commits every second: most searches are then "the first
search of this caller at this table version", which is what a real deployment pays. The world:
``--rows`` rows (synthetic unit vectors, texts drawn from a Zipf vocabulary so BM25 has work),
each readable by one of 40 groups of Zipf sizes; ``--users`` users (1,000 by default), each in 3
groups drawn the same way; one tenant; everything public, so a user's rows are its groups' rows.
One ``ragwarden serve`` replica on 127.0.0.1, searched over HTTP with JWT bearers (the query
embedded by the service, the receipt written before the answer), one search in flight.

For each mode (vector, fts, hybrid):

- ``warm``: one caller's repeated searches on a still table (the baseline);
- ``first``: each of ``--first`` callers never seen before, once each, on a still table;
- ``churn``: searches cycling over every user while a writer process commits ``--batch`` rows
  every second (``ingest_records``, embedded as ingest embeds), for ``--seconds``.

p50 and p99 of each, and every hit checked against an oracle computed apart from the search path
(a row is readable when its group is one of the caller's; the writer's rows name their group in
their id): a hit outside it is a leak. Targets: at 1M rows, ``first`` p99 <= 50 ms and
``churn`` p99 <= 3x ``warm`` p50 in every mode; 0 leaks; and, in this process over the same
world (``reader_work``), the bytes a replica holds per 1M rows (index, tags, terms) and the time a
commit of 100 rows (an append, a re-tag) costs each reader: <= 20 ms. Writes ``churn-ROWS.json``.

    python -m ragwarden.bench.churn [--rows 100000] [--users 1000] [--first 100] [--seconds 20] [--keep DIR]

``--keep DIR`` builds the world once into ``DIR`` (16 minutes at 1M rows on 2 cores) and, on later
runs with the same ``--rows`` and ``--users``, measures a fresh copy of it: the runs write and
re-tag rows, so the kept world itself is never served.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ..config import Settings
from ..governance.policy import Policy
from ..retrieval.search import Searcher
from ..retrieval.serving import store_artifact
from ..state import ChunkWrite, Store
from ..warehouse import Warehouse
from .peer_data import BenchRows
from .serve import free_port, serve_replica, token_for
from .world import DIMENSION, append_rows

TENANT = "acme"
GROUPS = 40
GROUPS_PER_USER = 3
MODES = ("vector", "fts", "hybrid")
VOCABULARY = [f"term{i:04d}" for i in range(2_000)]
WORDS_PER_ROW = 12
RESULTS = Path(__file__).resolve().parent / "results"


def zipf(count: int, exponent: float = 1.1) -> np.ndarray:
    """Shares of ``count`` items whose sizes fall as 1 / rank^exponent."""
    weights = 1.0 / np.arange(1, count + 1) ** exponent
    return weights / weights.sum()


def group(number: int) -> str:
    return f"group:g{number:02d}"


@dataclass(frozen=True, kw_only=True)
class ChurnWorld:
    """The warehouse and what the oracle needs: each user's groups, each row's group."""

    uri: str
    memberships: dict[str, frozenset[int]]  # user name -> its groups
    row_group: dict[str, int]  # doc id -> the group that may read it

    def readable(self, user: str, doc_id: str) -> bool:
        """The oracle: ``user`` reads ``doc_id`` when the row's group is one of its groups (a row
        the writer added names its group in its id: ``w<n>-g<group>``)."""
        row = self.row_group.get(doc_id)
        if row is None and doc_id.startswith("w") and "-g" in doc_id:
            row = int(doc_id.rsplit("-g", 1)[1])
        return row is not None and row in self.memberships[user]


def texts(rng: np.random.Generator, count: int) -> list[str]:
    words = rng.choice(len(VOCABULARY), size=(count, WORDS_PER_ROW), p=zipf(len(VOCABULARY)))
    return [" ".join(VOCABULARY[w] for w in row) for row in words]


def build(folder: Path, rows: int, users: int, *, seed: int = 34) -> ChurnWorld:
    """The world of ``rows`` rows and ``users`` users in ``folder``, its policy installed, optimized,
    the serving index (with the rows' terms) stored for the replica to load."""
    rng = np.random.default_rng(seed)
    shares = zipf(GROUPS)
    row_groups = rng.choice(GROUPS, size=rows, p=shares)
    vectors = rng.standard_normal((rows, DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [f"r{i:07d}" for i in range(rows)]
    bench_rows = BenchRows(ids=ids, vectors=vectors, tenant=[TENANT] * rows,
                           acl_allow=[[group(int(g))] for g in row_groups], acl_deny=[[] for _ in ids],
                           labels=[[] for _ in ids], classification=np.zeros(rows, dtype=np.int8))  # fmt: skip
    store = Store(str(folder), dimension=DIMENSION)
    append_rows(store, bench_rows, texts=texts(rng, rows))
    memberships = {f"u{n:04d}": frozenset(int(g) for g in rng.choice(GROUPS, size=GROUPS_PER_USER, replace=False, p=shares))
                   for n in range(users)}  # fmt: skip
    lines = [f"g, user:{user}, {group(g)}, {TENANT}" for user, groups in memberships.items() for g in sorted(groups)]
    store.policies.install(Policy.from_text("\n".join(lines), source="churn world"))
    store.maintenance.optimize()
    store_artifact(store.read_doors())  # as ``ragwarden optimize`` does: the index a replica loads
    return ChurnWorld(uri=str(folder), memberships=memberships, row_group={i: int(g) for i, g in zip(ids, row_groups, strict=True)})


def _writer(uri: str, batch: int, stop: Any, committed: Any, seed: int) -> None:
    """A writer process: ``batch`` new rows every second, each readable by one group, until ``stop``."""
    rng = np.random.default_rng(seed)
    # Index upkeep left to a scheduled ``optimize``, as a shared deployment runs it: at 1M rows one
    # fold after an ingest took over 40 s, and this writer would commit nothing meanwhile.
    warehouse = Warehouse(Settings(warehouse=uri, policy=None, ingest_maintenance=False))
    n = 0
    while not stop.is_set():
        began = time.monotonic()
        records = []
        for text in texts(rng, batch):
            n += 1
            g = int(rng.choice(GROUPS, p=zipf(GROUPS)))
            records.append({"id": f"w{n:06d}-g{g:02d}", "text": text, "tenant": TENANT, "acl": {"allow": [group(g)]},
                            "classification": "public"})  # fmt: skip
        if warehouse.ingest_records(records).ok:
            with committed.get_lock():
                committed.value += 1
        stop.wait(max(0.0, 1.0 - (time.monotonic() - began)))


@dataclass(frozen=True, kw_only=True)
class Run:
    searches: int
    p50_ms: float
    p99_ms: float
    leaks: int
    errors: int


def _searches(url: str, world: ChurnWorld, callers: list[str], mode: str, rng: np.random.Generator,
              seconds: float | None = None) -> Run:  # fmt: skip
    """One search in flight: each of ``callers`` in turn (round and round until ``seconds`` when
    given, else once each); each hit checked against the oracle."""
    latencies: list[float] = []
    leaks = errors = 0
    tokens = {user: token_for(user, TENANT) for user in set(callers)}
    deadline = time.monotonic() + seconds if seconds is not None else None
    with httpx.Client(timeout=60) as http:
        n = 0
        while (n < len(callers)) if deadline is None else (time.monotonic() < deadline):
            user = callers[n % len(callers)]
            n += 1
            query = " ".join(rng.choice(VOCABULARY[:200], size=3))
            began = time.perf_counter()
            answer = http.post(f"{url}/v1/search", json={"query": query, "k": 10, "mode": mode},
                               headers={"Authorization": f"Bearer {tokens[user]}"})  # fmt: skip
            took = time.perf_counter() - began
            if answer.status_code != 200:
                errors += 1
                continue
            latencies.append(took * 1000)
            leaks += sum(not world.readable(user, hit["doc_id"]) for hit in answer.json()["hits"])
    ordered = sorted(latencies) or [0.0]
    return Run(searches=len(latencies), p50_ms=round(statistics.median(ordered), 2),
               p99_ms=round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2), leaks=leaks, errors=errors)  # fmt: skip


def kept(folder: Path, rows: int, users: int) -> ChurnWorld:
    """The world kept in ``folder`` (built there first when absent or of another shape)."""
    described = folder / "world.json"
    if described.exists():
        saved = json.loads(described.read_text(encoding="utf-8"))
        if saved["rows"] == rows and saved["users"] == users:
            return ChurnWorld(uri=str(folder / "warehouse"), row_group=saved["row_group"],
                              memberships={u: frozenset(g) for u, g in saved["memberships"].items()})  # fmt: skip
        raise SystemExit(f"{folder} keeps a world of {saved['rows']} rows and {saved['users']} users, not "
                         f"{rows} and {users}: name another folder, or remove it to build again")  # fmt: skip
    world = build(folder / "warehouse", rows, users)
    memberships = {u: sorted(g) for u, g in world.memberships.items()}
    described.write_text(json.dumps({"rows": rows, "users": users, "memberships": memberships,
                                     "row_group": world.row_group}), encoding="utf-8")  # fmt: skip
    return world


def _serving_ready(url: str, user: str, timeout: float = 1800.0) -> dict[str, Any]:
    """Wait for the replica's serving index (and its resident tags) to be built and warm: the first
    search that could use it starts the build; a deployment's replica serves from it once warm."""
    began = time.monotonic()
    with httpx.Client(timeout=120) as http:
        http.post(f"{url}/v1/search", json={"query": "term0001", "k": 10},
                  headers={"Authorization": f"Bearer {token_for(user, TENANT)}"})  # fmt: skip
        while time.monotonic() - began < timeout:
            serving = http.get(f"{url}/readyz").json()["serving_index"]
            if serving["state"] != "building" and (serving["state"] != "ready" or serving["warm"]):  # or none to build
                return serving | {"waited_seconds": round(time.monotonic() - began, 1)}
            time.sleep(1.0)
    raise RuntimeError(f"the serving index was not built within {timeout:.0f} s")


def reader_work(uri: str, rows: int, commits: int = 10, batch: int = 100, seed: int = 5) -> dict[str, Any]:
    """What a reader holds and pays per commit, in this process over the world at ``uri``: the
    serving index loaded with every row's tags and terms (bytes of each part), then ``commits``
    appends and as many re-tags of ``batch`` of the world's ``rows`` rows, each followed by moving the state to the new
    version (milliseconds: the work every reader does once per commit). The first append and
    re-tag after the load are reported apart (``first_move_ms``): they also pay the process's
    one-time costs (Lance's first reads of a new version, the first calls of each path)."""
    store = Store(uri, dimension=DIMENSION)
    searcher = Searcher(store.read_doors(), None, resident_index_bytes=2**34, resident_min_rows=0)  # type: ignore[arg-type]
    began = time.perf_counter()
    searcher.serving.build_now()
    state = searcher.serving.state(store.chunks.version)
    assert state is not None
    loaded = time.perf_counter() - began
    for thread in threading.enumerate():  # a replica's steady state: its vectors read in and coded, not beside the moves
        if thread.name == "resident-index-warm":
            thread.join()
    parts = {"index": state.index.nbytes, "tags": state.tags.nbytes, "terms": state.terms.nbytes}
    rng = np.random.default_rng(seed)
    timings: dict[str, list[float]] = {"append": [], "retag": []}
    first: dict[str, list[float]] = {"append": [], "retag": []}
    for n in range(commits + 1):
        vectors = rng.standard_normal((batch, DIMENSION)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        ids = [f"x{n:03d}-{i:04d}" for i in range(batch)]
        append_rows(store, BenchRows(ids=ids, vectors=vectors, tenant=[TENANT] * batch, acl_allow=[[group(n % GROUPS)]] * batch,
                                     acl_deny=[[] for _ in ids], labels=[[] for _ in ids],
                                     classification=np.zeros(batch, dtype=np.int8)), texts=texts(rng, batch))  # fmt: skip
        state, took = _moved(searcher, state)
        (timings if n else first)["append"].append(took)
        chosen = [f"r{i:07d}" for i in rng.choice(rows, min(batch, rows), replace=False)]
        store.chunks.write(lambda snapshot, ids=chosen, g=group((n + 1) % GROUPS): (ChunkWrite(
            rows=[{**row, "acl_allow": [g]} for row in snapshot.rows(ids).values()]), None), what="re-tagging rows")  # fmt: skip
        state, took = _moved(searcher, state)
        (timings if n else first)["retag"].append(took)
    return {"load_seconds": round(loaded, 1), "bytes": parts, "rows": state.index.rows,
            "bytes_per_million_rows": {k: round(v * 1e6 / state.index.rows) for k, v in parts.items()},
            "commit_rows": batch, "first_move_ms": {kind: round(took[0], 2) for kind, took in first.items()},
            "move_ms": {k: {"p50": round(statistics.median(v), 2), "max": round(max(v), 2)} for k, v in timings.items()}}  # fmt: skip


def _moved(searcher: Searcher, state: Any) -> tuple[Any, float]:
    """The state moved to the table's latest version, and the milliseconds that took."""
    began = time.perf_counter()
    moved = searcher.serving.state(searcher.chunks.latest_version())
    took = (time.perf_counter() - began) * 1000
    assert moved is not None and moved.version > state.version
    return moved, took


def run(rows: int, users: int, first: int, seconds: float, batch: int, folder: Path,
        keep: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Build the world in ``folder`` (or copy the one kept in ``keep``), serve it, and measure every
    mode; the record ``main`` writes."""
    started = time.perf_counter()
    if keep is None:
        world = build(folder / "warehouse", rows, users)
    else:
        pristine = kept(keep, rows, users)
        shutil.copytree(pristine.uri, folder / "warehouse")
        world = ChurnWorld(uri=str(folder / "warehouse"), memberships=pristine.memberships, row_group=pristine.row_group)
    built = time.perf_counter() - started
    port = free_port()
    replica = serve_replica(world.uri, port, folder / "replica.log")
    url = f"http://127.0.0.1:{port}"
    rng = np.random.default_rng(7)
    everyone = sorted(world.memberships)
    record: dict[str, Any] = {"rows": rows, "users": users, "groups": GROUPS, "build_seconds": round(built, 1), "modes": {}}
    try:
        record["serving_index"] = _serving_ready(url, everyone[-1])
        fresh = iter(everyone[1:])  # the first is the warm caller
        for mode in MODES:
            warm_caller = everyone[0]
            _searches(url, world, [warm_caller] * 3, mode, rng)  # its first searches, not timed
            warm = _searches(url, world, [warm_caller] * 30, mode, rng)
            never_seen = [next(fresh, None) for _ in range(first)]
            cold = _searches(url, world, [u for u in never_seen if u is not None], mode, rng)
            record["modes"][mode] = {"warm": warm.__dict__, "first": cold.__dict__}
        context = multiprocessing.get_context("spawn")  # a fork after LanceDB's runtime started hangs
        stop, committed = context.Event(), context.Value("i", 0)
        writer = context.Process(target=_writer, args=(world.uri, batch, stop, committed, 11), daemon=True)
        writer.start()
        try:
            deadline = time.monotonic() + 300  # its first commit, after loading the model: waited for, never a time
            while committed.value == 0 and writer.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            for mode in MODES:
                before = committed.value
                churn = _searches(url, world, everyone, mode, rng, seconds=seconds)
                record["modes"][mode]["churn"] = churn.__dict__ | {"commits": committed.value - before}
        finally:
            stop.set()
            writer.join(60)
    finally:
        replica.terminate()
        replica.wait(30)
    record["targets"] = {mode: {"first_p99_le_50ms": cells["first"]["p99_ms"] <= 50,
                                "churn_p99_le_3x_warm_p50": cells["churn"]["p99_ms"] <= 3 * cells["warm"]["p50_ms"],
                                "no_leak": all(cells[k]["leaks"] == 0 for k in ("warm", "first", "churn"))}
                         for mode, cells in record["modes"].items()}  # fmt: skip
    record["reader_work"] = work = reader_work(world.uri, rows)
    record["targets"]["reader"] = {f"{kind}_of_{work['commit_rows']}_rows_le_20ms": cell["max"] <= 20
                                   for kind, cell in work["move_ms"].items()}  # fmt: skip
    record["machine"] = {"cpus": os.cpu_count(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--first", type=int, default=100, help="callers never seen, per mode, on a still table")
    parser.add_argument("--seconds", type=float, default=20.0, help="searches under the writer, per mode")
    parser.add_argument("--batch", type=int, default=5, help="rows the writer commits every second")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--keep", type=Path, help="build the world once into this folder and measure copies of it")
    args = parser.parse_args(argv)
    if args.first * len(MODES) >= args.users:
        parser.error(f"--first {args.first} per mode needs more than {args.first * len(MODES)} users")
    with tempfile.TemporaryDirectory() as folder:
        record = run(args.rows, args.users, args.first, args.seconds, args.batch, Path(folder), args.keep)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"churn-{args.rows}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    for mode, cells in record["modes"].items():
        print(f"{mode:7s} warm p50 {cells['warm']['p50_ms']:8.1f} ms | first p50 {cells['first']['p50_ms']:8.1f} "
              f"p99 {cells['first']['p99_ms']:8.1f} ms | churn p50 {cells['churn']['p50_ms']:8.1f} "
              f"p99 {cells['churn']['p99_ms']:8.1f} ms ({cells['churn']['commits']} commits) | leaks "
              f"{sum(cells[k]['leaks'] for k in ('warm', 'first', 'churn'))}")  # fmt: skip
    work = record["reader_work"]
    held = ", ".join(f"{kind} {size // 2**20} MiB" for kind, size in work["bytes"].items())
    moves = ", ".join(f"{kind} p50 {cell['p50']} ms (max {cell['max']})" for kind, cell in work["move_ms"].items())
    print(f"reader: {held} for {work['rows']} rows; a commit of {work['commit_rows']} rows moves it in {moves}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
