"""Load on 127.0.0.1: eight clients search the HTTP service for half a minute while an
administrator ingests; every answer is checked against an oracle that shares no code with the product.

``RAGWARDEN_LOAD_SECONDS`` sets the duration (30 by default: about thirty batches of rows arrive
while the clients search; duration itself is the soak's to show); figures are printed and written to
``load.json`` in the test's folder, and to ``RAGWARDEN_LOAD_REPORT`` when it is set. ``make soak``
runs this test for half an hour (``SOAK_SECONDS``), outside CI.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from support.oracle import ORACLE_COLUMNS, oracle_visible, world_of_policy
from support.raw_tables import raw_table

from ragwarden.api.http import create_app
from ragwarden.config import AuthSettings, Settings
from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse

CLIENTS = 8
CALLERS = [("alice", "acme"), ("bob", "acme"), ("carol", "acme"), ("dave", "acme"), ("frank", "acme"),
           ("olivia", "acme"), ("erin", "globex"), ("hank", "globex"), ("carol", "globex")]  # fmt: skip
QUERIES = ["salary bands and compensation", "quarterly budget forecast", "merger due diligence", "investigation notes",
           "parental leave benefits", "export control", "office move plans", "payroll for contractors"]  # fmt: skip
NEW_ACLS = [({"allow": ["group:finance"]}, ["finance"], "confidential"), ({"allow": ["everyone"]}, [], "public"),
            ({"allow": ["group:hr"], "deny": ["user:bob"]}, ["pii"], "restricted"), ({"allow": ["group:staff"]}, [], "internal")]  # fmt: skip


@pytest.mark.slow
def test_eight_clients_for_half_a_minute_while_one_ingests_get_no_error_and_no_leak(
    demo_warehouse: Warehouse, tmp_path: Path, auth_settings: AuthSettings, mint: Callable[..., str]
):
    from support.live_server import serving

    seconds = float(os.environ.get("RAGWARDEN_LOAD_SECONDS", "30"))
    demo_warehouse.close()  # the receipts other tests left, folded before the copy
    shutil.copytree(demo_warehouse.uri, tmp_path / "warehouse")
    warehouse = Warehouse(Settings(warehouse=str(tmp_path / "warehouse")), embedder=demo_warehouse.embedder)
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(number: int, url: str) -> None:
        rng = random.Random(number)
        with httpx.Client(base_url=url, timeout=120) as http:
            while not stop.is_set():
                user, tenant = rng.choice(CALLERS)
                started = time.perf_counter()
                response = http.post("/v1/search", json={"query": rng.choice(QUERIES), "k": 10},
                                     headers={"Authorization": f"Bearer {mint(user, tenant=tenant)}"})  # fmt: skip
                elapsed = time.perf_counter() - started
                hits = response.json().get("hits", []) if response.status_code == 200 else []
                with lock:
                    results.append({"user": user, "tenant": tenant, "status": response.status_code, "seconds": elapsed,
                                    "hits": [(h["chunk_id"], tuple(h["labels"])) for h in hits]})  # fmt: skip

    ingested: list[int] = []

    def ingester(url: str) -> None:
        rng, batch = random.Random(99), 0
        with httpx.Client(base_url=url, timeout=120) as http:
            while not stop.wait(1.0):
                acl, labels, level = NEW_ACLS[batch % len(NEW_ACLS)]
                records = [{"id": f"load-{batch}-{i}", "text": f"{rng.choice(QUERIES)} update {batch}-{i}", "tenant": "acme",
                            "acl": acl, "labels": labels, "classification": level} for i in range(3)]  # fmt: skip
                response = http.post("/v1/ingest", json={"records": records}, headers={"Authorization": f"Bearer {mint('admin')}"})
                ingested.append(response.status_code)
                batch += 1

    with serving(create_app(Settings(warehouse=warehouse.uri, auth=auth_settings), warehouse=warehouse, with_mcp=False)) as url:
        threads = [threading.Thread(target=client, args=(n, url)) for n in range(CLIENTS)]
        threads.append(threading.Thread(target=ingester, args=(url,)))
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join(180)

    rows = raw_table(warehouse.store).search().select(ORACLE_COLUMNS).limit(None).to_list()
    oracle, registry = world_of_policy(policy_file("demo.csv").read_text(encoding="utf-8")), warehouse.store.registries.clauses()
    labels = {row["chunk_id"]: tuple(row["labels"]) for row in rows}
    visible = {(u, t): oracle_visible(oracle, f"user:{u}", t, rows, registry) for u, t in set(CALLERS)}
    errors = [r for r in results if r["status"] != 200]
    leaks = [(r["user"], r["tenant"], chunk) for r in results for chunk, _ in r["hits"] if chunk not in visible[r["user"], r["tenant"]]]
    mislabelled = [chunk for r in results for chunk, shown in r["hits"] if labels.get(chunk) != shown]
    latency = np.array([r["seconds"] for r in results]) * 1000
    figures = {"clients": CLIENTS, "seconds": seconds, "requests": len(results), "errors": len(errors), "leaks": len(leaks),
               "hits_checked": sum(len(r["hits"]) for r in results), "ingest_batches": len(ingested),
               "ingest_errors": sum(1 for s in ingested if s != 200), "rows_at_end": len(rows),
               "p50_ms": float(np.percentile(latency, 50)), "p99_ms": float(np.percentile(latency, 99)),
               "requests_per_second": len(results) / seconds}  # fmt: skip
    for report in (tmp_path / "load.json", os.environ.get("RAGWARDEN_LOAD_REPORT")):
        if report:
            Path(report).write_text(json.dumps(figures, indent=2))
    print("load:", json.dumps(figures))
    assert not errors, errors[:3]
    assert not leaks, leaks[:5]
    assert not mislabelled, mislabelled[:5]
    assert figures["ingest_errors"] == 0 and figures["ingest_batches"] >= 5  # rows arrived throughout
    assert len(rows) > len(raw_table(demo_warehouse.store).search().limit(None).to_list())
    assert figures["requests"] >= CLIENTS * 5 and figures["hits_checked"] > 0
