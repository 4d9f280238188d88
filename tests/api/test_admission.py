"""Under more load than it was started to take, the service refuses at once with 503 and
Retry-After instead of queueing without bound; health probes still answer; the access log says how
long each request waited and worked, and answers say it only where the operator asks
(``server_timing``); a worker holding more than its peers closes connections so that their clients
dial again."""

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
import pytest

from ragwarden.api.admission import FairSlots, _Refused
from ragwarden.api.balance import WorkerLoads, create_loads_file
from ragwarden.api.callers import UNVERIFIED
from ragwarden.api_keys import api_keys_at
from ragwarden.warehouse import Warehouse

HOLD_SECONDS = 1.0


def _with_a_slow_route(app: Any) -> None:
    """A route that holds its slot a known time, so the line's state is certain when we knock."""

    @app.get("/v1/test-slow")
    def slow() -> dict[str, str]:
        time.sleep(HOLD_SECONDS)
        return {"status": "done"}


def test_past_the_line_a_request_is_refused_at_once_with_retry_after_and_probes_still_answer(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]], 
    caplog: pytest.LogCaptureFixture,
):
    url = serve(small_warehouse, max_in_flight=1, max_queued=1, configure=_with_a_slow_route)
    caplog.set_level(logging.INFO, logger="ragwarden.access")
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
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ragwarden.access"]
    waited = max(line["queue_ms"] for line in lines if line["path"] == "/v1/test-slow")
    assert waited >= 300, f"the second request waited in line, and the access log says so: {waited} ms"
    after = httpx.post(f"{url}/v1/search", json={"query": "menu"}, headers=bearer("alice"), timeout=30)
    assert after.status_code == 200


def test_a_search_tells_the_operator_where_its_time_and_work_went_and_the_caller_nothing(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]], 
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.INFO, logger="ragwarden.access")
    url = serve(small_warehouse)
    answer = httpx.post(f"{url}/v1/search", json={"query": "cafeteria menu"}, headers=bearer("alice"), timeout=30)
    assert answer.status_code == 200 and answer.json()["hits"]
    assert set(answer.json()) == {"hits", "manifest"} and "server-timing" not in answer.headers
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ragwarden.access"]
    stages = {name.removesuffix("_ms"): ms for name, ms in line.items() if name.endswith("_ms")}
    assert {"queue", "app", "embed", "rank", "check", "receipt"} <= set(stages) and all(ms >= 0 for ms in stages.values())
    assert line["app_ms"] >= (stages["embed"] + stages["rank"] + stages["check"]) * 0.99, "stages are parts of the work"
    assert line["work"]["rows_checked"] == len(answer.json()["hits"]) and line["work"]["rows_read"] > 0


