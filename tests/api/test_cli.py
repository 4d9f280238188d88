"""The command line: every command works end to end, fails loudly on bad input, and is documented."""

from __future__ import annotations

import gc
import json
import re
import subprocess
import sys
from pathlib import Path

import click
import lancedb
import pytest
from click.testing import CliRunner

from ragwarden.api.cli import main
from ragwarden.policies import policy_file
from ragwarden.state import FORMAT_KEY, WRITES

REPO = Path(__file__).resolve().parents[2]
DEMO_CORPUS = REPO / "examples" / "demo" / "corpus.jsonl"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def warehouse_args(tmp_path: Path) -> list[str]:
    return ["--warehouse", str(tmp_path / "wh")]


@pytest.fixture
def empty_cli_warehouse(runner: CliRunner, warehouse_args: list[str]) -> list[str]:
    """CLI arguments of a warehouse made by ``init``, holding nothing."""
    assert runner.invoke(main, ["init", *warehouse_args]).exit_code == 0
    return warehouse_args


def all_commands(group: click.Group = main, prefix: str = "") -> list[tuple[str, click.Command]]:
    found = []
    for name, command in group.commands.items():
        full = f"{prefix}{name}"
        if isinstance(command, click.Group):
            found += all_commands(command, f"{full} ")
        else:
            found.append((full, command))
    return found


@pytest.mark.parametrize(("name", "command"), all_commands())
def test_every_command_takes_warehouse_and_policy_and_has_help(name, command):
    options = {opt for param in command.params for opt in getattr(param, "opts", [])}
    assert {"--warehouse", "--policy"} <= options, name
    assert command.help and len(command.help) > 20, f"{name} has no help text"


@pytest.mark.parametrize("name", [name for name, _ in all_commands()])
def test_every_command_is_documented_in_the_readme(name):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert re.search(rf"`ragwarden {re.escape(name)}\b", readme), f"README does not document `ragwarden {name}`"


def test_ingest_then_search_as_json(runner, warehouse_args):
    ingested = runner.invoke(main, ["ingest", str(DEMO_CORPUS), "--json", *warehouse_args])
    assert ingested.exit_code == 0, ingested.output
    assert json.loads(ingested.stdout)["documents"] == 32
    args = ["search", "salary bands", "--as", "user:dave", "--tenant", "acme", "-k", "3", "--json"]
    searched = runner.invoke(main, [*args, *warehouse_args, "--policy", str(policy_file("demo.csv"))])
    assert searched.exit_code == 0, searched.output
    hits = json.loads(searched.stdout)
    assert len(hits) == 3
    assert all(hit["classification"] in ("public", "internal") and not hit["labels"] for hit in hits)
    assert all(hit["metadata"]["title"] for hit in hits)
    only = runner.invoke(main, [*args, *warehouse_args, "--policy", str(policy_file("demo.csv")),
                                "--filter", '{"doc_id": {"$in": ["acme-pub-004", "acme-pub-005"]}}'])  # fmt: skip
    assert only.exit_code == 0, only.output
    assert {hit["doc_id"] for hit in json.loads(only.stdout)} <= {"acme-pub-004", "acme-pub-005"}
    for bad, named in (("{year", "is not JSON"), ('["year"]', "not an object"), ('{"labels": "x"}', "governs who may read")):
        refused = runner.invoke(main, [*args, *warehouse_args, "--filter", bad])
        assert refused.exit_code != 0 and named in refused.output, refused.output


def test_search_collapses_copies_of_one_text_with_distinct(runner, warehouse_args, tmp_path):
    copies = [{"id": f"copy-{n}", "text": "Permission is hereby granted, free of charge, to any person.", "tenant": "acme",
               "acl": {"allow": ["group:staff"]}, "classification": "public"} for n in range(3)]  # fmt: skip
    corpus = tmp_path / "copies.jsonl"
    corpus.write_text("".join(json.dumps(record) + "\n" for record in copies), encoding="utf-8")
    assert runner.invoke(main, ["ingest", str(corpus), *warehouse_args]).exit_code == 0
    args = ["search", "permission granted", "--as", "user:dave", "--tenant", "acme", "-k", "3", "--json",
            *warehouse_args, "--policy", str(policy_file("demo.csv"))]  # fmt: skip
    plain = json.loads(runner.invoke(main, args).stdout)
    distinct = json.loads(runner.invoke(main, [*args, "--distinct"]).stdout)
    per_doc = json.loads(runner.invoke(main, [*args, "--group-by", "doc", "--per-group", "1"]).stdout)
    assert len(plain) == 3 and len(distinct) == 1 and len(per_doc) == 3
    refused = runner.invoke(main, [*args, "--group-by", "folder"])
    assert refused.exit_code != 0 and "folder" in refused.output


