"""``make bench-serve``: what a user of the HTTP service pays, end to end, under concurrency.

    python -m ragwarden.bench.serve [--corpus demo|scifact] [--clients 1,4,16,64] [--seconds 10]
                                    [--replicas 1] [--out bench/results]

Real ``ragwarden serve`` processes on 127.0.0.1 over one warehouse, driven by client threads that
each keep one search in flight (JWT bearer, the query embedded by the service, the receipt written
before the answer). For a broad and a selective caller at each client count: searches/s, p50, p95,
p99, errors, refusals (503 ``overloaded``), the median time in line and at work (``Server-Timing``),
and how the audit log grew (table versions per receipt, bytes per receipt before and after
``optimize``). Every hit of every answer is checked against an oracle computed apart from the
search path (the enforcer on every row of a full scan): one it does not admit is a leak.
"""

from __future__ import annotations

import argparse
import json
import os
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
from ..state import TAG_COLUMNS
from ..warehouse import Warehouse
from . import scifact

SECRET = "ragwarden-bench-serve-secret-0123456789"
ISSUER, AUDIENCE = "https://idp.bench.invalid", "ragwarden-bench"
QUERIES = ["quarterly budget forecast", "salary bands", "cafeteria menu", "acquisition due diligence",
           "litigation hold", "warehouse expansion plan", "security incident", "travel policy"]  # fmt: skip
CALLERS = {"demo": {"broad": ("carol", "acme"), "selective": ("dave", "acme")},
           "scifact": {"broad": ("reader", scifact.TENANT), "selective": ("stranger", scifact.TENANT)}}  # fmt: skip


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
    audit_versions_per_receipt: float


def _warehouse(corpus: str, folder: Path, data: Path) -> Warehouse:
    warehouse = Warehouse(Settings(warehouse=str(folder), data_dir=data))
    if corpus == "demo":
        warehouse.install_policy(policy_file("demo.csv"))
        warehouse.ingest(str(resources.files("ragwarden.examples") / "demo" / "corpus.jsonl"))
    else:
        policy = folder.parent / "scifact-policy.csv"
        policy.write_text(scifact.POLICY, encoding="utf-8")
        warehouse.install_policy(policy)
        warehouse.ingest_records(scifact.records(data / "scifact"))
    warehouse.store.optimize()
    return warehouse


def _serve(warehouse: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAGWARDEN_JWT_SECRET": SECRET, "RAGWARDEN_JWT_ISSUER": ISSUER,
           "RAGWARDEN_JWT_AUDIENCE": AUDIENCE, "RAGWARDEN_POLICY": ""}  # fmt: skip
    command = [str(Path(sys.executable).parent / "ragwarden"), "serve", "--host", "127.0.0.1", "--port", str(port),
               "--warehouse", warehouse]  # fmt: skip
    with log.open("wb") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the replica on port {port} exited; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the replica on port {port} did not become ready")


def _token(sub: str, tenant: str) -> str:
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
    registry = warehouse.store.clause_registry()
    rows = warehouse.store.rows_where("tenant IS NOT NULL", [*TAG_COLUMNS, "chunk_id"])
    return frozenset(row["chunk_id"] for row in rows if check_row(policy, f"user:{sub}", tenant, row, registry).allowed)


