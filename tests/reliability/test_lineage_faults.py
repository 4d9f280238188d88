"""The lineage backend down, slow or failing with 5xx: ingest, search, derive, sync and forget go
on as usual; every event waits in the spool and reaches the backend exactly once when it is back,
also when two processes flush the same spool at the same time."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.lineage_receiver import Receiver, closed_port
from support.lineage_workers import emit_runs
from support.spawned import run_together

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.lineage_emitter import LineageEmitter
from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse

SLOW_BACKEND_SECONDS = 30.0
OPERATION_BOUND = 5.0  # a run tries a down backend once, for at most a second (HTTP_BOUNDS)


def http_env(url: str) -> dict[str, str]:
    return {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": url}


def runs_and_types(events: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    return Counter((event["run"]["runId"], event["eventType"]) for event in events)


def spooled(warehouse: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted((warehouse / "_lineage" / "spool").glob("*.json"))]


def failing_backend(how: str, receiver: Any) -> tuple[int, Receiver | None]:
    """The port of a backend that is down in the way ``how`` says, and its receiver (if one listens)."""
    if how == "port closed":
        return closed_port(), None
    backend = receiver(mode="503" if how == "answering 503" else "slow", delay=SLOW_BACKEND_SECONDS)
    return backend.port, backend


def timed(operation: Any) -> tuple[Any, float]:
    began = time.perf_counter()
    result = operation()
    return result, time.perf_counter() - began


@pytest.mark.parametrize("how", ["port closed", "answering 503", "slow"])
def test_operations_go_on_while_the_backend_fails_and_each_event_arrives_once(
    how: str, tmp_path: Path, embedder: Embedder, receiver: Any
) -> None:
    port, backend = failing_backend(how, receiver)
    folder = tmp_path / "warehouse"
    env = http_env(f"http://127.0.0.1:{port}")
    warehouse = Warehouse(Settings(warehouse=str(folder), openlineage_env=env), embedder=embedder)
    warehouse.install_policy(policy_file("demo.csv"))
    record = {"id": "memo-1", "text": "The vendor renewal for the payroll system is due in May.", "tenant": "acme",
              "acl": {"allow": ["group:staff"]}, "classification": "internal"}  # fmt: skip

    took: dict[str, float] = {}
    report, took["ingest"] = timed(lambda: warehouse.ingest_records([record]))
    assert report.ok
    hits, took["search"] = timed(lambda: warehouse.search("payroll vendor renewal", subject="user:dave", tenant="acme"))
    assert hits and hits[0].doc_id == "memo-1"
    _, took["derive"] = timed(
        lambda: warehouse.derive("Renew in May.", parents=[hits[0].chunk_id], subject="user:dave", tenant="acme")
    )
    _, took["sync"] = timed(lambda: warehouse.sync([{**record, "labels": ["finance"]}]))
    _, took["forget"] = timed(lambda: warehouse.forget("memo-1", reason="test"))
    slow = {operation: round(seconds, 2) for operation, seconds in took.items() if seconds > OPERATION_BOUND}
    assert not slow, f"with the backend {how}, these took over {OPERATION_BOUND} s: {slow}"

    waiting = spooled(folder)
    jobs = Counter((event["job"]["name"], event["eventType"]) for event in waiting)
    assert jobs == Counter({(f"ragwarden.{job}", state): 1 for job in ("ingest", "derive", "sync", "forget")
                            for state in ("START", "COMPLETE")})  # fmt: skip

    back = receiver(port) if backend is None else backend
    back.mode = "up"
    delivered = warehouse.openlineage.flush()
    assert (delivered.sent, delivered.failed, delivered.pending) == (8, 0, 0)
    assert back.events == waiting, "the backend got other events, or in another order, than were spooled"
    assert warehouse.openlineage.flush().sent == 0
    assert set(runs_and_types(back.events).values()) == {1}


@pytest.mark.slow  # spawns two interpreters
def test_two_processes_flushing_one_spool_deliver_each_event_once(tmp_path: Path, receiver: Any) -> None:
    folder = tmp_path / "warehouse"
    port = closed_port()
    backlog = [emit_runs_here(folder, f"http://127.0.0.1:{port}", n) for n in range(10)]  # spooled while down
    assert len(spooled(folder)) == 20
    backend = receiver(port)

    outcomes = run_together(emit_runs, [(str(folder), backend.url, 25)] * 2, tmp_path, timeout=180)
    assert not [e for o in outcomes for e in o["errors"]], outcomes

    with LineageEmitter(str(folder), folder / "_lineage", http_env(backend.url)) as later:
        later.flush()  # what a later process does first: send what waits
    runs = [*backlog, *(run for outcome in outcomes for run in outcome["runs"])]
    expected = Counter({(run, state): 1 for run in runs for state in ("START", "COMPLETE")})
    assert runs_and_types(backend.events) == expected, "an event was lost or delivered twice"
    assert spooled(folder) == []
    assert not (folder / "_lineage" / "rejected").exists()


def emit_runs_here(folder: Path, url: str, n: int) -> str:
    """Emit one ingest run in this process; its run id."""
    with (
        LineageEmitter(str(folder), folder / "_lineage", http_env(url)) as emitter,
        emitter.run("ingest", [f"doc:backlog-{n}"]) as scope,
    ):
        return scope.run.run_id
