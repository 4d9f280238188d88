"""``python -m ragwarden.bench.power_loss``: power loss at scale. A warehouse of ``--rows`` rows
(the import benchmark's world: 40 groups of Zipf sizes) served by one replica while a writer
process ingests batches; then every process SIGKILLed at a random point, ``--trials`` times.

After each kill the replica starts again, and the time from its start to its first correct
answer is measured as the user pays it: process start, model, warehouse, the query embedded, the
receipt written, over HTTP; correct means exactly the exact top 10 of the caller's group (numpy
over the rows' own vectors). At the end, everything acknowledged is checked: each batch the
writer said was written is there, each search answered has its receipt, and the audit chain
verifies (or names exactly what a kill cut). Target: first correct answer <= 5 s, not growing
with the history the trials leave. Writes ``power-loss-ROWS.json``.

    python -m ragwarden.bench.power_loss [--rows 1000000] [--trials 10]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ..config import Settings
from ..embedder import Embedder
from ..governance.audit import fingerprint
from ..warehouse import Warehouse
from .brought import TENANT, bare_add, install_groups, records
from .churn import RESULTS
from .churn import group as group_name
from .serve import AUDIENCE, ISSUER, SECRET, free_port, token_for

TARGET_FIRST_ANSWER_S = 5.0
WRITER_GROUP = 39
"""The group the writer's notes are readable by, never a searching caller's: the callers' oracle is
then the imported rows alone (notes, real text, would outrank the rows' synthetic vectors)."""
CLI = Path(sys.executable).parent / "ragwarden"
WRITER = textwrap.dedent("""
    import sys
    from ragwarden.config import Settings
    from ragwarden.warehouse import Warehouse
    warehouse = Warehouse(Settings(warehouse=sys.argv[1], ingest_maintenance=False))
    for n in range(10_000):
        ids = [f"{sys.argv[2]}-{n}-{i}" for i in range(5)]
        written = warehouse.ingest_records([{"id": d, "text": f"note {d}", "tenant": "acme", "acl": {"allow": [sys.argv[3]]},
                                             "classification": "public"} for d in ids])
        if written.ok:
            print(" ".join(ids), flush=True)  # acknowledged: the commit and its receipt are durable
""")


def world(folder: Path, rows: int) -> tuple[str, np.ndarray, np.ndarray]:
    """The import benchmark's world of ``rows`` rows, imported into a new warehouse."""
    from ..embedder import MODEL_NAME
    from ..ingest.importers import AclFromMetadata, lancedb_rows

    made, vectors, groups = records(rows)
    bare_add(folder / "bare", made, vectors)
    del made
    total, collected = lancedb_rows(str(folder / "bare"), "bare")
    uri = str(folder / "warehouse")
    with Warehouse(Settings(warehouse=uri, ingest_maintenance=False)) as warehouse:
        install_groups(warehouse)
        warehouse.import_collection(collected, tags=AclFromMetadata.parse("allow=acl_allow"), model=MODEL_NAME, origin="bench",
                                    tenant=TENANT, classification="public", total=total, progress=False)  # fmt: skip
    return uri, vectors, groups


def trial(uri: str, folder: Path, n: int, want: set[str], query: str, group: int, rng: random.Random) -> dict[str, Any]:
    """Start the replica, time its first correct answer, load it while a writer ingests, then
    SIGKILL both at a random point."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAGWARDEN_JWT_SECRET": SECRET, "RAGWARDEN_JWT_ISSUER": ISSUER,
           "RAGWARDEN_JWT_AUDIENCE": AUDIENCE, "RAGWARDEN_POLICY": ""}  # fmt: skip
    port, bearer = free_port(), {"Authorization": f"Bearer {token_for(f'u{group:02d}', TENANT)}"}
    began = time.monotonic()
    with (folder / f"replica-{n}.log").open("wb") as log:
        replica = subprocess.Popen([str(CLI), "serve", "--port", str(port), "--warehouse", uri, "--no-mcp"], env=env, stdout=log,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    first, correct = None, False
    with httpx.Client(timeout=120) as client:  # one client: a new one per try would load the CA bundle each time,
        while first is None and time.monotonic() - began < 300:  # CPU the starting replica needs
            try:
                answer = client.post(f"http://127.0.0.1:{port}/v1/search", json={"query": query, "k": 10}, headers=bearer)
            except httpx.TransportError:
                time.sleep(0.02)
                continue
            if answer.status_code == 200:
                first, correct = time.monotonic() - began, {hit["doc_id"] for hit in answer.json()["hits"]} == want
    writer = subprocess.Popen([sys.executable, "-c", WRITER, uri, f"t{n}", group_name(WRITER_GROUP)], env=env, stdout=subprocess.PIPE, text=True)
    acknowledged: list[str] = []
    answered: list[str] = []
    stop = threading.Event()

    def acknowledgments() -> None:
        for line in writer.stdout:  # type: ignore[union-attr]
            acknowledged.extend(line.split())

    def load() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                asked = f"{query} {len(answered)} {rng.random()}"
                try:
                    if client.post(f"http://127.0.0.1:{port}/v1/search", json={"query": asked, "k": 10}, headers=bearer).status_code == 200:
                        answered.append(asked)
                except httpx.TransportError:
                    return

    threads = [threading.Thread(target=acknowledgments), threading.Thread(target=load)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while not acknowledged and writer.poll() is None and time.monotonic() < deadline:  # the writer at work (model loaded)
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 5.0))  # the kill: anywhere in the load, the writer's commits and the fold
    for process in (replica, writer):
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
    stop.set()
    for process in (replica, writer):
        process.wait()
    for thread in threads:
        thread.join(60)
    writer.stdout.close()  # type: ignore[union-attr]
    return {"trial": n, "first_correct_answer_s": round(first, 2) if first is not None else None, "correct": correct,
            "acknowledged": acknowledged, "answered": answered}  # fmt: skip


def run(rows: int, trials: int, folder: Path, seed: int = 36) -> dict[str, Any]:
    uri, vectors, groups = world(folder, rows)
    embedder, rng = Embedder(), random.Random(seed)
    done = []
    for n in range(trials):
        group = rng.randrange(WRITER_GROUP)
        query = f"imported row of group {group}, trial {n}"
        mine = np.flatnonzero(groups == group)
        scores = vectors[mine] @ embedder.encode([query])[0]
        want = {f"r{i:07d}" for i in mine[np.argsort(-scores, kind="stable")[:10]].tolist()}
        done.append(trial(uri, folder, n, want, query, group, rng))
        print(f"trial {n}: first correct answer in {done[-1]['first_correct_answer_s']} s (correct: {done[-1]['correct']})", flush=True)
    with Warehouse(Settings(warehouse=uri)) as warehouse:
        acknowledged = [doc for t in done for doc in t["acknowledged"]]
        held = warehouse.store.sources.states([(TENANT, doc) for doc in acknowledged])
        recorded = {r.query_fingerprint for r in warehouse.audit.query(operation="search")}
        answered = [q for t in done for q in t["answered"]]
        verified = warehouse.audit.verify()
    firsts = [t["first_correct_answer_s"] for t in done]
    return {"rows": rows, "trials": trials, "first_correct_answer_s": firsts, "all_correct": all(t["correct"] for t in done),
            "max_first_correct_answer_s": max(f for f in firsts if f is not None) if any(firsts) else None,
            "acknowledged_documents": len(acknowledged), "acknowledged_lost": len(acknowledged) - len(held),
            "answered_searches": len(answered), "receipts_lost": sum(fingerprint(q) not in recorded for q in answered),
            "audit_ok": verified.ok, "audit_problems": list(verified.problems)[:5], "target_s": TARGET_FIRST_ANSWER_S,
            "machine": {"cpus": os.cpu_count(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        record = run(args.rows, args.trials, Path(folder))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"power-loss-{args.rows}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"{args.rows:,} rows, {args.trials} SIGKILLs of the replica and a writer: first correct answer after restart "
          f"{min(f for f in record['first_correct_answer_s'] if f)}-{record['max_first_correct_answer_s']} s (target "
          f"{TARGET_FIRST_ANSWER_S} s), all correct {record['all_correct']}; {record['acknowledged_documents']} acknowledged "
          f"documents, {record['acknowledged_lost']} lost; {record['answered_searches']} answered searches, "
          f"{record['receipts_lost']} without a receipt; audit verify {'clean' if record['audit_ok'] else record['audit_problems']}")  # fmt: skip
    met = (record["all_correct"] and (record["max_first_correct_answer_s"] or 1e9) <= TARGET_FIRST_ANSWER_S
           and not record["acknowledged_lost"] and not record["receipts_lost"] and record["audit_ok"])  # fmt: skip
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