def test_search_without_any_policy_finds_nothing_and_says_why(runner, warehouse_args):
    runner.invoke(main, ["ingest", str(DEMO_CORPUS), *warehouse_args])
    result = runner.invoke(main, ["search", "press release", "--as", "user:dave", "--tenant", "acme", *warehouse_args])
    assert result.exit_code == 0 and "no results" in result.stdout
    assert result.stderr == "note: no policy is installed, so nothing is visible: install one with `ragwarden policy install FILE`\n"


SEARCH = ["search", "salary bands", "--as", "user:dave"]


def test_a_tenant_the_policy_never_names_is_said_on_stderr(runner, demo_cli_warehouse):
    result = runner.invoke(main, [*SEARCH, "--tenant", "acmee", *demo_cli_warehouse])
    assert result.exit_code == 0 and result.stdout == "no results\n"
    assert "names no tenant 'acmee': check --tenant" in result.stderr


def test_an_empty_warehouse_is_said_on_stderr(runner, warehouse_args):
    assert runner.invoke(main, ["policy", "install", str(policy_file("demo.csv")), *warehouse_args]).exit_code == 0
    result = runner.invoke(main, [*SEARCH, "--tenant", "acme", "--json", *warehouse_args])
    assert result.exit_code == 0 and json.loads(result.stdout) == []
    assert "holds no documents yet" in result.stderr and "names no tenant" not in result.stderr


def test_a_caller_who_may_read_nothing_that_matches_gets_no_note_at_all(runner, demo_cli_warehouse):
    only_hr = ["--filter", '{"doc_id": "acme-hr-001"}']  # a document dave may not read
    result = runner.invoke(main, [*SEARCH, "--tenant", "acme", *only_hr, *demo_cli_warehouse])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "no results\n", "")  # nothing said of rows


READING_COMMANDS = [
    [*SEARCH, "--tenant", "acme"],
    ["audit", "verify"],
    ["audit", "query"],
    ["explain", "c1", "--as", "user:dave", "--tenant", "acme"],
    ["forget", "acme-hr-001", "--reason", "r"],
    ["optimize"],
    ["lineage", "show", "acme-hr-001"],
    ["apikey", "list"],
]


