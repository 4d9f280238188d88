"""Under more load than it was started to take, the service refuses at once with 503 and
Retry-After instead of queueing without bound; health probes still answer; every answer says in
Server-Timing how long it waited and worked; a worker holding more than its peers closes
connections so that their clients dial again."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from ragwarden.api.balance import WorkerLoads, create_loads_file
from ragwarden.warehouse import Warehouse

HOLD_SECONDS = 1.0


def _with_a_slow_route(app: Any) -> None:
    """A route that holds its slot a known time, so the line's state is certain when we knock."""

    @app.get("/v1/test-slow")
    def slow() -> dict[str, str]:
        time.sleep(HOLD_SECONDS)
        return {"status": "done"}


def test_past_the_line_a_request_is_refused_at_once_with_retry_after_and_probes_still_answer(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    url = serve(small_warehouse, max_in_flight=1, max_queued=1, configure=_with_a_slow_route)
    answers: list[httpx.Response] = []

    def call() -> None:
        answers.append(httpx.get(f"{url}/v1/test-slow", timeout=30))

    first = threading.Thread(target=call)
    first.start()
    time.sleep(0.3)  # the first holds the one slot
    second = threading.Thread(target=call)
    second.start()
    time.sleep(0.3)  # the second waits in the one place in line
    started = time.perf_counter()
    refused = httpx.post(f"{url}/v1/search", json={"query": "menu"}, headers=bearer("alice"), timeout=30)
    refused_in = time.perf_counter() - started
    assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    first.join()
    second.join()

    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "overloaded" and refused_in < HOLD_SECONDS / 2
    assert sorted(a.status_code for a in answers) == [200, 200]
    waited = max(float(a.headers["server-timing"].split("queue;dur=")[1].split(",")[0]) for a in answers)
    assert waited >= 300, f"the second request waited in line, and says so: {waited} ms"
    after = httpx.post(f"{url}/v1/search", json={"query": "menu"}, headers=bearer("alice"), timeout=30)
    assert after.status_code == 200


def test_a_search_says_where_its_time_went_stage_by_stage(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    url = serve(small_warehouse)
    answer = httpx.post(f"{url}/v1/search", json={"query": "cafeteria menu"}, headers=bearer("alice"), timeout=30)
    assert answer.status_code == 200 and answer.json()["hits"]
    took = answer.json()["took_ms"]
    assert set(took) == {"embed", "rank", "check", "receipt"} and all(ms >= 0 for ms in took.values())
    timing = dict(part.strip().split(";dur=") for part in answer.headers["server-timing"].split(","))
    assert {"queue", "app", "embed", "rank", "check", "receipt"} <= set(timing)
    assert float(timing["app"]) >= sum(took.values()) * 0.99, "the stages are parts of the time at work"


def test_each_request_leaves_one_json_access_line_without_its_query(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]], caplog
):
    url = serve(small_warehouse)
    caplog.set_level(logging.INFO, logger="ragwarden.access")
    secret_query = "cafeteria menu for the board"
    httpx.post(f"{url}/v1/search", json={"query": secret_query}, headers=bearer("alice"), timeout=30)
    httpx.get(f"{url}/v1/chunks/no-such-chunk?about=user:dave", headers=bearer("alice"), timeout=30)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ragwarden.access"]
    assert [(line["method"], line["path"], line["status"]) for line in lines] == [
        ("POST", "/v1/search", 200), ("GET", "/v1/chunks/no-such-chunk", 404)
    ]
    assert {"queue_ms", "app_ms", "embed_ms", "receipt_ms"} <= set(lines[0])
    assert not any(secret_query in r.getMessage() or "user:dave" in r.getMessage() or "Bearer" in r.getMessage()
                   for r in caplog.records)  # fmt: skip


def test_a_worker_serving_more_connections_than_its_peer_closes_some_and_one_within_the_margin_keeps_them(
    small_warehouse: Warehouse, serve: Callable[..., str], tmp_path: Path, caplog
):
    loads = create_loads_file(str(tmp_path))
    worker = WorkerLoads(loads, window=0.5)
    url = serve(small_warehouse, peers=worker, configure=_with_a_slow_route)
    peer = WorkerLoads(loads)  # another worker of the same server, idle
    peer.claim()

    def closed_of(concurrent: int) -> list[bool]:
        """Whether each of ``concurrent`` requests, each on a connection of its own, was answered
        with ``Connection: close``."""
        answers: list[httpx.Response] = []
        threads = [threading.Thread(target=lambda: answers.append(httpx.get(f"{url}/v1/test-slow", timeout=30)))
                   for _ in range(concurrent)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [a.status_code for a in answers] == [200] * concurrent
        return [a.headers.get("connection") == "close" for a in answers]

    caplog.set_level(logging.INFO, logger="ragwarden.access")
    assert sum(closed_of(5)) >= 2, "five connections against an idle peer: past the margin of two"
    assert worker.closed >= 2
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ragwarden.access"]
    assert sum(line.get("rebalanced", False) for line in lines) == worker.closed, "the access log says which"
    time.sleep(worker.window + 0.1)  # those connections are quiet now, and no longer count
    assert closed_of(2) == [False, False], "two against an idle peer is within the margin"


def _with_a_listening_stream(app: Any) -> None:
    """A GET under the MCP path that stays open a known time, as a client's listening stream does."""

    @app.get("/mcp/test-listen")
    async def listen() -> dict[str, str]:
        await asyncio.sleep(HOLD_SECONDS)
        return {"status": "done"}


def test_listening_streams_hold_no_place_at_work(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    url = serve(small_warehouse, max_in_flight=1, max_queued=0, configure=_with_a_listening_stream)
    streams = [threading.Thread(target=httpx.get, args=(f"{url}/mcp/test-listen",), kwargs={"timeout": 30})
               for _ in range(3)]  # fmt: skip
    for stream in streams:
        stream.start()
    time.sleep(0.3)  # three streams open, each for a second
    answer = httpx.post(f"{url}/v1/search", json={"query": "menu"}, headers=bearer("alice"), timeout=30)
    for stream in streams:
        stream.join()
    assert answer.status_code == 200, "the one place at work was free: open streams are not work"


def test_a_request_whose_client_hung_up_in_line_is_not_run_and_is_logged_as_499(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]], caplog
):
    url = serve(small_warehouse, max_in_flight=1, max_queued=4, configure=_with_a_slow_route)
    caplog.set_level(logging.INFO, logger="ragwarden.access")
    holder = threading.Thread(target=httpx.get, args=(f"{url}/v1/test-slow",), kwargs={"timeout": 30})
    holder.start()
    time.sleep(0.3)  # the one place at work is held for a second
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"query": "cafeteria menu"}).encode()
    head = (f"POST /v1/search HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nAuthorization: {bearer('alice')['Authorization']}\r\n\r\n")  # fmt: skip
    with socket.create_connection((host, int(port))) as hung_up:
        hung_up.sendall(head.encode() + body)
        time.sleep(0.2)  # in line behind the slow request; then the client goes
    holder.join()
    time.sleep(0.3)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ragwarden.access"]
    searches = [line for line in lines if line["path"] == "/v1/search"]
    assert [line["status"] for line in searches] == [499], f"access lines of the search: {searches}"
    assert "embed_ms" not in searches[0], "the search itself never ran"
