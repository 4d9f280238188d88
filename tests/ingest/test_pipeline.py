"""Ingest end to end through the warehouse: files with their governance, searchable as permitted."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
from support.raw_tables import raw_table

from ragwarden.ingest.pipeline import run_ingest
from ragwarden.ingest.records import read_jsonl


def test_every_file_format_lands_and_is_found_by_a_permitted_reader(demo_policy_warehouse, folder_of_every_format):
    report = demo_policy_warehouse.ingest(folder_of_every_format, manifest=folder_of_every_format / "manifest.yaml")
    assert (report.documents, report.rejected) == (6, ())
    (hit,) = demo_policy_warehouse.search("Hello from a PDF", subject="user:dave", tenant="acme", k=1)
    assert hit.doc_id == "d.pdf" and hit.text == "Hello from a PDF"
    html = demo_policy_warehouse.search("Paragraph one", subject="user:dave", tenant="acme", k=1, mode="fts")
    assert html[0].doc_id == "c.html" and "secret" not in html[0].text


def test_files_without_governance_are_rejected_and_the_rest_land(demo_policy_warehouse, folder_with_manifest):
    report = demo_policy_warehouse.ingest(folder_with_manifest, manifest=folder_with_manifest / "manifest.yaml")
    assert report.documents == 3
    assert [(Path(r.source).name, r.reason.split(":")[0]) for r in report.rejected] == [("notes.txt", "no governance")]


def test_posix_permissions_become_the_acl(demo_policy_warehouse, tmp_path):
    # pytest's temporary folders sit in a private (0700) folder: a 0644 file there is its owner's alone
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "team.txt").write_text("team plan for the offsite", encoding="utf-8")
    os.chmod(folder / "team.txt", 0o644)
    report = demo_policy_warehouse.ingest(folder, acl_from="posix", tenant="acme")
    assert report.documents == 1
    row = raw_table(demo_policy_warehouse.store).search().limit(1).to_list()[0]
    assert row["acl_allow"] == [f"user:{pwd.getpwuid(os.getuid()).pw_name}"]
    assert (row["tenant"], row["classification"]) == ("acme", 1)


def test_a_missing_path_is_rejected_by_name(fresh_warehouse, tmp_path):
    report = fresh_warehouse.ingest([tmp_path / "nope.jsonl"])
    assert [(r.source, r.reason) for r in report.rejected] == [(str(tmp_path / "nope.jsonl"), "no such file or folder")]


def test_a_progress_bar_runs_when_asked(fresh_warehouse, capsys):
    corpus = Path(__file__).resolve().parents[2] / "examples" / "demo" / "corpus.jsonl"
    report = run_ingest(
        read_jsonl(corpus), store=fresh_warehouse.store, embedder=fresh_warehouse.embedder, overlap=32, batch_docs=8, progress=True
    )
    assert report.documents == 32
    err = capsys.readouterr().err
    assert "ingest: 32doc" in err


@pytest.mark.parametrize("progress", [False, None])
def test_no_progress_bar_off_a_terminal(fresh_warehouse, make_record, capsys, progress):
    fresh_warehouse.ingest_records([make_record()], progress=progress)
    assert capsys.readouterr().err == ""
