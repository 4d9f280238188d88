"""A warehouse on object storage (``s3://bucket/prefix``) works as one in a local folder: ingest,
search, derive, sync, forget with its purge, audit receipts, lineage and policy versions, and
writers in separate processes commit safely. The object store is moto's S3 server, a real
process on 127.0.0.1 (``support.moto_s3``); ragwarden runs against it unchanged."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa
import pytest
from support import warehouse_workers
from support.lineage_receiver import closed_port
from support.lineage_workers import flush_warehouse
from support.moto_s3 import MotoS3, s3_holding
from support.raw_tables import raw_table
from support.s3_server import S3Server
from support.spawned import run_together

from ragwarden.config import Settings, storage_options_from_env
from ragwarden.embedder import Embedder
from ragwarden.errors import ConfigurationError, NotFoundError, StorageUnreachableError, WarehouseError
from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse

BUCKET = "ragwarden-lake"
SENTINEL = "Quillfeather-7731 restructuring memo"


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    """moto's S3 server, holding the bucket the warehouses live in."""
    with s3_holding(BUCKET) as server:
        yield server


def aws_env(server: MotoS3 | S3Server) -> dict[str, str]:
    """What an operator sets for an S3-compatible endpoint: the standard AWS variables."""
    return {"AWS_ENDPOINT_URL": server.endpoint, "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test", "AWS_ALLOW_HTTP": "true"}  # fmt: skip


@pytest.fixture
def s3_warehouse(s3: MotoS3, tmp_path: Path, embedder: Embedder) -> Iterator[Warehouse]:
    """A fresh warehouse under its own prefix of the bucket, the demo policy installed."""
    settings = Settings.from_env(aws_env(s3), warehouse=f"s3://{BUCKET}/{uuid.uuid4().hex}", lineage_dir=tmp_path / "lineage")
    with Warehouse(settings, embedder=embedder) as warehouse:  # closed while the store answers: nothing left to fold
        warehouse.install_policy(policy_file("demo.csv"))
        yield warehouse


def objects_holding(server: MotoS3, warehouse: Warehouse, needle: bytes) -> list[str]:
    prefix = warehouse.uri.removeprefix(f"s3://{BUCKET}/")
    return [key for key in server.keys(BUCKET, prefix) if needle in server.body(BUCKET, key)]


def test_the_standard_aws_variables_and_a_json_setting_configure_the_object_store() -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_DEFAULT_REGION": "eu-west-1", "AWS_REGION": "us-east-1",
           "AWS_ACCESS_KEY_ID": "k", "RAGWARDEN_STORAGE_OPTIONS": '{"allow_http": true, "aws_region": "ap-south-1"}'}  # fmt: skip
    assert storage_options_from_env(env) == {
        "aws_endpoint": "http://127.0.0.1:9", "aws_region": "ap-south-1", "aws_access_key_id": "k", "allow_http": "true"
    }  # fmt: skip
    assert "s3cr3t-value" not in repr(Settings(storage_options={"aws_secret_access_key": "s3cr3t-value"}))
    for bad in ("{not json", '["allow_http"]', '{"allow_http": {"nested": 1}}'):
        with pytest.raises(ConfigurationError, match="RAGWARDEN_STORAGE_OPTIONS"):
            storage_options_from_env({"RAGWARDEN_STORAGE_OPTIONS": bad})