def _drive(urls: list[str], sub: str, tenant: str, clients: int, seconds: float, readable: frozenset[str]) -> dict[str, Any]:
    """``clients`` threads, each one search in flight at a time, for ``seconds``; a hit outside
    ``readable`` is a leak."""
    latencies: list[float] = []
    queue: list[float] = []
    app: list[float] = []
    counts = {"errors": 0, "overloaded": 0, "leaks": 0}
    lock = threading.Lock()
    start = threading.Barrier(clients)
    headers = {"Authorization": f"Bearer {_token(sub, tenant)}"}

    def client(number: int) -> None:
        with httpx.Client(headers=headers, timeout=60) as http:
            start.wait()
            deadline = time.monotonic() + seconds
            n = number
            while time.monotonic() < deadline:
                n += 1
                began = time.perf_counter()
                try:
                    answer = http.post(f"{urls[n % len(urls)]}/v1/search", json={"query": QUERIES[n % len(QUERIES)], "k": 10})
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
                        latencies.append(took)
                        timing = answer.headers.get("server-timing", "")
                        queue.append(_timing(timing, "queue"))
                        app.append(_timing(timing, "app"))
                        counts["leaks"] += sum(hit["chunk_id"] not in readable for hit in answer.json()["hits"])

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    ordered = sorted(latencies) or [0.0]

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000

    return {"searches": len(latencies), "per_second": len(latencies) / wall, "p50_ms": pct(0.5), "p95_ms": pct(0.95),
            "p99_ms": pct(0.99), **counts, "queue_ms": statistics.median(queue or [0.0]),
            "app_ms": statistics.median(app or [0.0])}  # fmt: skip


def _audit_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in (folder / "audit.lance").rglob("*") if path.is_file())


def run(corpus: str, clients: list[int], seconds: float, replicas: int, workdir: Path, data: Path) -> dict[str, Any]:
    folder = workdir / f"{corpus}-warehouse"
    warehouse = _warehouse(corpus, folder, data)
    ports = [_free_port() for _ in range(replicas)]
    processes = [_serve(str(folder), port, workdir / f"replica-{port}.log") for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    cells: list[Cell] = []
    try:
        for caller, (sub, tenant) in CALLERS[corpus].items():
            readable = _readable(warehouse, sub, tenant)
            for count in clients:
                before = (warehouse.audit.head()[0], _versions(folder))
                found = _drive(urls, sub, tenant, count, seconds, readable)
                receipts = warehouse.audit.head()[0] - before[0]
                versions = _versions(folder) - before[1]
                cells.append(Cell(corpus=corpus, caller=caller, clients=count, replicas=replicas, **found,
                                  readable=len(readable), audit_versions_per_receipt=versions / max(1, receipts)))  # fmt: skip
                print(_line(cells[-1]), flush=True)
    finally:
        for process in processes:
            process.terminate()
            process.wait(30)
    receipts = warehouse.audit.head()[0]
    size_before = _audit_size(folder)
    warehouse.store.optimize()
    return {"cells": [asdict(cell) for cell in cells], "receipts": receipts,
            "audit_bytes_per_receipt": {"before_optimize": size_before / max(1, receipts),
                                        "after_optimize": _audit_size(folder) / max(1, receipts)}}  # fmt: skip


def _versions(folder: Path) -> int:
    return sum(1 for _ in (folder / "audit.lance" / "_versions").glob("*.manifest"))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _line(cell: Cell) -> str:
    return (f"{cell.corpus:8} {cell.caller:9} {cell.clients:>3} clients x{cell.replicas}: {cell.per_second:7.1f}/s  "
            f"p50 {cell.p50_ms:7.1f}  p95 {cell.p95_ms:7.1f}  p99 {cell.p99_ms:7.1f} ms  errors {cell.errors}  "
            f"503 {cell.overloaded}  leaks {cell.leaks}  queue {cell.queue_ms:.1f} app {cell.app_ms:.1f} ms  "
            f"audit versions/receipt {cell.audit_versions_per_receipt:.2f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragwarden.bench.serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--corpus", choices=sorted(CALLERS), default="demo")
    parser.add_argument("--clients", default="1,4,16,64")
    parser.add_argument("--seconds", type=float, default=10.0, help="per cell")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--data", type=Path, default=Settings.from_env().data_dir)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ragwarden-serve-") as workdir:
        result = run(args.corpus, [int(c) for c in args.clients.split(",")], args.seconds, args.replicas,
                     Path(workdir), args.data)  # fmt: skip
    result["machine"] = {"cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / f"serve-{args.corpus}-x{args.replicas}.json"
    target.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"audit bytes per receipt: {result['audit_bytes_per_receipt']}; written to {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
