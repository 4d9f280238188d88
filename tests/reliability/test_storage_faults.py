"""A warehouse file that is missing or damaged, or a disk that fills while writing: a clear error
naming what failed, never an answer from what is left, and the last good version kept."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from ragwarden.config import Settings
from ragwarden.errors import WarehouseError
from ragwarden.warehouse import Warehouse


def _data_files(warehouse: Warehouse, table: str) -> list[Path]:
    return sorted((Path(warehouse.uri) / f"{table}.lance" / "data").glob("*.lance"))


def _delete(path: Path) -> None:
    path.unlink()


def _truncate(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


@pytest.mark.parametrize("damage", [_delete, _truncate], ids=["deleted", "truncated"])
def test_a_damaged_data_file_is_named_and_nothing_is_answered(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]], damage
):
    (chunk_id, *_) = small_warehouse.store.chunks.chunk_ids_of("acme-memo")
    url = serve(small_warehouse)
    damaged = _data_files(small_warehouse, "chunks")
    for path in damaged:
        damage(path)
    with pytest.raises(WarehouseError) as caught:
        small_warehouse.search("cafeteria menu", subject="user:alice", tenant="acme")
    assert str(damaged[0]) in str(caught.value) and "search failed" in str(caught.value)
    for response in (
        httpx.post(f"{url}/v1/search", json={"query": "cafeteria menu"}, headers=bearer("alice"), timeout=60),
        httpx.get(f"{url}/v1/chunks/{chunk_id}", headers=bearer("alice"), timeout=60),
    ):
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "warehouse_unavailable" and str(damaged[0]) in error["message"]


@pytest.mark.parametrize("table", ["acl_clauses", "policies", "sources", "chunks"])
def test_a_missing_table_is_refused_naming_it_never_recreated_empty(small_warehouse: Warehouse, table: str):
    shutil.rmtree(Path(small_warehouse.uri) / f"{table}.lance")
    with pytest.raises(WarehouseError, match=f"table '{table}' is missing .*restore {table}.lance"):
        Warehouse(Settings(warehouse=small_warehouse.uri), embedder=small_warehouse.embedder)
    assert not (Path(small_warehouse.uri) / f"{table}.lance").exists()


FULL_DISK_INGEST = textwrap.dedent("""
    import json, resource, signal, sys
    from ragwarden.config import Settings
    from ragwarden.errors import WarehouseError
    from ragwarden.warehouse import Warehouse
    warehouse = Warehouse(Settings.from_env(warehouse=sys.argv[1]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, like ENOSPC
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
    records = [{"id": f"big-{i}", "text": f"The archive of minutes from meeting {i}. " * 4, "tenant": "acme",
                "acl": {"allow": ["everyone"]}, "labels": [], "classification": "public"} for i in range(40)]
    try:
        warehouse.ingest_records(records)
    except WarehouseError as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(3)
""")


@pytest.mark.parametrize("limit", [4_000, 40_000])
@pytest.mark.usefixtures("onnx_workers")
def test_a_full_disk_fails_the_write_cleanly_and_keeps_the_last_good_version(small_warehouse: Warehouse, limit: int):
    version, rows = small_warehouse.store.chunks.version, small_warehouse.store.chunks.count()
    before = [h.chunk_id for h in small_warehouse.search("meeting minutes cafeteria", subject="user:alice", tenant="acme")]
    run = subprocess.run([sys.executable, "-c", FULL_DISK_INGEST, small_warehouse.uri, str(limit)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 3, run.stderr[-2000:]
    assert "File too large" in run.stdout and "Committed versions are untouched" in run.stdout
    reopened = Warehouse(Settings(warehouse=small_warehouse.uri), embedder=small_warehouse.embedder)
    assert (reopened.store.chunks.version, reopened.store.chunks.count()) == (version, rows)
    assert [h.chunk_id for h in reopened.search("meeting minutes cafeteria", subject="user:alice", tenant="acme")] == before
    report = reopened.ingest_records([{"id": "after", "text": "Minutes of the meeting after the disk was freed.",
                                       "tenant": "acme", "acl": {"allow": ["everyone"]}, "labels": [],
                                       "classification": "public"}])  # fmt: skip
    assert report.ok and reopened.store.chunks.chunk_ids_of("after")