def test_every_operation_works_on_object_storage_as_on_a_folder(s3: MotoS3, s3_warehouse: Warehouse) -> None:
    wh = s3_warehouse
    report = wh.ingest(Path(__file__).parents[1] / "examples" / "demo" / "corpus.jsonl")
    assert report.ok and report.documents > 10
    secret = {"id": "memo-q", "text": f"The {SENTINEL} stays with the deal team.", "tenant": "acme",
              "acl": {"allow": ["group:deal-team"]}, "labels": ["mna"], "classification": "restricted"}  # fmt: skip
    assert wh.ingest_records([secret]).ok

    carol = wh.search(SENTINEL, subject="user:carol", tenant="acme", k=3)
    assert carol[0].doc_id == "memo-q"
    assert "memo-q" not in {h.doc_id for h in wh.search(SENTINEL, subject="user:dave", tenant="acme", k=10)}
    note = wh.derive("Deal memo noted.", parents=[carol[0].chunk_id], subject="user:carol", tenant="acme")
    assert note.tags.labels == frozenset({"mna"})

    assert wh.get_chunk(note.chunk_id, subject="user:carol", tenant="acme").chunk_id == note.chunk_id
    wh.sync([{**secret, "acl": {"allow": ["user:olivia"]}}])  # carol loses the memo, and the note derived from it
    assert "memo-q" not in {h.doc_id for h in wh.search(SENTINEL, subject="user:carol", tenant="acme", k=10)}
    with pytest.raises(NotFoundError):
        wh.get_chunk(note.chunk_id, subject="user:carol", tenant="acme")

    assert objects_holding(s3, wh, SENTINEL.encode()), "positive control: the text is in the bucket before forget"
    forgotten = wh.forget("memo-q", reason="erasure request")
    assert (forgotten.chunks, forgotten.derived) == (1, 1)
    assert objects_holding(s3, wh, SENTINEL.encode()) == []
    assert all(h.doc_id != "memo-q" for h in wh.search(SENTINEL, subject="user:carol", tenant="acme", k=10, mode="fts"))

    chain = wh.audit.verify()
    assert chain.ok and chain.receipts >= 5, chain
    assert {r.operation for r in wh.audit.query()} >= {"search", "derive", "sync", "forget"}
    events = sorted((Path(wh.settings.lineage_dir) / "events").glob("*.json"))
    jobs = {json.loads(p.read_text())["job"]["name"] for p in events}
    assert {"ragwarden.ingest", "ragwarden.derive", "ragwarden.sync", "ragwarden.forget"} <= jobs

    first = wh.policy.version
    wh.install_policy_text(policy_file("demo.csv").read_text(encoding="utf-8") + "\np, user:dave, acme, label:mna, read, allow\n",
                           subject="user:admin", tenant="acme")  # fmt: skip
    reopened = Warehouse(wh.settings, embedder=wh.embedder)  # a fresh process sees what was committed
    assert reopened.policy.version != first
    assert reopened.store.chunks.count() == wh.store.chunks.count()


def test_a_search_s_receipt_is_an_object_of_the_journal_until_it_is_folded(s3: MotoS3, s3_warehouse: Warehouse) -> None:
    wh = s3_warehouse
    wh.audit.fold()  # what the fixture's own writes left

    def journal_files() -> list[str]:  # (the client library may keep an empty "folder" object)
        return [key for key in s3.keys(BUCKET, f"{wh.uri.removeprefix(f's3://{BUCKET}/')}/audit_journal/") if key.endswith(".arrow")]

    wh.search("cafeteria menu", subject="user:alice", tenant="acme")
    assert len(journal_files()) == 1  # one PUT, before the answer
    assert [r.operation for r in Warehouse(wh.settings, embedder=wh.embedder).audit.query(subject="user:alice")] == ["search"]
    assert wh.audit.fold() == 1
    assert journal_files() == [] and len(wh.audit.query(subject="user:alice")) == 1 and wh.audit.verify().ok


def test_a_bucket_that_does_not_exist_is_a_clear_error(s3: MotoS3, embedder: Embedder, tmp_path: Path) -> None:
    settings = Settings.from_env(aws_env(s3), warehouse="s3://no-such-bucket/wh", lineage_dir=tmp_path)
    with pytest.raises(WarehouseError) as refused:
        Warehouse(settings, embedder=embedder)
    said = str(refused.value)
    assert f"bucket 'no-such-bucket' not found at AWS_ENDPOINT_URL={s3.endpoint}" in said
    assert len(said) < 250 and "RetryError" not in said, said


