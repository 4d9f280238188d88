"""``make bench-serve``: what a user of the HTTP service pays, end to end, under concurrency.

    python -m ragwarden.bench.serve [--corpus demo|scifact|world100k] [--clients 1,4,16,64]
                                    [--seconds 10] [--warmup 1] [--replicas 1]
                                    [--ingest [--ingest-nice N]] [--keep DIR] [--out bench/results]

Real ``ragwarden serve`` processes on 127.0.0.1 over one warehouse, driven by client threads that
each keep one search in flight (JWT bearer, the query embedded by the service, the receipt written
before the answer). For a broad and a selective caller at each client count: searches/s, p50, p95,
p99, errors, refusals (503 ``overloaded``), the median time in line and at work (``Server-Timing``,
which the replicas it starts turn on), the median of each stage (embed, rank, check, receipt), and how the audit log grew (commits per
receipt, versions kept, bytes per receipt before and after ``optimize``). Every hit of every
answer is checked against an oracle computed apart from the search path (the enforcer on every
row of a full scan): one it does not admit is a leak.

``--ingest`` keeps an ingest running throughout, in a process of its own as an ingest worker runs
(documents of the corpus under new ids, readable by no caller: any of them in an answer is a leak);
``--ingest-nice N`` runs that process at niceness N, as an ingest worker beside a service may be.
``world100k`` is the synthetic 100,000-row world of ``make bench`` (vectors drawn around cluster
centres, so its answers measure cost, not relevance). ``--keep DIR`` builds the warehouse there once
and reuses it.
``--filter JSON`` sends a narrowing filter with every search (the world's rows carry
``{"bucket": row % 100}``); a hit the filter does not match counts as a leak too.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import multiprocessing
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import jwt

from ..config import Settings
from ..governance.visibility import check_row
from ..policies import policy_file
from ..retrieval.narrowing import narrowing
from ..state import TAG_COLUMNS
from ..warehouse import Warehouse
from . import scifact, world

SECRET = "ragwarden-bench-serve-secret-0123456789"
ISSUER, AUDIENCE = "https://idp.bench.invalid", "ragwarden-bench"
QUERIES = ["quarterly budget forecast", "salary bands", "cafeteria menu", "acquisition due diligence",
           "litigation hold", "warehouse expansion plan", "security incident", "travel policy"]  # fmt: skip
WORLD_ROWS = 100_000
CALLERS = {"demo": {"broad": ("carol", "acme"), "selective": ("dave", "acme")},
           "scifact": {"broad": ("reader", scifact.TENANT), "selective": ("stranger", scifact.TENANT)},
           # the world's subjects are numbered by selectivity (bench.world.SELECTIVITIES): 50% and 1%
           "world100k": {"broad": ("s0", world.TENANT), "selective": ("s2", world.TENANT)}}  # fmt: skip
STAGES = ("embed", "rank", "check", "receipt")


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One caller at one client count, against every replica."""

    corpus: str
    caller: str
    clients: int
    replicas: int
    searches: int
    per_second: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: int
    overloaded: int
    leaks: int
    readable: int
    queue_ms: float
    app_ms: float
    stages_ms: dict[str, float]
    ingested_docs_per_s: float
    chunk_commits: int  # commits to the chunks table during the cell (the ingest's), each a new version to read at
    audit_versions_per_receipt: float


def _warehouse(corpus: str, folder: Path, data: Path) -> Warehouse:
    """The corpus's warehouse in ``folder``, built unless a complete one is there already."""
    built = folder / ".built"
    if built.exists():  # as a fresh build leaves it: compacted, old audit versions pruned, the serving index stored
        warehouse = Warehouse(Settings(warehouse=str(folder), data_dir=data))
        warehouse.optimize()
        return warehouse
    if corpus == "world100k":  # its broad callers are served by the serving index the replicas load
        world.write_warehouse(world.generate(WORLD_ROWS), folder)
        warehouse = Warehouse(Settings(warehouse=str(folder), data_dir=data))
        warehouse.optimize()
        built.touch()
        return warehouse
    warehouse = Warehouse(Settings(warehouse=str(folder), data_dir=data))
    if corpus == "demo":
        warehouse.install_policy(policy_file("demo.csv"))
        warehouse.ingest(str(resources.files("ragwarden.examples") / "demo" / "corpus.jsonl"))
    else:
        policy = folder.parent / "scifact-policy.csv"
        policy.write_text(scifact.POLICY, encoding="utf-8")
        warehouse.install_policy(policy)
        warehouse.ingest_records(scifact.records(data / "scifact"))
    warehouse.optimize()
    built.touch()
    return warehouse