def test_an_operator_who_asks_for_server_timing_gets_it_on_each_answer(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    url = serve(small_warehouse, server_timing=True)
    answer = httpx.post(f"{url}/v1/search", json={"query": "cafeteria menu"}, headers=bearer("alice"), timeout=30)
    timing = dict(part.strip().split(";dur=") for part in answer.headers["server-timing"].split(","))
    assert {"queue", "app", "embed", "rank", "check", "receipt"} <= set(timing)
    assert float(timing["app"]) >= sum(float(timing[name]) for name in ("embed", "rank", "check")) * 0.99


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


# -- fair shares -----------------------------------------------------------------------------------


def test_a_caller_holds_its_share_first_and_more_only_while_no_one_else_waits(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("ragwarden.api.admission.ACTIVE_SECONDS", 0.2)
    work = 0.01  # both callers' requests cost the same: half the places each

    async def scenario() -> None:
        slots = FairSlots(4, 8)
        assert [slots.admit("a") for _ in range(4)] == [None] * 4, "alone, a caller may use every place"
        more_of_a = [slots.admit("a") for _ in range(3)]
        b = slots.admit("b")
        assert b is not None and all(f is not None for f in more_of_a) and slots.share("a") == 2
        slots.release("a", work)  # a free place: b's, though a asked first (a holds 3, past its share of 2)
        assert b.done() and not any(f.done() for f in more_of_a)
        slots.release("a", work)  # past its share, but no one else waits and b is at work: lent to a
        assert more_of_a[0].done() and slots.busy == 4
        slots.release("b", work)  # b is active with nothing at work: a place is kept free for it
        assert slots.busy == 3 and not more_of_a[1].done()
        await asyncio.sleep(0.25)  # b has been quiet past ACTIVE_SECONDS: a's share is every place again
        slots.release("a", work)
        assert all(f.done() for f in more_of_a) and slots.busy == 4

    asyncio.run(scenario())


def test_a_caller_whose_requests_cost_more_holds_fewer_places_beside_a_cheaper_one() -> None:
    """Shares are of time at work: a caller of 300 ms requests holds one place of eight beside a
    caller of 6 ms ones, who may hold the other seven; no more is lent to it while the cheaper
    caller is active (the time it would take is the other's), and it gives way while that one works.
    Two callers alike lend each other what one of them leaves free."""

    async def scenario() -> None:
        slots = FairSlots(8, 32)
        assert slots.admit("heavy") is None and slots.admit("light") is None
        slots.release("heavy", 0.3)
        slots.release("light", 0.006)
        assert (slots.share("heavy"), slots.share("light")) == (1, 7)
        assert slots.share("newcomer") == slots.share("heavy"), "a caller not yet measured counts as the costliest"
        asked = [slots.admit("heavy") for _ in range(3)]
        assert asked[0] is None and all(f is not None for f in asked[1:]), "one place at work, the rest wait"
        assert all(slots.admit("light") is None for _ in range(7)), "the cheaper caller's seven"
        assert slots.cheaper_at_work("heavy") and not slots.cheaper_at_work("light"), "the heavy one gives way"

        alike = FairSlots(8, 32)
        assert alike.admit("a") is None and alike.admit("b") is None
        alike.release("a", 0.01)
        alike.release("b", 0.01)
        lent = [alike.admit("a") for _ in range(8)]
        assert lent[:7] == [None] * 7 and lent[7] is not None, "four of its own, three lent, one kept free for b"
        assert alike.admit("b") is None and not alike.cheaper_at_work("a"), "b starts at once; no one gives way"

    asyncio.run(scenario())


def test_a_full_line_takes_a_newcomer_in_place_of_a_caller_holding_more_than_its_share() -> None:
    async def scenario() -> None:
        slots = FairSlots(1, 2)
        assert slots.admit("a") is None
        first, last = slots.admit("a"), slots.admit("a")  # the line is full, all a's
        b = slots.admit("b")
        assert b is not None and last is not None and isinstance(last.exception(), _Refused)
        assert first is not None and not first.done(), "a keeps its share of the line"
        with pytest.raises(_Refused):
            slots.admit("c")  # a and b each hold their share: the line is full for c
        slots.release("a", 0.01)
        assert b.done() and not first.done(), "the line is served caller by caller: b, then a"

    asyncio.run(scenario())


def test_a_caller_sending_many_slow_requests_waits_behind_its_own_not_in_front_of_another(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    url = serve(small_warehouse, max_in_flight=2, max_queued=16, configure=_with_a_slow_route)
    finished: dict[str, list[float]] = {"alice": [], "bob": []}
    started = time.perf_counter()

    def call(who: str) -> None:
        answer = httpx.get(f"{url}/v1/test-slow", headers=bearer(who), timeout=30)
        assert answer.status_code == 200
        finished[who].append(time.perf_counter() - started)

    flood = [threading.Thread(target=call, args=("alice",)) for _ in range(6)]
    for thread in flood:
        thread.start()
    time.sleep(0.3)  # alice holds both places and four more wait
    other = threading.Thread(target=call, args=("bob",))
    other.start()
    for thread in [*flood, other]:
        thread.join()
    (bob,) = finished["bob"]
    assert bob < 2 * HOLD_SECONDS + 0.3, f"bob was served at the first free place ({bob:.2f} s), not after alice's line"
    assert max(finished["alice"]) > bob


# -- a search's deadline, and a client that leaves ---------------------------------------------------


def test_a_search_past_its_deadline_answers_503_and_the_access_line_says_so(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]], 
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.INFO, logger="ragwarden.access")
    url = serve(small_warehouse, search_deadline_seconds=1e-6)
    answer = httpx.post(f"{url}/v1/search", json={"query": "cafeteria menu"}, headers=bearer("alice"), timeout=30)
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "deadline_exceeded"
    assert "search_deadline_seconds" in answer.json()["error"]["message"]
    time.sleep(0.2)
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ragwarden.access"]
    assert line["status"] == 503 and "rows_checked" not in line.get("work", {})


def test_a_search_whose_client_leaves_while_it_works_stops_and_is_logged_as_499(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]], 
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
):
    """The search is held at its query's embedding (the real encoder, after a pause the test
    controls) while its client hangs up; released, it stops at its next check, before ranking."""
    caplog.set_level(logging.INFO, logger="ragwarden.access")
    url = serve(small_warehouse)
    paused, encode = threading.Event(), small_warehouse.embedder.encode
    monkeypatch.setattr(small_warehouse.embedder, "encode", lambda texts: paused.wait(10) and encode(texts))
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"query": "cafeteria menu"}).encode()
    head = (f"POST /v1/search HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nAuthorization: {bearer('alice')['Authorization']}\r\n\r\n")  # fmt: skip
    receipts = len(small_warehouse.audit.query(subject="user:alice", limit=100))
    with socket.create_connection((host, int(port))) as leaving:
        leaving.sendall(head.encode() + body)
        time.sleep(0.3)  # at work, held at the embedding
    time.sleep(0.3)  # the server sees the client go
    paused.set()
    deadline = time.monotonic() + 10
    while not (lines := [json.loads(r.getMessage()) for r in caplog.records if r.name == "ragwarden.access"]):
        assert time.monotonic() < deadline, "the search never finished"
        time.sleep(0.05)
    (line,) = lines
    assert line["status"] == 499 and "rows_checked" not in line.get("work", {}), line
    assert len(small_warehouse.audit.query(subject="user:alice", limit=100)) == receipts, "no answer, no retrieval"