@pytest.mark.slow  # spawns four interpreters
@pytest.mark.usefixtures("onnx_workers")
def test_writers_in_separate_processes_commit_safely(s3: MotoS3, s3_warehouse: Warehouse, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    for name, value in aws_env(s3).items():  # what the spawned processes are configured with
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RAGWARDEN_LINEAGE_DIR", str(tmp_path / "lineage"))
    outcomes = run_together(warehouse_workers.writer, [(s3_warehouse.uri, f"w{w}", 3, 2) for w in (1, 2)], tmp_path)
    assert outcomes == [{"errors": [], "rounds": 2}] * 2

    final = s3_warehouse.search("ledger budget forecast round", subject="user:alice", tenant="acme", k=100)
    assert {hit.doc_id for hit in final} == {f"w{w}-{i}" for w in (1, 2) for i in range(3)}
    assert all("Round 1 of " in hit.text for hit in final), "a commit was lost: an older round survived"
    rows = raw_table(s3_warehouse.store).search().select(["chunk_id"]).limit(None).to_list()
    assert len(rows) == len({r["chunk_id"] for r in rows})


def test_the_lineage_spool_of_an_object_store_warehouse_works_without_configuration(
    s3: MotoS3, tmp_path: Path, embedder: Embedder, receiver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events wait in the warehouse's own spool (its ``lineage_spool`` table; no folder of the host
    holds them) while the lineage backend is down, and reach it once when it is back."""
    monkeypatch.setenv("HOME", str(tmp_path))
    port = closed_port()
    lineage = {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": f"http://127.0.0.1:{port}"}
    settings = Settings.from_env(aws_env(s3) | lineage, warehouse=f"s3://{BUCKET}/{uuid.uuid4().hex}")
    warehouse = Warehouse(settings, embedder=embedder)
    warehouse.install_policy(policy_file("demo.csv"))
    assert warehouse.ingest_records([{"id": "n1", "text": "A note.", "tenant": "acme", "acl": {"allow": ["everyone"]},
                                        "classification": "public"}]).ok

    spool = warehouse.openlineage.spool
    assert [spool.read(name)["eventType"] for name in spool.pending()] == ["START", "COMPLETE"]
    assert not (tmp_path / ".local" / "state" / "ragwarden").exists()
    backend = receiver(port)
    assert warehouse.openlineage.flush().sent == 2
    assert [e["eventType"] for e in backend.events] == ["START", "COMPLETE"]
    warehouse.close()  # while the store answers, so nothing waits to be folded once it stops


@pytest.mark.parametrize("conditional_put", [True, False])
def test_concurrent_commits_hold_only_on_a_store_with_conditional_puts(conditional_put: bool) -> None:
    """Three writers append 15 rows each, at once, through their own connections. With conditional
    puts (moto's S3, as AWS's) every commit lands; a store that ignores them lets commits overwrite
    one another, which is why docs/deployment.md requires them (or a commit lock). moto cannot be
    made to ignore them, so that store is the stand-in ``support.s3_server`` with its conditions off."""
    server = MotoS3().start() if conditional_put else S3Server(conditional_put=False)
    server.create_bucket(BUCKET)
    options = storage_options_from_env(aws_env(server))
    try:
        lancedb.connect(f"s3://{BUCKET}/race", storage_options=options).create_table("t", pa.table({"id": pa.array([], pa.int64())}))
        failures: list[str] = []

        def writer(w: int) -> None:
            table = lancedb.connect(f"s3://{BUCKET}/race", storage_options=options, read_consistency_interval=timedelta(0)).open_table("t")
            for i in range(15):
                try:
                    table.add(pa.table({"id": [w * 1000 + i]}))
                except Exception as exc:  # noqa: BLE001 - a torn read of an overwritten manifest, on the store without
                    failures.append(str(exc))

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        rows = lancedb.connect(f"s3://{BUCKET}/race", storage_options=options).open_table("t").count_rows()
    finally:
        server.stop()
    if conditional_put:
        assert (rows, failures) == (45, [])
    else:
        print(f"\nwithout conditional puts: {rows} of 45 rows kept, {len(failures)} writes failed")
        assert rows < 45, "no commit was lost: the race did not happen, so this shows nothing"


@pytest.mark.slow  # spawns an interpreter that loads the model
def test_lineage_waits_in_the_warehouse_so_a_replica_that_loses_its_disk_loses_no_event(
    s3: MotoS3, tmp_path: Path, embedder: Embedder, receiver: Any, onnx_workers: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On object storage the lineage spool is the warehouse's own table: a replica that ran while
    the lineage backend was down, and whose local disk is then wiped, loses none of its events;
    another process delivers each of them once."""
    port = closed_port()
    env = {**aws_env(s3), "OPENLINEAGE_URL": f"http://127.0.0.1:{port}"}
    uri = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    disk = tmp_path / "replica-disk"
    monkeypatch.setenv("HOME", str(disk))  # everything this replica keeps on its own host
    replica = Warehouse(Settings.from_env(env, warehouse=uri), embedder=embedder)
    replica.install_policy(policy_file("demo.csv"))
    record = {"id": "memo-1", "text": "The vendor renewal is due in May.", "tenant": "acme",
              "acl": {"allow": ["group:staff"]}, "classification": "internal"}  # fmt: skip
    assert replica.ingest_records([record]).ok
    spooled = [replica.openlineage.spool.read(name) for name in replica.openlineage.spool.pending()]
    assert {(event["job"]["name"], event["eventType"]) for event in spooled} == {
        ("ragwarden.ingest", "START"), ("ragwarden.ingest", "COMPLETE")
    }  # fmt: skip
    assert not [path for path in disk.rglob("*") if "lineage" in str(path)], "nothing of lineage on the host"
    shutil.rmtree(disk, ignore_errors=True)

    backend = receiver(port)
    (flushed,) = run_together(flush_warehouse, [(env, uri)], tmp_path, timeout=300)
    assert not flushed["errors"], flushed
    assert (flushed["sent"], flushed["failed"], flushed["pending"]) == (2, 0, 0)
    assert backend.events == spooled, "every event the lost replica spooled, once, in order"
    assert replica.openlineage.spool.pending() == []
    replica.close()


WRITER_THAT_EXITS = """
import sys
from ragwarden.config import Settings
from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse
warehouse = Warehouse(Settings.from_env())
warehouse.install_policy(policy_file("demo.csv"))  # receipted: the receipt waits in this writer's journal
print(warehouse.receipts_pending()[0], flush=True)
sys.stdin.read()  # then a normal exit, never closing the warehouse
"""


def _writer_exits(server: MotoS3, uri: str, *, store_stopped_first: bool) -> tuple[int, str]:
    """A process that journals a receipt on ``uri`` and exits normally (the store stopped just
    before, if asked): how many receipts waited, and what it said on stderr."""
    env = {**os.environ, **aws_env(server), "RAGWARDEN_WAREHOUSE": uri}
    child = subprocess.Popen([sys.executable, "-c", WRITER_THAT_EXITS], env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        waiting = int(child.stdout.readline() or 0)  # type: ignore[union-attr]
        if store_stopped_first:
            server.stop()
        _, said = child.communicate("", timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0, said
    return waiting, said


def test_a_writer_that_exits_normally_on_object_storage_folds_its_journal_and_says_nothing(s3: MotoS3) -> None:
    uri = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    waiting, said = _writer_exits(s3, uri, store_stopped_first=False)
    assert waiting >= 1, "the receipt waited in the journal before the exit"
    assert said == "", said
    prefix = uri.removeprefix(f"s3://{BUCKET}/")
    assert [key for key in s3.keys(BUCKET, f"{prefix}/audit_journal/") if not key.endswith("/")] == [], "folded at exit"
    assert Warehouse(Settings.from_env(aws_env(s3), warehouse=uri)).audit.verify().ok


def test_an_exit_after_the_object_store_went_away_says_calmly_what_waits_and_where() -> None:
    """Why the exit-time fold once printed a "Generic S3 error ... list request": the store had
    stopped before the process did (the tests' S3 server ends with its module, before the
    interpreter). The receipts are already in the warehouse's journal, so nothing is lost, and
    the store is unreachable, not damaged: said as that, with no advice to restore files."""
    with s3_holding(BUCKET) as server:
        waiting, said = _writer_exits(server, f"s3://{BUCKET}/{uuid.uuid4().hex}", store_stopped_first=True)
    lines = [line for line in said.splitlines() if "audit journal" in line]  # (not the store client's own)
    (at_exit,) = [line for line in lines if "were left in the warehouse's audit journal" in line]
    assert at_exit.startswith(f"{waiting} audit receipt(s) of this process"), said
    assert all("could not reach the object store (GET http://127.0.0.1:" in line for line in lines), said
    for line in lines:  # the exit's line, and the background fold's if it tried after the store stopped
        assert "restore" not in line and "damaged" not in line and "Generic S3 error" not in line, said


def test_an_unreachable_object_store_is_its_own_error_never_damage(embedder: Embedder, tmp_path: Path) -> None:
    with s3_holding(BUCKET) as server:
        settings = Settings.from_env(aws_env(server), warehouse=f"s3://{BUCKET}/{uuid.uuid4().hex}", lineage_dir=tmp_path)
        warehouse = Warehouse(settings, embedder=embedder)
        warehouse.install_policy(policy_file("demo.csv"))
        warehouse.close()  # its receipt folded while the store answers
    with pytest.raises(StorageUnreachableError) as refused:
        warehouse.audit.verify()
    said = str(refused.value)
    assert "could not reach the object store" in said and "it changed nothing" in said, said
    assert "restore" not in said and len(said) < 400, said



@pytest.mark.slow
def test_a_fold_that_keeps_failing_is_said_once_and_tried_less_and_less_often(
    embedder: Embedder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The object store client's own retries off: a try against a store that is gone then takes
    # about 2 s instead of 5, and the folding thread's backoff is what spaces the tries.
    with s3_holding(BUCKET) as server:
        env = aws_env(server) | {"RAGWARDEN_STORAGE_OPTIONS": '{"client_max_retries": "0"}'}
        settings = Settings.from_env(env, warehouse=f"s3://{BUCKET}/{uuid.uuid4().hex}", lineage_dir=tmp_path)
        warehouse = Warehouse(settings, embedder=embedder)
        warehouse.install_policy(policy_file("demo.csv"))  # its receipt waits in the journal for the folding thread
    with caplog.at_level(logging.WARNING, logger="ragwarden.state.audit_log"):
        time.sleep(9)  # the store gone: two tries fail (at about 1 s and 5 s), said once
    failed = [r for r in caplog.records if "folding the audit journal failed" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in failed]
    assert "could not reach the object store" in failed[0].getMessage()
    assert warehouse.receipts_pending()[0] >= 1, "the receipt still waits, safe in the journal"
    del warehouse  # nothing left to fold at exit: the store is gone for good
    gc.collect()
