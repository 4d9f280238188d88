"""The state layer's orderings: the policy in force is the last committed, a source record is
replaced only by a later commit's, and warehouses of an earlier release are brought up to date."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import lancedb
import pyarrow as pa
import pytest
from support.raw_tables import raw_table

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.errors import WarehouseFormatError
from ragwarden.governance.policy import Policy
from ragwarden.policies import policy_file
from ragwarden.state import FORMAT_KEY, WRITES, Store
from ragwarden.state import policies as policies_module
from ragwarden.warehouse import Warehouse

POLICY_A = "p, group:finance, acme, label:pii, read, allow\n"
POLICY_B = "p, group:hr, acme, label:pii, read, allow\n"


class _ClockBehind(datetime):
    """A replica whose clock runs a day behind."""

    @classmethod
    def now(cls, tz=None):  # type: ignore[override]
        return datetime.now(tz) - timedelta(days=1)


def test_the_policy_in_force_is_the_last_committed_even_from_a_replica_whose_clock_runs_behind(
    fresh_warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch
):
    first = Policy.from_text(POLICY_A)
    fresh_warehouse.store.policies.install(first)
    monkeypatch.setattr(policies_module, "datetime", _ClockBehind)
    second = Policy.from_text(POLICY_B)
    fresh_warehouse.store.policies.install(second)
    assert fresh_warehouse.policy is not None and fresh_warehouse.policy.version == second.version


def test_installs_racing_from_several_threads_each_take_their_own_place(fresh_warehouse: Warehouse):
    policies = [Policy.from_text(f"p, group:g{n}, acme, label:pii, read, allow\n") for n in range(8)]
    start = threading.Barrier(len(policies))
    seqs: dict[int, Policy] = {}

    def install(policy: Policy) -> None:
        start.wait()
        seqs[fresh_warehouse.store.policies.install(policy)] = policy

    threads = [threading.Thread(target=install, args=(p,)) for p in policies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seqs) == list(range(1, len(policies) + 1))
    last = seqs[max(seqs)]
    assert fresh_warehouse.policy is not None and fresh_warehouse.policy.version == last.version


def test_a_source_record_is_replaced_only_by_a_later_commits(fresh_warehouse: Warehouse, make_record):
    assert fresh_warehouse.ingest_records([make_record(id="doc-1")]).ok
    record = raw_table(fresh_warehouse.store, "sources").to_arrow().to_pylist()[0]
    later = {**record, "tags_fingerprint": "later", "classification": 3}
    earlier = {**record, "tags_fingerprint": "earlier", "classification": 0}
    version = record["chunks_version"]
    fresh_warehouse.store.sources.record([later], chunks_version=version + 2, insert=True)
    fresh_warehouse.store.sources.record([earlier], chunks_version=version + 1, insert=True)  # finished last, committed first
    (stored,) = raw_table(fresh_warehouse.store, "sources").to_arrow().to_pylist()
    assert (stored["tags_fingerprint"], stored["classification"], stored["chunks_version"]) == ("later", 3, version + 2)


def test_two_writers_recording_a_new_document_at_once_leave_only_the_later_commits_record(
    fresh_warehouse: Warehouse, make_record
):
    """Neither sees the other's insert (the two-column key is no primary key for Lance to check):
    without the clean-up both records stayed (20 times of 20 in a bare reproduction)."""
    assert fresh_warehouse.ingest_records([make_record(id="doc-1")]).ok
    record = raw_table(fresh_warehouse.store, "sources").to_arrow().to_pylist()[0]
    replica = Store(fresh_warehouse.store.uri, dimension=fresh_warehouse.store.dimension)  # another process's handle
    version = record["chunks_version"]
    for trial in range(5):
        doc_id = f"new-{trial}"
        start = threading.Barrier(2)

        def record_it(store: Store, stamp: int, fingerprint: str, doc_id: str = doc_id) -> None:
            start.wait(30)
            store.sources.record([{**record, "doc_id": doc_id, "tags_fingerprint": fingerprint}], chunks_version=stamp, insert=True)

        writers = [threading.Thread(target=record_it, args=(fresh_warehouse.store, version + 1, "earlier")),
                   threading.Thread(target=record_it, args=(replica, version + 2, "later"))]  # fmt: skip
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(60)
        stored = [r for r in raw_table(fresh_warehouse.store, "sources").to_arrow().to_pylist() if r["doc_id"] == doc_id]
        assert [(r["tags_fingerprint"], r["chunks_version"]) for r in stored] == [("later", version + 2)], trial


def test_a_warehouse_of_an_earlier_release_is_refused_until_migrated_then_upgraded_in_place(tmp_path: Path, embedder: Embedder):
    uri = str(tmp_path / "wh")
    Warehouse(Settings(warehouse=uri), embedder=embedder)  # every table, at the current schema
    db = lancedb.connect(uri)
    now = datetime.now(UTC)
    old_policies = pa.schema([("version", pa.string()), ("source", pa.string()), ("text", pa.string()),
                              ("installed_at", pa.timestamp("us", tz="UTC"))])  # fmt: skip
    rows = [{"version": "b", "source": "x", "text": POLICY_B, "installed_at": now},
            {"version": "a", "source": "x", "text": POLICY_A, "installed_at": now - timedelta(hours=1)}]  # fmt: skip
    db.create_table("policies", pa.Table.from_pylist(rows, schema=old_policies), mode="overwrite")
    db.open_table("sources").drop_columns(["chunks_version"])  # (the policies rewritten: no format recorded)

    with pytest.raises(WarehouseFormatError, match="Run `ragwarden migrate`"):
        Warehouse(Settings(warehouse=uri), embedder=embedder)
    migration = Warehouse.migrate(Settings(warehouse=uri), embedder=embedder)
    assert migration.steps == ("sources: chunks_version added (0)", "policies: numbered by install time (seq)", f"recorded format {WRITES}")
    reopened = Warehouse(Settings(warehouse=uri), embedder=embedder)
    numbered = sorted((r["seq"], r["version"]) for r in raw_table(reopened.store, "policies").to_arrow().to_pylist())
    assert numbered == [(1, "a"), (2, "b")]  # numbered by install time, the only order recorded
    assert reopened.policy is not None and reopened.policy.version == Policy.from_text(POLICY_B).version
    assert "chunks_version" in raw_table(reopened.store, "sources").schema.names


def test_chunks_of_an_earlier_release_gain_metadata_when_migrated(tmp_path: Path, embedder: Embedder, make_record):
    uri = str(tmp_path / "wh")
    warehouse = Warehouse(Settings(warehouse=uri), embedder=embedder)
    warehouse.install_policy(policy_file("demo.csv"))
    warehouse.ingest_records([make_record(metadata={"title": "kept on the source"})])
    db = lancedb.connect(uri)
    db.open_table("chunks").drop_columns(["metadata"])  # as a release before metadata wrote it,
    db.open_table("policies").to_lance().update_schema_metadata({FORMAT_KEY: None})  # recording no format

    migration = Warehouse.migrate(Settings(warehouse=uri), embedder=embedder)
    assert migration.steps == ("chunks: metadata added, each chunk its source record's", f"recorded format {WRITES}")
    reopened = Warehouse(Settings(warehouse=uri), embedder=embedder)
    assert "metadata" in raw_table(reopened.store).schema.names
    (hit,) = reopened.search("quarterly budget", subject="user:alice", tenant="acme", k=1)
    assert hit.metadata == {"title": "kept on the source"}  # from the source record
    narrowed = reopened.search("budget", subject="user:alice", tenant="acme", filter={"title": "kept on the source"})
    assert [h.chunk_id for h in narrowed] == [hit.chunk_id]


def test_rows_are_read_at_an_earlier_version_until_a_purge_removes_its_files(small_warehouse: Warehouse, make_record):
    store, everything = small_warehouse.store, "tenant IS NOT NULL"
    small_warehouse.ingest_records([make_record(id="erased", text="A note about the offsite, to be erased.")])
    before = store.chunks.latest_version()
    held = sorted(store.chunks.read_at(before, everything, ["chunk_id"]).column("chunk_id").to_pylist())
    small_warehouse.ingest_records([make_record(id="later", text="A later note about the menu.")])
    assert store.chunks.latest_version() > before
    assert sorted(store.chunks.read_at(before, everything, ["chunk_id"]).column("chunk_id").to_pylist()) == held
    assert len(store.chunks.read_at(None, everything, ["chunk_id"])) > len(held)  # the latest holds the new rows
    small_warehouse.forget("erased", reason="a test erasure")  # purges the files that held it
    assert store.chunks.read_at(before, everything, ["chunk_id"]) is None