# -- who a request is admitted as --------------------------------------------------------------------


def test_credentials_no_route_verified_are_admitted_as_one_caller_and_a_verified_key_as_its_identity(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    """Random strings cannot make an attacker many callers; an API key, once a route verified it,
    is its identity, the same caller as that user's tokens."""
    apps: list[Any] = []
    url = serve(small_warehouse, configure=apps.append)
    names = apps[0].state.caller_names

    def scope(header: str) -> dict[str, Any]:
        return {"type": "http", "headers": [(b"authorization", header.encode())]}

    forged = {names(scope(f"Bearer rwk_{n}forged")) for n in range(5)} | {names(scope("Bearer not-a-token"))}
    assert forged == {UNVERIFIED}
    key = api_keys_at(small_warehouse.uri).create(subject="user:alice", tenant="acme")
    assert names(scope(f"Bearer {key}")) == UNVERIFIED, "not yet verified by a route"
    assert httpx.post(f"{url}/v1/search", json={"query": "menu"}, headers={"Authorization": f"Bearer {key}"},
                      timeout=30).status_code == 200  # fmt: skip
    assert names(scope(f"Bearer {key}")) == names(scope(bearer("alice")["Authorization"])) != UNVERIFIED


def test_a_request_with_two_credentials_is_refused_before_anything_runs(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    url = serve(small_warehouse)
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"query": "menu"}).encode()
    head = (f"POST /v1/search HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\nAuthorization: {bearer('alice')['Authorization']}\r\n"
            f"Authorization: Bearer rwk_someone-else\r\n\r\n")  # fmt: skip
    with socket.create_connection((host, int(port))) as client:
        client.sendall(head.encode() + body)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    status, _, rest = answer.partition(b"\r\n")
    assert b" 422 " in status and b"send one Authorization header, not 2" in rest and b"invalid_request" in rest