def _corpus_records(corpus: str, data: Path) -> list[dict[str, Any]]:
    if corpus == "demo":
        path = Path(str(resources.files("ragwarden.examples") / "demo" / "corpus.jsonl"))
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return list(scifact.records(data / "scifact", limit=500))


class _Ingest:
    """An ingest kept running beside the service, in a process of its own as an ingest worker
    runs (at ``nice``, when given): the corpus's documents again, under new ids and readable by no
    one (``group:ingest-only``), a few at a time, until stopped. The cell starts once the worker
    has loaded its model, and its rate counts from then."""

    def __init__(self, folder: Path, data: Path, records: list[dict[str, Any]], nice: int = 0) -> None:
        context = multiprocessing.get_context("spawn")  # Lance's runtime is not fork-safe
        self._ready, self._stop = context.Event(), context.Event()
        self._documents = context.Value("q", 0)
        run_id = secrets.token_hex(4)  # ids new to the warehouse in every cell and run: each batch is written
        self._process = context.Process(
            target=_ingest_worker,
            args=(str(folder), str(data), records, run_id, nice, self._ready, self._stop, self._documents),
            name="bench-ingest",
            daemon=True,
        )

    def __enter__(self) -> _Ingest:
        self._process.start()
        while not self._ready.wait(0.2):
            if not self._process.is_alive():
                raise RuntimeError(f"the ingest beside the load exited (code {self._process.exitcode}) before it began")
        self._began = time.perf_counter()
        return self

    def __exit__(self, failure: type[BaseException] | None, *_: object) -> None:
        self._stop.set()  # the batch in hand is finished and counted: the rate runs to the worker's exit
        self._process.join(120)
        self.seconds = time.perf_counter() - self._began
        self.documents = int(self._documents.value)
        code = self._process.exitcode
        if code is None:  # still writing two minutes after it was told to stop
            self._process.kill()
            self._process.join()
        if code != 0 and failure is None:  # the cell must not pass as one with an ingest beside it
            stopped = "did not stop within 120 s" if code is None else f"failed (exit code {code}); its error is above"
            raise RuntimeError(f"the ingest beside the load {stopped}")


def _ingest_worker(folder: str, data: str, records: list[dict[str, Any]], run_id: str, nice: int,
                   ready: Any, stop: Any, documents: Any) -> None:  # fmt: skip
    """The ingest process's loop (see ``_Ingest``): batches of eight documents until ``stop``."""
    os.nice(nice)
    warehouse = Warehouse(Settings(warehouse=folder, data_dir=Path(data)))
    warehouse.embedder.encode(["the model loaded before the cell starts"])
    ready.set()
    n = 0
    while not stop.is_set():
        batch = []
        for record in records[n % len(records) : n % len(records) + 8]:
            n += 1
            batch.append({**record, "id": f"ingest-{run_id}-{n}-{record['id']}", "acl": {"allow": ["group:ingest-only"]},
                          "labels": [], "classification": "public"})  # fmt: skip
        n += 8 - len(batch)
        report = warehouse.ingest_records(batch)
        with documents.get_lock():
            documents.value += len(report.written_documents)


def serve_replica(warehouse: str, port: int, log: Path, workers: int = 1, **settings: str) -> subprocess.Popen[bytes]:
    """``ragwarden serve`` on 127.0.0.1:``port`` over ``warehouse``, ready; ``settings``: more environment."""
    # Server-Timing on (an operator's switch, off by default): the driver reads each answer's stages.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAGWARDEN_JWT_SECRET": SECRET, "RAGWARDEN_JWT_ISSUER": ISSUER,
           "RAGWARDEN_JWT_AUDIENCE": AUDIENCE, "RAGWARDEN_POLICY": "", "RAGWARDEN_SERVER_TIMING": "1", **settings}  # fmt: skip
    command = [str(Path(sys.executable).parent / "ragwarden"), "serve", "--host", "127.0.0.1", "--port", str(port),
               "--warehouse", warehouse, "--workers", str(workers)]  # fmt: skip
    with log.open("wb") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    wait_until_serving(process, f"http://127.0.0.1:{port}/readyz", log=log, timeout=180)
    return process


