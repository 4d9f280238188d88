"""``/metrics``: after real requests to a real service on 127.0.0.1, the Prometheus text parses and
each metric says exactly what the test caused (requests by route template, stage times, the
admission line, receipts not yet folded, the serving index and its lag, lineage events spooled);
no label names a caller, a query or a document; and only the clients the setting allows read it."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.lineage_receiver import Receiver

from ragwarden.config import Settings
from ragwarden.errors import ConfigurationError
from ragwarden.warehouse import Warehouse

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
REMOTE = {"X-Forwarded-For": "203.0.113.9"}
"""A client beyond this host, as a proxy on it reports one (uvicorn trusts the header from 127.0.0.1)."""
LABEL_NAMES = {"route", "method", "status", "stage", "state", "le"}
SEARCH_STAGES = ("embed", "rank", "check")
NEW_RECORD = {"id": "acme-parking", "text": "The parking garage closes for repairs in May.",
              "acl": {"allow": ["everyone"], "deny": []}, "labels": [], "classification": "public"}  # fmt: skip


def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    """Every sample of the service's ``/metrics``, parsed by prometheus_client's own parser."""
    answer = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(answer.text) for sample in family.samples}  # fmt: skip


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 for a series not yet created (a counter nothing has raised)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def raised(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def until(url: str, holds: Callable[[Samples], bool], what: str) -> Samples:
    """Scrape until ``holds`` (a request's place is taken and freed on the server's own loop)."""
    deadline = time.monotonic() + 15
    while not holds(samples := scrape(url)):
        assert time.monotonic() < deadline, f"{what} never held: {samples}"
        time.sleep(0.05)
    return samples


def search(url: str, headers: dict[str, str], query: str = "cafeteria menu") -> httpx.Response:
    answer = httpx.post(f"{url}/v1/search", json={"query": query}, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer


def test_each_request_counts_once_by_route_template_and_its_stages_once_each(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    url, other = serve(small_warehouse), serve(small_warehouse)
    before = scrape(url)
    answers = [search(url, bearer("alice")) for _ in range(3)]
    missing = httpx.get(f"{url}/v1/chunks/no-such-chunk", headers=bearer("alice"), timeout=30)
    after = scrape(url)

    assert missing.status_code == 404
    assert raised(before, after, "ragwarden_http_requests_total", route="/v1/search", method="POST", status="200") == 3
    assert raised(before, after, "ragwarden_http_requests_total", route="/v1/chunks/{chunk_id}", method="GET",
                  status="404") == 1, "the route's template, never the id in the path"  # fmt: skip
    for stage in SEARCH_STAGES:
        assert raised(before, after, "ragwarden_http_request_stage_seconds_count", stage=stage) == 3, stage
    for stage in ("queue", "app", "receipt"):  # every admitted request waits, works and is receipted
        assert raised(before, after, "ragwarden_http_request_stage_seconds_count", stage=stage) == 4, stage
    assert all("server-timing" not in answer.headers for answer in [*answers, missing]), "stage times are the operator's"
    assert value(scrape(other), "ragwarden_http_requests_total", route="/v1/search", method="POST", status="200") == 0, \
        "another app in the same process keeps its own registry"


def test_an_operator_who_asked_for_server_timing_still_gets_it_beside_the_metrics(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    url = serve(small_warehouse, server_timing=True)
    answer = search(url, bearer("alice"))
    assert {"embed", "rank", "check"} <= {part.split(";")[0].strip() for part in answer.headers["server-timing"].split(",")}
    assert value(scrape(url), "ragwarden_http_request_stage_seconds_count", stage="embed") == 1


def test_no_label_or_line_names_a_caller_a_query_or_a_document(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    url = serve(small_warehouse)
    query = "quarterly forecasts wednesday"
    carol = bearer("carol")
    search(url, bearer("alice"), query)
    found = search(url, bearer("alice"), "quarterly budget review").json()["hits"][0]["chunk_id"]
    assert httpx.get(f"{url}/v1/chunks/{found}", headers=bearer("alice"), timeout=30).status_code == 200
    assert httpx.get(f"{url}/v1/lineage/acme-budget", headers=carol, timeout=30).status_code == 200
    assert httpx.get(f"{url}/v1/audit/receipts?subject=user:alice", headers=carol, timeout=30).status_code == 200
    text = httpx.get(f"{url}/metrics", timeout=30).text

    families = list(text_string_to_metric_families(text))
    names = {name for family in families for sample in family.samples for name in sample.labels}
    values = {label for family in families for sample in family.samples for label in sample.labels.values()}
    assert names <= LABEL_NAMES, names - LABEL_NAMES
    secrets = ("alice", "carol", "acme", query, "quarterly", found, "acme-budget", carol["Authorization"].split()[1])
    assert not [secret for secret in secrets for label in values if secret in label]
    assert not [secret for secret in secrets if secret in text]
    routes = {label for family in families for sample in family.samples for key, label in sample.labels.items()
              if key == "route"}  # fmt: skip
    assert {"/v1/search", "/v1/chunks/{chunk_id}", "/v1/lineage/{item_id}", "/v1/audit/receipts"} <= routes


def test_the_admission_gauges_count_the_requests_at_work_and_in_line(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    """Two searches whose clients hold back their bodies: one holds the one place at work (reading
    its body), the other waits in line behind it; a scrape is never queued behind them."""
    url = serve(small_warehouse, max_in_flight=1, max_queued=4)
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"query": "cafeteria menu"}).encode()
    head = (f"POST /v1/search HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\nAuthorization: {bearer('alice')['Authorization']}\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection((host, int(port))) as first, socket.create_connection((host, int(port))) as second:
        first.sendall(head)
        until(url, lambda s: value(s, "ragwarden_admission_running") == 1, "one request at work")
        second.sendall(head)
        held = until(url, lambda s: value(s, "ragwarden_admission_waiting") == 1, "one request in line")
        assert value(held, "ragwarden_admission_running") == 1
        assert (value(held, "ragwarden_admission_max_running"), value(held, "ragwarden_admission_max_waiting")) == (1, 4)
        first.sendall(body)
        second.sendall(body)
        statuses = [_status_of(first), _status_of(second)]
    assert statuses == [200, 200]
    done = until(url, lambda s: value(s, "ragwarden_admission_running") == value(s, "ragwarden_admission_waiting") == 0,
                 "both places freed")  # fmt: skip
    assert value(done, "ragwarden_http_requests_total", route="/v1/search", method="POST", status="200") == 2
    assert value(done, "ragwarden_admission_refused_total") == 0


def _status_of(client: socket.socket) -> int:
    answer = b""
    while chunk := client.recv(65536):
        answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_receipts_pending_counts_this_processs_receipts_until_they_are_folded(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr("ragwarden.state.audit_log.FOLD_AFTER_S", 3600.0)  # folded when the test says, not by age
    url = serve(small_warehouse)
    small_warehouse.close()  # everything journaled so far is folded
    assert value(scrape(url), "ragwarden_audit_receipts_pending") == 0
    for _ in range(3):
        search(url, bearer("alice"))
    waiting = scrape(url)
    assert value(waiting, "ragwarden_audit_receipts_pending") == 3, "one receipt a search"
    assert value(waiting, "ragwarden_audit_oldest_pending_seconds") > 0
    small_warehouse.close()
    folded = scrape(url)
    assert value(folded, "ragwarden_audit_receipts_pending") == value(folded, "ragwarden_audit_oldest_pending_seconds") == 0


def test_lineage_events_count_as_spooled_while_their_backend_is_down_and_not_once_delivered(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]],
    receiver: Callable[..., Receiver],
):
    """The backend is a stand-in OpenLineage endpoint on loopback (outside the product), answering
    503 until the test brings it up."""
    backend = receiver(mode="503")
    env = {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": backend.url}
    replica = Warehouse(Settings(warehouse=small_warehouse.uri, openlineage_env=env), embedder=small_warehouse.embedder)
    url = serve(replica)
    assert value(scrape(url), "ragwarden_lineage_events_spooled") == 0
    ingested = httpx.post(f"{url}/v1/ingest", json={"records": [NEW_RECORD]}, headers=bearer("admin"), timeout=60)
    assert ingested.status_code == 200, ingested.text
    assert value(scrape(url), "ragwarden_lineage_events_spooled") == 2, "the run's START and COMPLETE wait"
    backend.mode = "up"
    assert replica.flush_lineage().sent == 2
    assert value(scrape(url), "ragwarden_lineage_events_spooled") == 0
    assert [event["eventType"] for event in backend.events] == ["START", "COMPLETE"]


def test_the_serving_index_state_and_how_many_versions_it_lags_the_table(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    url = serve(small_warehouse)
    idle = scrape(url)
    assert value(idle, "ragwarden_serving_index_state", state="idle") == 1, "the table is too small to want one"
    assert sum(value for (name, _), value in idle.items() if name == "ragwarden_serving_index_state") == 1
    assert ("ragwarden_serving_index_lag_versions", frozenset()) not in idle, "no index, no lag"

    # The table is far below the size a process builds an index for on its own: build it as the
    # first search that could use one would.
    index = small_warehouse._searcher.serving.build_now()
    ready = scrape(url)
    assert value(ready, "ragwarden_serving_index_state", state="ready") == 1
    assert value(ready, "ragwarden_serving_index_state", state="idle") == 0
    assert value(ready, "ragwarden_serving_index_rows") == index.rows
    assert value(ready, "ragwarden_serving_index_lag_versions") == value(ready, "ragwarden_serving_index_stale_seconds") == 0

    ingested = httpx.post(f"{url}/v1/ingest", json={"records": [NEW_RECORD]}, headers=bearer("admin"), timeout=60)
    assert ingested.status_code == 200, ingested.text
    behind = scrape(url)
    lag = small_warehouse.table_version - index.version
    assert lag > 0 and value(behind, "ragwarden_serving_index_lag_versions") == lag
    assert value(behind, "ragwarden_serving_index_stale_seconds") >= 0


@pytest.mark.parametrize(("setting", "local", "remote"), [
    ({}, 200, 403),  # the default: this host alone
    ({"metrics": "loopback"}, 200, 403),
    ({"metrics": "open"}, 200, 200),
    ({"metrics": "off"}, 404, 404),
])  # fmt: skip
def test_who_may_read_the_metrics_follows_the_setting(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]],
    setting: dict[str, Any], local: int, remote: int,
):
    url = serve(small_warehouse, **setting)
    answer = search(url, bearer("alice"))
    assert "server-timing" not in answer.headers
    assert httpx.get(f"{url}/metrics", timeout=30).status_code == local
    refused = httpx.get(f"{url}/metrics", headers={**REMOTE, **bearer("admin")}, timeout=30)
    assert refused.status_code == remote, "a credential does not open it to a remote client"
    if remote == 403:
        assert "RAGWARDEN_METRICS" in refused.json()["error"]["message"]


def test_the_metrics_setting_comes_from_the_environment_and_an_unknown_one_is_refused():
    assert Settings().metrics == "loopback"
    assert Settings.from_env({"RAGWARDEN_METRICS": "Open"}).metrics == "open"
    with pytest.raises(ConfigurationError, match="RAGWARDEN_METRICS.*off, loopback, open"):
        Settings.from_env({"RAGWARDEN_METRICS": "public"})