@pytest.mark.parametrize("command", READING_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_command_that_does_not_write_refuses_a_missing_warehouse_naming_it_and_creates_nothing(runner, tmp_path, command):
    missing = tmp_path / "wrehouse"
    result = runner.invoke(main, [*command, "--warehouse", str(missing)])
    assert result.exit_code == 1 and f"no warehouse at {str(missing)!r}" in result.stderr, result.output
    assert result.stdout == "" and not missing.exists()


def test_a_warehouse_path_that_is_a_file_or_cannot_be_made_is_one_clear_line(runner, tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a warehouse")
    for command in (["ingest", str(DEMO_CORPUS)], ["audit", "verify"]):
        result = runner.invoke(main, [*command, "--warehouse", str(a_file)])
        assert result.exit_code == 1 and result.stderr == f"Error: warehouse {str(a_file)!r} is a file, not a warehouse folder; name the folder instead\n"
    under_a_file = a_file / "warehouse"
    result = runner.invoke(main, ["ingest", str(DEMO_CORPUS), "--warehouse", str(under_a_file)])
    assert result.exit_code == 1 and result.stderr.startswith(f"Error: cannot create warehouse folder {str(under_a_file)!r}: ")
    assert len(result.stderr.splitlines()) == 1


def test_init_creates_an_empty_warehouse_that_the_other_commands_then_open(runner, warehouse_args):
    assert runner.invoke(main, ["audit", "verify", *warehouse_args]).exit_code == 1
    made = runner.invoke(main, ["init", *warehouse_args])
    assert made.exit_code == 0 and made.stdout == f"warehouse ready at {warehouse_args[1]} (0 documents)\n"
    assert runner.invoke(main, ["audit", "verify", *warehouse_args]).exit_code == 0
    assert runner.invoke(main, ["ingest", str(DEMO_CORPUS), *warehouse_args]).exit_code == 0
    assert runner.invoke(main, ["init", *warehouse_args]).stdout.endswith("(32 documents)\n")


def test_ingest_exits_nonzero_when_an_input_is_rejected(runner, warehouse_args, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "text": "no acl here", "tenant": "acme", "classification": "public"}\n', encoding="utf-8")
    result = runner.invoke(main, ["ingest", str(DEMO_CORPUS), str(bad), *warehouse_args])
    assert result.exit_code == 1
    assert f"rejected {bad}:1 (id 'x'): no ACL" in result.stderr
    assert "32 documents written" in result.stdout and "1 rejected" in result.stdout


def test_skip_invalid_lists_rejections_and_exits_zero(runner, warehouse_args, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n", encoding="utf-8")
    result = runner.invoke(main, ["ingest", str(bad), "--skip-invalid", *warehouse_args])
    assert result.exit_code == 0
    assert "not valid JSON" in result.stderr


def test_policy_check_accepts_the_demo_policy(runner):
    result = runner.invoke(main, ["policy", "check", str(policy_file("demo.csv"))])
    assert result.exit_code == 0 and "valid" in result.stdout


def test_policy_check_names_the_bad_line(runner, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("# a comment\ng, user:alice, group:finance, acme\np, group:finance, acme, label:pii, read, maybe\n")
    result = runner.invoke(main, ["policy", "check", str(bad)])
    assert result.exit_code == 1
    assert f"{bad}:3: effect 'maybe' is neither allow nor deny" in result.stderr


def test_policy_check_names_every_bad_line_at_once(runner, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("p, group:finance, acme, label:pii, read, maybe\ng, user:alice, group:finance, acme\n"
                   "q, user:alice\np, group:hr, acme, label:pii, write, allow\n")  # fmt: skip
    result = runner.invoke(main, ["policy", "check", str(bad)])
    assert result.exit_code == 1
    named = [line.split(": ", 1)[0] for line in result.stderr.removeprefix("Error: ").splitlines()]
    assert named == [f"{bad}:1", f"{bad}:3", f"{bad}:4"], result.stderr


CAPPED_POLICY = """\
g, user:bob, group:finance, acme
p, group:finance, acme, classification:confidential, read, allow
p, user:bob, acme, classification:internal, read, deny
p, everyone, globex, classification:public, read, deny
"""


def test_policy_check_prints_each_subjects_clearance_and_the_lines_that_set_it(runner, tmp_path):
    policy = tmp_path / "capped.csv"
    policy.write_text(CAPPED_POLICY)
    result = runner.invoke(main, ["policy", "check", str(policy)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2:] == [
        "  acme  group:finance: confidential (confidential granted by line 2)",
        "  acme  user:bob: public (confidential granted by line 2; capped below internal by line 3)",
        "  globex  everyone: none (nothing granted; capped below public by line 4)",
    ]
    as_json = runner.invoke(main, ["policy", "check", str(policy), "--json"])
    assert as_json.exit_code == 0, as_json.output
    bob = {"tenant": "acme", "subject": "user:bob", "clearance": "public", "granted": "confidential", "granted_by": 2, "capped_by": 3}
    nobody = {"tenant": "globex", "subject": "everyone", "clearance": None, "granted": "public", "granted_by": None, "capped_by": 4}
    assert json.loads(as_json.stdout)["clearances"][1:] == [bob, nobody]


def test_policy_install_makes_searches_use_it(runner, warehouse_args):
    runner.invoke(main, ["ingest", str(DEMO_CORPUS), *warehouse_args])
    installed = runner.invoke(main, ["policy", "install", str(policy_file("demo.csv")), *warehouse_args])
    assert installed.exit_code == 0, installed.output
    result = runner.invoke(main, ["search", "press release", "--as", "user:dave", "--tenant", "acme", "--json", *warehouse_args])
    assert json.loads(result.stdout)


def test_bad_search_arguments_exit_with_the_reason(runner, empty_cli_warehouse):
    result = runner.invoke(main, ["search", "x", "--as", "alice", "--tenant", "acme", *empty_cli_warehouse])
    assert result.exit_code == 1 and "not of the form user:NAME" in result.stderr


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "ragwarden"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and "search" in result.stdout


def test_demo_runs_with_no_arguments_on_the_embedded_default(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAGWARDEN_WAREHOUSE", raising=False)
    monkeypatch.delenv("RAGWARDEN_POLICY", raising=False)
    result = runner.invoke(main, ["demo"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / ".ragwarden" / "chunks.lance").is_dir()
    assert "Dave, new intern" in result.stdout and "why:" in result.stdout


def test_demo_shows_four_people_different_answers(runner, warehouse_args):
    result = runner.invoke(main, ["demo", "--json", *warehouse_args])
    assert result.exit_code == 0, result.output
    demo = json.loads(result.stdout)
    assert [p["subject"] for p in demo["people"]] == ["user:alice", "user:bob", "user:carol", "user:dave"]
    for block in demo["questions"]:
        answers = {tuple(h["doc_id"] for h in row["hits"]) for row in block["answers"]}
        assert len(answers) >= 2, block["question"]
    dave = [h for block in demo["questions"] for row in block["answers"] if row["subject"] == "user:dave" for h in row["hits"]]
    assert all(h["classification"] in ("public", "internal") for h in dave)


@pytest.fixture
def demo_cli_warehouse(runner, warehouse_args) -> list[str]:
    """CLI arguments of a warehouse holding the demo corpus under the installed demo policy."""
    assert runner.invoke(main, ["ingest", str(DEMO_CORPUS), *warehouse_args]).exit_code == 0
    assert runner.invoke(main, ["policy", "install", str(policy_file("demo.csv")), *warehouse_args]).exit_code == 0
    return warehouse_args


def first_chunk(runner, args, doc_id: str, subject: str, query: str) -> str:
    result = runner.invoke(main, ["search", query, "--as", subject, "--tenant", "acme", "-k", "50", "--json", *args])
    return next(hit["chunk_id"] for hit in json.loads(result.stdout) if hit["doc_id"] == doc_id)


def test_derive_explain_sync_forget_from_the_command_line(runner, demo_cli_warehouse, tmp_path):
    args = demo_cli_warehouse
    parent = first_chunk(runner, args, "acme-hr-001", "user:alice", "salary bands")
    derived = runner.invoke(
        main, ["derive", "Bands rose 4%.", "--parent", parent, "--as", "user:alice", "--tenant", "acme", "--json", *args]
    )
    assert derived.exit_code == 0, derived.output
    row = json.loads(derived.stdout)
    assert row["labels"] == ["comp"] and row["classification"] == "confidential"

    explained = runner.invoke(main, ["explain", row["chunk_id"], "--as", "user:alice", "--tenant", "acme", *args])
    assert explained.exit_code == 0 and explained.stdout.startswith("visible")
    hidden = runner.invoke(main, ["explain", row["chunk_id"], "--as", "user:dave", "--tenant", "acme", "--json", *args])
    assert json.loads(hidden.stdout) == {
        "chunk_id": row["chunk_id"], "subject": "user:dave", "tenant": "acme", "allowed": False, "reason": "not visible", "steps": []
    }
    plain = runner.invoke(main, ["explain", row["chunk_id"], "--as", "user:dave", "--tenant", "acme", *args])
    assert plain.stdout.strip() == "not visible", "said once, never 'not visible: not visible'"

    changes = tmp_path / "sync.jsonl"
    changes.write_text(json.dumps({"id": "acme-hr-001", "tenant": "acme", "acl": {"allow": ["group:staff"]}, "labels": [], "classification": "internal"}) + "\n")
    synced = runner.invoke(main, ["sync", str(changes), *args])
    assert synced.exit_code == 0 and "1 chunk, 1 derived row" in synced.stdout
    assert first_chunk(runner, args, "acme-hr-001", "user:dave", "salary bands") == parent

    forgot = runner.invoke(main, ["forget", "acme-hr-001", "--reason", "test erasure", *args])
    assert forgot.exit_code == 0 and "1 chunk, 1 derived row" in forgot.stdout
    gone = runner.invoke(main, ["forget", "acme-hr-001", "--reason", "again", *args])
    assert gone.exit_code == 1 and "not found" in gone.stderr


def readme_folder(root: Path, group: str, text: str) -> Path:
    """A folder holding one README.md governed by its sidecar: readable by ``group`` in acme."""
    root.mkdir()
    (root / "README.md").write_text(text, encoding="utf-8")
    (root / "README.md.acl.yaml").write_text(f"tenant: acme\nacl: {{allow: [\"{group}\"]}}\nclassification: internal\n")
    return root


def overridden_ingests(args: list[str]) -> list[dict]:
    """What the receipts of the ingests that used an override say of it."""
    from ragwarden.config import Settings
    from ragwarden.warehouse import Warehouse

    receipts = Warehouse(Settings(warehouse=args[1])).receipts(caller=None, operation="ingest")
    return [{k: found.details[k] for k in ("overrides", "restored")} for found in receipts if "overrides" in found.details]


def test_a_same_named_file_of_another_folder_is_refused_naming_both_sources_unless_moved_on_purpose(
    runner, demo_cli_warehouse, tmp_path
):
    args = demo_cli_warehouse
    first = readme_folder(tmp_path / "a", "group:staff", "The staff handbook: offsite on Friday.")
    second = readme_folder(tmp_path / "b", "group:hr", "The HR handbook: salary review on Monday.")
    assert runner.invoke(main, ["ingest", str(first), *args]).exit_code == 0
    refused = runner.invoke(main, ["ingest", str(second), *args])
    assert refused.exit_code == 1 and "0 documents written" in refused.stdout and "1 rejected" in refused.stdout
    assert (first / "README.md").as_uri() in refused.stderr and (second / "README.md").as_uri() in refused.stderr
    assert "--allow-move" in refused.stderr
    hits = json.loads(runner.invoke(main, ["search", "handbook", "--as", "user:dave", "--tenant", "acme", "--json", *args]).stdout)
    assert [hit["text"] for hit in hits if hit["doc_id"] == "README.md"] == ["The staff handbook: offsite on Friday."]

    moved = runner.invoke(main, ["ingest", str(second), "--allow-move", *args])
    assert moved.exit_code == 0 and "1 document written" in moved.stdout, moved.output
    hits = json.loads(runner.invoke(main, ["search", "handbook", "--as", "user:dave", "--tenant", "acme", "--json", *args]).stdout)
    assert "README.md" not in {hit["doc_id"] for hit in hits}  # now hr's, as asked
    assert overridden_ingests(args) == [{"overrides": ["allow_move"], "restored": []}]


def test_an_erased_document_stays_erased_when_its_ingest_runs_again_unless_restored_on_purpose(
    runner, demo_cli_warehouse
):
    args = demo_cli_warehouse
    assert runner.invoke(main, ["forget", "acme-hr-001", "--reason", "erasure request 42", *args]).exit_code == 0
    again = runner.invoke(main, ["ingest", str(DEMO_CORPUS), *args])
    assert again.exit_code == 1 and "0 documents written, 31 unchanged" in again.stdout and "1 rejected" in again.stdout
    assert "'acme-hr-001' of tenant 'acme' was erased on" in again.stderr and "--restore-erased" in again.stderr
    search = ["search", "salary bands", "--as", "user:alice", "--tenant", "acme", "--json", "-k", "50", *args]
    assert "acme-hr-001" not in {hit["doc_id"] for hit in json.loads(runner.invoke(main, search).stdout)}

    restored = runner.invoke(main, ["ingest", str(DEMO_CORPUS), "--restore-erased", "--json", *args])
    assert restored.exit_code == 0, restored.output
    assert json.loads(restored.stdout)["restored"] == [{"tenant": "acme", "id": "acme-hr-001"}]
    assert overridden_ingests(args) == [{"overrides": ["restore_erased"], "restored": [["acme", "acme-hr-001"]]}]
    assert "acme-hr-001" in {hit["doc_id"] for hit in json.loads(runner.invoke(main, search).stdout)}
    assert runner.invoke(main, ["ingest", str(DEMO_CORPUS), *args]).exit_code == 0  # restored: its mark is lifted


def test_a_corrupt_pdf_is_one_rejection_line_with_no_parser_chatter(tmp_path):
    folder = tmp_path / "pdfs"
    folder.mkdir()
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj garbage")
    (folder / "broken.pdf.acl.yaml").write_text("tenant: acme\nacl: {allow: [everyone]}\nclassification: public\n")
    script = Path(sys.executable).parent / "ragwarden"  # a process of its own: logging as a user's shell has it
    result = subprocess.run([str(script), "ingest", str(folder), "--warehouse", str(tmp_path / "wh")],
                            capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"rejected {folder / 'broken.pdf'}: unreadable PDF (PdfStreamError: Stream has ended unexpectedly)"]


def test_token_mints_a_token_the_service_accepts(runner, warehouse_args, monkeypatch):
    from support.identity_provider import AUDIENCE, ISSUER, JWT_SECRET

    from ragwarden.api_keys import ApiKeys
    from ragwarden.config import Settings
    from ragwarden.credentials import Authenticator
    from ragwarden.state.api_keys import ApiKeysTable
    from ragwarden.state.tables import connect

    monkeypatch.setenv("RAGWARDEN_JWT_SECRET", JWT_SECRET.decode())
    monkeypatch.setenv("RAGWARDEN_JWT_ISSUER", ISSUER)
    monkeypatch.setenv("RAGWARDEN_JWT_AUDIENCE", AUDIENCE)
    result = runner.invoke(main, ["token", "--sub", "alice", "--tenant", "acme", "--act", "agent:notes", *warehouse_args])
    assert result.exit_code == 0, result.output
    settings = Settings.from_env()
    identity = Authenticator(settings.auth, ApiKeys(ApiKeysTable(connect(warehouse_args[1])))).verify(result.output.strip())
    assert (identity.subject, identity.tenant, identity.actor) == ("user:alice", "acme", "agent:notes")


def test_token_without_a_configured_secret_says_what_to_set(runner, warehouse_args, monkeypatch):
    monkeypatch.delenv("RAGWARDEN_JWT_SECRET", raising=False)
    result = runner.invoke(main, ["token", "--sub", "alice", "--tenant", "acme", *warehouse_args])
    assert result.exit_code == 1
    assert "RAGWARDEN_JWT_SECRET" in result.output


def test_apikey_create_list_revoke_keeps_only_the_hash(runner, empty_cli_warehouse):
    from ragwarden.api_keys import ApiKeys
    from ragwarden.errors import AuthenticationError
    from ragwarden.state.api_keys import ApiKeysTable
    from ragwarden.state.tables import connect

    created = runner.invoke(main, ["apikey", "create", "--subject", "service:indexer", "--tenant", "acme", *empty_cli_warehouse])
    assert created.exit_code == 0, created.output
    key = created.output.strip()
    key_id, _, secret = key.removeprefix("rwk_").partition(".")
    keys = ApiKeys(ApiKeysTable(connect(empty_cli_warehouse[1])))
    assert keys.verify(key).subject == "service:indexer"

    listed = runner.invoke(main, ["apikey", "list", *empty_cli_warehouse])
    assert json.loads(listed.output)["key_id"] == key_id
    assert secret not in listed.output
    stored = connect(empty_cli_warehouse[1]).open_table("api_keys").to_arrow().to_pylist()
    assert all(secret not in json.dumps(row, default=str) for row in stored)

    revoked = runner.invoke(main, ["apikey", "revoke", key_id, *empty_cli_warehouse])
    assert revoked.exit_code == 0, revoked.output
    with pytest.raises(AuthenticationError, match="revoked"):
        keys.verify(key)


def test_apikey_refuses_a_subject_that_is_not_a_service_or_user(runner, warehouse_args):
    result = runner.invoke(main, ["apikey", "create", "--subject", "group:admins", "--tenant", "acme", *warehouse_args])
    assert result.exit_code == 1
    assert "service:NAME or user:NAME" in result.output


def test_a_served_worker_exempts_what_it_built_to_start_from_the_collectors_full_passes(small_warehouse, monkeypatch):
    """A full collection walked the objects a server builds to start (about 300,000), stopping every
    request for 170 to 390 ms; a worker builds its app, then freezes them out of the collector's reach."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from ragwarden.api.cli_service import SERVE_LOADS, SERVE_MCP, app_from_env

    blas = next((info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"), None)
    monkeypatch.setenv("RAGWARDEN_WAREHOUSE", small_warehouse.uri)
    monkeypatch.setenv(SERVE_MCP, "0")
    monkeypatch.delenv(SERVE_LOADS, raising=False)
    try:
        app = app_from_env()
        assert gc.get_freeze_count() > 10_000
        assert not any(found is app for found in gc.get_objects()), "the app lies beyond the collector's passes"
    finally:
        gc.unfreeze()
        if blas is not None:  # app_from_env gave this process one BLAS thread per call
            threadpool_limits(limits=blas, user_api="blas")


def test_migrate_brings_an_unrecorded_warehouse_to_this_release_s_format_once(
    runner: CliRunner, empty_cli_warehouse: list[str], tmp_path: Path
) -> None:
    lancedb.connect(str(tmp_path / "wh")).open_table("policies").to_lance().update_schema_metadata({FORMAT_KEY: None})
    refused = runner.invoke(main, ["optimize", *empty_cli_warehouse])
    assert refused.exit_code != 0 and "Run `ragwarden migrate`" in refused.output, refused.output
    first = runner.invoke(main, ["migrate", "--json", *empty_cli_warehouse])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout) == {"found": 1, "now": WRITES, "steps": [f"recorded format {WRITES}"]}
    again = runner.invoke(main, ["migrate", *empty_cli_warehouse])
    assert again.exit_code == 0 and again.stdout.strip() == f"the warehouse is at format {WRITES} already: nothing to do"