def wait_until_serving(process: subprocess.Popen[bytes], url: str, *, log: Path, timeout: float, every: float = 0.3) -> None:
    """Ask ``url`` (a started replica's ``/readyz`` or ``/healthz``) until it answers 200; a
    RuntimeError naming ``log`` if ``process`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2) as client:  # one client: a new one per try would load the CA bundle each time
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the replica at {url} exited with {process.returncode}; see {log}")
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(every)
    raise RuntimeError(f"the replica at {url} did not answer 200 in {timeout} s; see {log}")


def token_for(sub: str, tenant: str) -> str:
    """A bearer token the replicas ``serve_replica`` starts accept, for ``user:sub`` in ``tenant``."""
    now = int(time.time())
    claims = {"sub": sub, "tenant": tenant, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 3600}
    return jwt.encode(claims, SECRET, algorithm="HS256")


def _timing(header: str, name: str) -> float:
    for part in header.split(","):
        key, _, value = part.strip().partition(";dur=")
        if key == name:
            return float(value)
    return 0.0


def _readable(warehouse: Warehouse, sub: str, tenant: str) -> frozenset[str]:
    """The oracle: every row the Casbin enforcer lets the caller read, decided row by row over a full
    scan (no compiled filter, no index: not the path the service searches by)."""
    policy = warehouse.policy
    assert policy is not None
    registry = warehouse.store.registries.clauses()
    rows = warehouse.store.chunks.rows_where("tenant IS NOT NULL", [*TAG_COLUMNS, "chunk_id"])
    return frozenset(row["chunk_id"] for row in rows if check_row(policy, f"user:{sub}", tenant, row, registry).allowed)


def _matching(warehouse: Warehouse, narrow: dict[str, Any] | None) -> frozenset[str] | None:
    """The rows a narrowing filter matches, by its SQL over a full scan (None: no filter)."""
    compiled = narrowing(narrow)
    if compiled is None:
        return None
    return frozenset(row["chunk_id"] for row in warehouse.store.chunks.rows_where(compiled.sql, ["chunk_id"]))


def _drive(
    urls: list[str], sub: str, tenant: str, clients: int, seconds: float, readable: frozenset[str],
    narrow: dict[str, Any] | None = None, warmup: float = 0.0,
) -> dict[str, Any]:  # fmt: skip
    """``clients`` threads, each one search in flight at a time, for ``warmup`` then ``seconds``;
    a hit outside ``readable`` is a leak. Only searches begun after the warm-up are timed and
    counted (all the clients start at once, a burst no steady load has); errors and leaks are
    counted throughout."""
    latencies: list[float] = []
    queue: list[float] = []
    app: list[float] = []
    stages: dict[str, list[float]] = {name: [] for name in STAGES}
    counts = {"errors": 0, "overloaded": 0, "leaks": 0, "completed": 0}
    lock = threading.Lock()
    window: dict[str, float] = {}
    start = threading.Barrier(clients, action=lambda: window.update(timed_from=time.perf_counter() + warmup))
    headers = {"Authorization": f"Bearer {token_for(sub, tenant)}"}

    def client(number: int) -> None:
        with httpx.Client(headers=headers, timeout=60) as http:
            start.wait()
            deadline = window["timed_from"] + seconds
            n = number
            while time.perf_counter() < deadline:
                n += 1
                began = time.perf_counter()
                try:
                    body = {"query": QUERIES[n % len(QUERIES)], "k": 10, **({"filter": narrow} if narrow else {})}
                    answer = http.post(f"{urls[n % len(urls)]}/v1/search", json=body)
                except httpx.TransportError:
                    with lock:
                        counts["errors"] += 1
                    continue
                took = time.perf_counter() - began
                with lock:
                    if answer.status_code == 503 and answer.json()["error"]["code"] == "overloaded":
                        counts["overloaded"] += 1
                    elif answer.status_code != 200:
                        counts["errors"] += 1
                    else:
                        counts["leaks"] += sum(hit["chunk_id"] not in readable for hit in answer.json()["hits"])
                        counts["completed"] += window["timed_from"] <= began + took <= deadline  # throughput
                        if began >= window["timed_from"]:
                            latencies.append(took)
                            timing = answer.headers.get("server-timing", "")
                            queue.append(_timing(timing, "queue"))
                            app.append(_timing(timing, "app"))
                            for name in STAGES:
                                stages[name].append(_timing(timing, name))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    gc.collect()  # the driver's own full collections walked what it built (the oracle, Lance, Arrow):
    gc.freeze()  # stalls of 120-410 ms every few seconds, timed as the service's latency
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ordered = sorted(latencies) or [0.0]

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000

    completed = counts.pop("completed")
    return {"searches": len(latencies), "per_second": completed / seconds, "p50_ms": pct(0.5), "p95_ms": pct(0.95),
            "p99_ms": pct(0.99), **counts, "queue_ms": statistics.median(queue or [0.0]),
            "app_ms": statistics.median(app or [0.0]),
            "stages_ms": {name: round(statistics.median(values or [0.0]), 2) for name, values in stages.items()}}  # fmt: skip


def _audit_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in (folder / "audit.lance").rglob("*") if path.is_file())


def run(
    corpus: str, clients: list[int], seconds: float, replicas: int, workdir: Path, data: Path, *,
    ingest: bool = False, keep: Path | None = None, workers: int = 1, narrow: dict[str, Any] | None = None,
    ingest_nice: int = 0, warmup: float = 0.0,
) -> dict[str, Any]:  # fmt: skip
    if ingest and corpus == "world100k":
        raise SystemExit("--ingest needs a corpus of documents (demo or scifact); the world's rows are synthetic")
    folder = (keep or workdir) / f"{corpus}-warehouse"
    warehouse = _warehouse(corpus, folder, data)
    records = _corpus_records(corpus, data) if ingest else []
    ports = [free_port() for _ in range(replicas)]
    processes = [serve_replica(str(folder), port, workdir / f"replica-{port}.log", workers) for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    cells: list[Cell] = []
    try:
        for caller, (sub, tenant) in CALLERS[corpus].items():
            readable = _readable(warehouse, sub, tenant)
            matching = _matching(warehouse, narrow)
            readable = readable if matching is None else readable & matching
            for count in clients:
                before = (warehouse.audit.count(), _commits(folder), warehouse.store.chunks.latest_version())
                with _Ingest(folder, data, records, ingest_nice) if ingest else contextlib.nullcontext() as running:
                    found = _drive(urls, sub, tenant, count, seconds, readable, narrow, warmup)
                receipts = warehouse.audit.count() - before[0]
                commits = _commits(folder) - before[1]
                ingested = running.documents / running.seconds if running is not None else 0.0
                cells.append(Cell(corpus=corpus, caller=caller, clients=count, replicas=replicas, **found,
                                  readable=len(readable), ingested_docs_per_s=round(ingested, 1),
                                  chunk_commits=warehouse.store.chunks.latest_version() - before[2],
                                  audit_versions_per_receipt=commits / max(1, receipts)))  # fmt: skip
                print(_line(cells[-1]), flush=True)
    finally:
        for process in processes:
            process.terminate()
            process.wait(30)
    receipts = warehouse.audit.count()
    began = time.perf_counter()
    verified = warehouse.audit.verify(checkpoint=False)  # every replica's chain, one log
    verify_seconds = time.perf_counter() - began
    size_before, kept_before = _audit_size(folder), _versions_kept(folder)
    warehouse.store.maintenance.optimize()
    live = warehouse.store.audit_table("").data_bytes()
    checks = []
    for _ in range(200):  # one freshness check (four table versions), as each read operation takes
        began = time.perf_counter()
        warehouse.store.versions()
        checks.append((time.perf_counter() - began) * 1000)
    return {"cells": [asdict(cell) for cell in cells], "receipts": receipts, "ingest": ingest, "filter": narrow,
            "audit_verified": {"ok": verified.ok, "chains": verified.chains, "problems": list(verified.problems[:5]),
                               "seconds": round(verify_seconds, 2)},
            "audit_bytes_per_receipt": {"before_optimize": size_before / max(1, receipts),
                                        "after_optimize": _audit_size(folder) / max(1, receipts),
                                        "latest_version": live / max(1, receipts)},
            "audit_versions_kept": {"before_optimize": kept_before, "after_optimize": _versions_kept(folder)},
            "freshness_check_ms": {"p50": statistics.median(checks), "p99": sorted(checks)[197]}}  # fmt: skip


def _versions_kept(folder: Path) -> int:
    return sum(1 for _ in (folder / "audit.lance" / "_versions").glob("*.manifest"))


def _commits(folder: Path) -> int:
    """Commits of the audit table so far: its latest version number (pruning does not lower it),
    read from the manifests' names (Lance's V2 scheme names version v ``2**64 - 1 - v``)."""
    numbers = [int(path.stem) for path in (folder / "audit.lance" / "_versions").glob("*.manifest")]
    return max((2**64 - 1 - n if n > 2**63 else n for n in numbers), default=0)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _line(cell: Cell) -> str:
    return (f"{cell.corpus:8} {cell.caller:9} {cell.clients:>3} clients x{cell.replicas}: {cell.per_second:7.1f}/s  "
            f"p50 {cell.p50_ms:7.1f}  p95 {cell.p95_ms:7.1f}  p99 {cell.p99_ms:7.1f} ms  errors {cell.errors}  "
            f"503 {cell.overloaded}  leaks {cell.leaks}  queue {cell.queue_ms:.1f} app {cell.app_ms:.1f} ms "
            f"({', '.join(f'{k} {v}' for k, v in cell.stages_ms.items())})  ingest {cell.ingested_docs_per_s}/s ({cell.chunk_commits} commits)  "
            f"audit commits/receipt {cell.audit_versions_per_receipt:.3f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragwarden.bench.serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--corpus", choices=sorted(CALLERS), default="demo")
    parser.add_argument("--clients", default="1,4,16,64")
    parser.add_argument("--seconds", type=float, default=10.0, help="per cell, timed")
    parser.add_argument("--warmup", type=float, default=1.0, help="per cell, before the timed seconds")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="processes per replica (serve --workers)")
    parser.add_argument("--ingest", action="store_true", help="keep an ingest running throughout")
    parser.add_argument("--ingest-nice", type=int, default=0, help="run that ingest's process at this niceness")
    parser.add_argument("--keep", type=Path, help="build the warehouse in this folder once, and reuse it")
    parser.add_argument("--filter", type=json.loads, help='a narrowing filter sent with every search, e.g. \'{"bucket": 7}\'')
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--data", type=Path, default=Settings.from_env().data_dir)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ragwarden-serve-") as workdir:
        result = run(args.corpus, [int(c) for c in args.clients.split(",")], args.seconds, args.replicas,
                     Path(workdir), args.data, ingest=args.ingest, keep=args.keep, workers=args.workers,
                     narrow=args.filter, ingest_nice=args.ingest_nice, warmup=args.warmup)  # fmt: skip
    result["machine"] = {"cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.mkdir(parents=True, exist_ok=True)
    result["workers"] = args.workers
    result["ingest_nice"] = args.ingest_nice if args.ingest else None
    result["warmup_seconds"] = args.warmup
    suffix = f"{f'-w{args.workers}' if args.workers > 1 else ''}{'-ingest' if args.ingest else ''}"
    suffix += f"-nice{args.ingest_nice}" if args.ingest and args.ingest_nice else ""
    suffix += f"-filter-{hashlib.sha256(json.dumps(args.filter, sort_keys=True).encode()).hexdigest()[:8]}" if args.filter else ""
    target = args.out / f"serve-{args.corpus}-x{args.replicas}{suffix}.json"
    target.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"audit log verified: {result['audit_verified']}")
    print(f"audit bytes per receipt: {result['audit_bytes_per_receipt']}; freshness check: "
          f"{result['freshness_check_ms']}; written to {target}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
