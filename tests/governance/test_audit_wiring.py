"""Every retrieval and every operation decision leaves a receipt, and the chain stays verifiable."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner
from support.raw_tables import raw_table

from ragwarden.api.cli import main
from ragwarden.errors import NotFoundError
from ragwarden.governance.caller import Caller
from ragwarden.policies import policy_file
from ragwarden.state import audit_log
from ragwarden.warehouse import OPERATOR


@pytest.fixture
def audited_warehouse(fresh_warehouse, make_record):
    """Demo policy, one finance record, one search by alice, one refused derive by dave: all of it
    by this process, so its receipts are one chain."""
    wh = fresh_warehouse
    wh.install_policy(policy_file("demo.csv"))
    wh.ingest_records([make_record()])
    wh.search("budget review", subject="user:alice", tenant="acme", k=3, actor="agent:helper", purpose="weekly report")
    with pytest.raises(NotFoundError):
        wh.derive("x", parents=wh.store.chunks.chunk_ids_of("doc-1"), subject="user:dave", tenant="acme")
    return wh


def test_search_receipt_records_who_what_and_versions_but_not_the_query(audited_warehouse):
    (receipt,) = audited_warehouse.audit.query(operation="search")
    chunk_id = audited_warehouse.store.chunks.chunk_ids_of("doc-1")[0]
    assert (receipt.subject, receipt.actor, receipt.tenant, receipt.purpose) == ("user:alice", "agent:helper", "acme", "weekly report")
    assert receipt.chunk_ids == (chunk_id,) and dict(receipt.chunk_labels) == {chunk_id: ("finance",)}
    assert receipt.query is None and len(receipt.query_fingerprint) == 64
    assert receipt.policy_version == audited_warehouse.policy.version
    assert receipt.table_version == audited_warehouse.store.chunks.version
    assert receipt.withheld == 0


def test_operations_leave_decision_receipts_allowed_and_refused(audited_warehouse):
    receipts = audited_warehouse.audit.query()
    by_operation = {(r.operation, r.allowed) for r in receipts}
    assert {("ingest", True), ("search", True), ("derive", False)} <= by_operation
    refused = next(r for r in receipts if r.operation == "derive")
    assert refused.subject == "user:dave" and "not found" in refused.reason
    assert audited_warehouse.audit.verify().ok


def test_audit_verify_and_query_on_the_command_line(audited_warehouse):
    audited_warehouse.audit.fold()  # the receipts into the table, where this test tampers with them
    runner = CliRunner()
    args = ["--warehouse", audited_warehouse.uri]
    verified = runner.invoke(main, ["audit", "verify", *args])
    # the policy's install (one receipt in each tenant it names: acme, globex), the ingest, the search, the derive
    assert verified.exit_code == 0 and "5 receipts in 1 chain, intact" in verified.stdout
    head = verified.stdout.split("checkpoint ")[-1].strip()
    assert runner.invoke(main, ["audit", "verify", "--expect-head", head, *args]).exit_code == 0
    bad = runner.invoke(main, ["audit", "verify", "--expect-head", "3:nothex", *args])
    assert bad.exit_code == 2 and "not a checkpoint root" in bad.output
    found = runner.invoke(main, ["audit", "query", "--label", "finance", *args])
    assert [json.loads(line)["subject"] for line in found.stdout.splitlines()] == ["user:alice"]
    raw_table(audited_warehouse.store, "audit").update(where="seq = 2", values={"subject": "user:mallory"})
    tampered = runner.invoke(main, ["audit", "verify", *args])
    assert tampered.exit_code == 1 and "seq 2" in tampered.stderr
    raw_table(audited_warehouse.store, "audit").delete("seq = 5")
    dropped = runner.invoke(main, ["audit", "verify", "--expect-head", head, *args])
    assert dropped.exit_code == 1 and "seq 5: the head checkpoint" in dropped.stderr and "recorded is gone" in dropped.stderr


def test_audit_archive_and_verify_archive_on_the_command_line(audited_warehouse, tmp_path, monkeypatch):
    monkeypatch.setattr(audit_log, "CHECKPOINT_SLACK", timedelta(0))  # the cut may be now, not ten minutes ago
    runner = CliRunner()
    args = ["--warehouse", audited_warehouse.uri]
    time.sleep(1.1)  # the option takes whole seconds: a cut after every receipt so far
    cut = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S+0000")
    archived = runner.invoke(main, ["audit", "archive", "--before", cut, "--to", str(tmp_path / "archive"), *args])
    assert archived.exit_code == 0 and archived.stdout.startswith("archived 5 receipts of 1 chain to "), archived.output
    seal = archived.stdout.split("seal ")[-1].strip()
    checked = runner.invoke(main, ["audit", "verify-archive", str(tmp_path / "archive"), *args])
    assert checked.exit_code == 0 and "5 receipts in 1 chain, intact" in checked.stdout
    verified = runner.invoke(main, ["audit", "verify", *args])  # on from the seal: the archive's receipt and the check's
    assert verified.exit_code == 0 and "intact" in verified.stdout, verified.output
    (done,) = [r for r in audited_warehouse.audit.query(operation="admin") if "archived" in r.reason and r.tenant == "acme"]
    assert seal in done.reason and done.subject.startswith("operator:")
    again = runner.invoke(main, ["audit", "archive", "--before", cut, "--to", str(tmp_path / "archive"), *args])
    assert again.exit_code == 1 and "must be new or empty" in again.stderr


def test_lineage_follows_source_to_derived_rows_and_receipts(audited_warehouse):
    wh = audited_warehouse
    chunk_id = wh.store.chunks.chunk_ids_of("doc-1")[0]
    summary = wh.derive("Budget summary.", parents=[chunk_id], subject="user:alice", tenant="acme")
    wh.search("budget summary", subject="user:alice", tenant="acme", k=5)
    tree = wh.lineage("doc-1")
    assert tree["source"]["doc_id"] == "doc-1" and tree["chunks"] == [chunk_id]
    assert [d["chunk_id"] for d in tree["derived"]] == [summary.chunk_id]
    returned = [r for r in tree["receipts"] if r["operation"] == "search"]
    assert len(returned) == 2 and summary.chunk_id in returned[-1]["returned"]
    result = CliRunner().invoke(main, ["lineage", "doc-1", "--warehouse", wh.uri])
    assert json.loads(result.stdout)["derived"][0]["chunk_id"] == summary.chunk_id


@pytest.mark.parametrize(
    "command",
    [["audit", "verify"], ["audit", "query", "--subject", "user:alice"], ["lineage", "doc-1"], ["apikey", "list"],
     ["inventory", "--label", "finance", "--tenant", "acme", "--caller", "user:carol"],
     ["policy", "check", str(policy_file("demo.csv"))],
     ["forget", "doc-1", "--reason", "erasure request"]],
    ids=lambda command: " ".join(command[:2]),
)  # fmt: skip
def test_commands_that_never_embed_never_load_the_model(audited_warehouse, command):
    """Even with the PyTorch backend configured, the audit, lineage, key, inventory, policy and
    forget commands import neither torch nor a runtime: they start in the time of the CLI alone."""
    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from ragwarden.api.cli import main\n"
        f"result = CliRunner().invoke(main, [*{command!r}, '--warehouse', {audited_warehouse.uri!r}])\n"
        "loaded = sorted(m for m in ('torch', 'sentence_transformers', 'transformers', 'onnxruntime') if m in sys.modules)\n"
        "print(result.exit_code, loaded)\n"
    )
    env = {**os.environ, "RAGWARDEN_EMBED_BACKEND": "torch", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split("\n")[0] == "0 []", done.stdout + done.stderr


def test_the_operators_own_runs_leave_receipts_under_the_process_user_that_auditors_see(demo_policy_warehouse, make_record):
    """Installing a policy from a file, optimizing, a lineage without a caller, and the command
    line's audit verify and query: each decided by the gate and receipted under the operator (the
    operating-system user that ran it), in the tenants it touched, where that tenant's auditor
    reads it like any other receipt."""
    wh = demo_policy_warehouse  # its policy installed from a file by the operator
    wh.ingest_records([make_record()])
    wh.optimize()
    wh.lineage("doc-1")
    args = ["--warehouse", wh.uri]
    assert CliRunner().invoke(main, ["audit", "verify", *args]).exit_code == 0
    assert CliRunner().invoke(main, ["audit", "query", "--tenant", "acme", *args]).exit_code == 0
    assert OPERATOR == f"operator:{pwd.getpwuid(os.getuid()).pw_name}"
    seen = wh.receipts(caller=Caller(subject="user:carol", tenant="acme"), subject=OPERATOR)  # carol holds audit in acme
    reasons = {(r.operation, r.reason.split(" (")[0].split(":")[0]) for r in seen}
    assert {("admin", "installed policy " + wh.policy.version + " from a file"), ("admin", "optimized the warehouse"),
            ("audit", "lineage of 'doc-1'"), ("audit", "audit verify"), ("audit", "audit query")} <= reasons, reasons  # fmt: skip
    assert all(r.tenant == "acme" and r.allowed for r in seen)
    assert wh.audit.verify().ok
