"""A warehouse records its format. A release serves only the formats it reads; ``ragwarden
migrate`` (``Warehouse.migrate``) brings an earlier one forward: explicitly, receipted, idempotent,
and by adding only, so the replicas of the release before serve on."""

from __future__ import annotations

from pathlib import Path

import lancedb
import pytest

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.errors import WarehouseFormatError
from ragwarden.policies import policy_file
from ragwarden.state import FORMAT_KEY, WRITES
from ragwarden.warehouse import Warehouse

TABLES = ("chunks", "sources", "policies", "acl_clauses", "labels")


def record_format(uri: str, version: int | None) -> None:
    """Record ``version`` as the warehouse's format (None: none, as releases before formats left it)."""
    lancedb.connect(uri).open_table("policies").to_lance().update_schema_metadata({FORMAT_KEY: None if version is None else str(version)})


def versions(uri: str) -> dict[str, int]:
    db = lancedb.connect(uri)
    return {name: db.open_table(name).version for name in TABLES}


def search_alice(warehouse: Warehouse) -> set[str]:
    return {hit.doc_id for hit in warehouse.search("quarterly budget", subject="user:alice", tenant="acme", k=5)}


@pytest.fixture
def earlier_release_warehouse(tmp_path: Path, embedder: Embedder, make_record) -> str:
    """A warehouse holding one document, as a release before formats were recorded left it."""
    uri = str(tmp_path / "warehouse")
    with Warehouse(Settings(warehouse=uri), embedder=embedder) as warehouse:
        warehouse.install_policy(policy_file("demo.csv"))
        assert warehouse.ingest_records([make_record()]).ok
    record_format(uri, None)
    return uri


def test_a_new_warehouse_records_the_format_this_release_writes(tmp_path: Path, embedder: Embedder) -> None:
    uri = str(tmp_path / "warehouse")
    assert Warehouse(Settings(warehouse=uri), embedder=embedder).store.format == WRITES
    metadata = lancedb.connect(uri).open_table("policies").schema.metadata
    assert metadata[FORMAT_KEY.encode()] == str(WRITES).encode()


def test_an_earlier_format_is_refused_untouched_until_migrated_then_served_as_before(
    earlier_release_warehouse: str, embedder: Embedder
) -> None:
    uri, settings = earlier_release_warehouse, Settings(warehouse=earlier_release_warehouse)
    before = versions(uri)
    with pytest.raises(WarehouseFormatError) as refused:
        Warehouse(settings, embedder=embedder)
    assert f"is at format 1; this release serves format {WRITES}" in str(refused.value)
    assert "Run `ragwarden migrate`" in str(refused.value)
    assert versions(uri) == before, "a refused open writes nothing"

    migration = Warehouse.migrate(settings, embedder=embedder)
    assert (migration.found, migration.now, migration.steps) == (1, WRITES, (f"recorded format {WRITES}",))
    migrated = Warehouse(settings, embedder=embedder)
    assert search_alice(migrated) == {"doc-1"}
    (receipt,) = [r for r in migrated.receipts(caller=None, tenant="acme") if "format" in r.reason]
    assert receipt.reason == migration.summary() == f"migrated the warehouse from format 1 to {WRITES}: recorded format {WRITES}"

    data = {name: version for name, version in versions(uri).items() if name != "policies"}
    again = Warehouse.migrate(settings, embedder=embedder)
    assert (again.found, again.now, again.steps) == (WRITES, WRITES, ())
    assert again.summary() == f"the warehouse is at format {WRITES} already: nothing to do"
    assert {name: version for name, version in versions(uri).items() if name != "policies"} == data
    assert versions(uri)["policies"] == versions(uri)["policies"]  # nothing recorded twice
    assert len([r for r in Warehouse(settings, embedder=embedder).receipts(caller=None, tenant="acme") if "format" in r.reason]) == 2


def test_a_format_a_newer_release_wrote_is_refused_at_open_at_the_next_read_and_never_migrated_down(
    tmp_path: Path, embedder: Embedder, make_record
) -> None:
    uri = str(tmp_path / "warehouse")
    serving = Warehouse(Settings(warehouse=uri), embedder=embedder)
    serving.install_policy(policy_file("demo.csv"))
    assert serving.ingest_records([make_record()]).ok
    assert search_alice(serving) == {"doc-1"}

    record_format(uri, WRITES + 1)  # a newer release migrated it while this replica serves
    with pytest.raises(WarehouseFormatError, match=f"is at format {WRITES + 1}, written by a newer release"):
        search_alice(serving)
    with pytest.raises(WarehouseFormatError, match="Serve it with a release that reads format"):
        serving.check_format()
    with pytest.raises(WarehouseFormatError):
        Warehouse(Settings(warehouse=uri), embedder=embedder)
    with pytest.raises(WarehouseFormatError):
        Warehouse.migrate(Settings(warehouse=uri), embedder=embedder)
    assert lancedb.connect(uri).open_table("policies").schema.metadata[FORMAT_KEY.encode()] == str(WRITES + 1).encode()
