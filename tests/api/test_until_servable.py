"""A replica started on a warehouse of a format its release does not serve answers (alive), refuses
``/readyz`` and every request with the reason, and serves, on the same port, once the warehouse
has been migrated; a replica serving a warehouse that a newer release migrates is no longer ready."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import lancedb
from support.live_server import serving
from support.replicas import ready_within

from ragwarden.api.cli_service import served_app
from ragwarden.config import AuthSettings, Settings
from ragwarden.embedder import Embedder
from ragwarden.policies import policy_file
from ragwarden.state import FORMAT_KEY, WRITES
from ragwarden.warehouse import Warehouse


def _record_format(uri: str, version: int | None) -> None:
    lancedb.connect(uri).open_table("policies").to_lance().update_schema_metadata({FORMAT_KEY: None if version is None else str(version)})


def test_a_replica_on_an_unmigrated_warehouse_refuses_with_the_reason_then_serves_once_migrated(
    tmp_path: Path, embedder: Embedder, auth_settings: AuthSettings, mint: Callable[..., str], make_record
) -> None:
    uri = str(tmp_path / "warehouse")
    with Warehouse(Settings(warehouse=uri), embedder=embedder) as warehouse:
        warehouse.install_policy(policy_file("demo.csv"))
        assert warehouse.ingest_records([make_record()]).ok
    _record_format(uri, None)  # as the release before formats were recorded left it
    settings = Settings(warehouse=uri, auth=auth_settings)
    search = {"query": "quarterly budget", "k": 3}
    alice = {"Authorization": f"Bearer {mint('alice')}"}
    with serving(served_app(settings, embedder=embedder, with_mcp=False, recheck_s=0.2)) as url:
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200, "alive, so not restarted in a loop"
        for answer in (httpx.get(f"{url}/readyz", timeout=10), httpx.post(f"{url}/v1/search", json=search, headers=alice, timeout=10)):
            assert answer.status_code == 503, answer.text
            error = answer.json()["error"]
            assert error["code"] == "warehouse_format" and "Run `ragwarden migrate`" in error["message"], error

        Warehouse.migrate(Settings(warehouse=uri), embedder=embedder)
        ready = ready_within(url, 30)
        assert ready.status_code == 200, ready.text
        found = httpx.post(f"{url}/v1/search", json=search, headers=alice, timeout=60)
        assert found.status_code == 200 and [hit["doc_id"] for hit in found.json()["hits"]] == ["doc-1"], found.text


def test_a_replica_whose_warehouse_a_newer_release_migrates_is_no_longer_ready(
    tmp_path: Path, embedder: Embedder, auth_settings: AuthSettings, mint: Callable[..., str], make_record
) -> None:
    uri = str(tmp_path / "warehouse")
    settings = Settings(warehouse=uri, auth=auth_settings)
    with Warehouse(settings, embedder=embedder) as warehouse:
        warehouse.install_policy(policy_file("demo.csv"))
        assert warehouse.ingest_records([make_record()]).ok
    with serving(served_app(settings, embedder=embedder, with_mcp=False)) as url:
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        _record_format(uri, WRITES + 1)
        for answer in (httpx.get(f"{url}/readyz", timeout=10),
                       httpx.post(f"{url}/v1/search", json={"query": "budget"}, headers={"Authorization": f"Bearer {mint('alice')}"}, timeout=10)):  # fmt: skip
            assert answer.status_code == 503 and answer.json()["error"]["code"] == "warehouse_format", answer.text
            assert "written by a newer release" in answer.json()["error"]["message"]
