"""Ingest end to end through the warehouse: files with their governance, searchable as permitted."""

from __future__ import annotations

import json
import os
import pwd
import re
from pathlib import Path

import pytest
from support.raw_tables import raw_table

from ragwarden.ingest.pipeline import run_ingest
from ragwarden.ingest.records import read_jsonl


def test_every_file_format_lands_and_is_found_by_a_permitted_reader(demo_policy_warehouse, folder_of_every_format):
    report = demo_policy_warehouse.ingest(folder_of_every_format, manifest=folder_of_every_format / "manifest.yaml")
    assert (report.documents, report.rejected) == (11, ())
    (hit,) = demo_policy_warehouse.search("Hello from a PDF", subject="user:dave", tenant="acme", k=1)
    assert hit.doc_id == "d.pdf" and hit.text == "Hello from a PDF"
    html = demo_policy_warehouse.search("Paragraph one", subject="user:dave", tenant="acme", k=1, mode="fts")
    assert html[0].doc_id == "c.html" and "secret" not in html[0].text
    word = demo_policy_warehouse.search("Word paragraph", subject="user:dave", tenant="acme", k=1, mode="fts")
    assert word[0].doc_id == "j.docx" and "cell b" in word[0].text


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


def test_the_report_carries_the_tags_it_wrote_equal_to_what_the_sources_table_holds(fresh_warehouse):
    corpus = Path(__file__).resolve().parents[2] / "examples" / "demo" / "corpus.jsonl"
    report = fresh_warehouse.ingest(corpus)
    assert len(report.written_tags) == len(report.written_documents) == report.documents > 0
    assert list(report.written_tags) == fresh_warehouse.store.sources.tags(report.written_documents)
    assert {tags.tenant for tags in report.written_tags} == {tenant for tenant, _ in report.written_documents}


def test_a_missing_path_is_rejected_by_name(fresh_warehouse, tmp_path):
    report = fresh_warehouse.ingest([tmp_path / "nope.jsonl"])
    assert [(r.source, r.reason) for r in report.rejected] == [(str(tmp_path / "nope.jsonl"), "no such file or folder")]


def test_a_progress_bar_runs_when_asked(fresh_warehouse, capsys):
    corpus = Path(__file__).resolve().parents[2] / "examples" / "demo" / "corpus.jsonl"
    report = run_ingest(
        read_jsonl(corpus), doors=fresh_warehouse.store.write_doors(), embedder=fresh_warehouse.embedder, overlap=32, batch_docs=8, progress=True
    )
    assert report.documents == 32
    err = capsys.readouterr().err
    assert "ingest 32 inputs" in err and "32 chunks" in err


@pytest.mark.parametrize("progress", [False, None])
def test_no_progress_bar_off_a_terminal(fresh_warehouse, make_record, capsys, progress):
    fresh_warehouse.ingest_records([make_record()], progress=progress)
    assert capsys.readouterr().err == ""


def test_the_progress_bar_counts_inputs_against_their_total_and_moves_while_embedding(
    demo_policy_warehouse, tmp_path, make_record, capsys
):
    """Forty documents and a refused line in one commit: the bar knows the total from the start,
    shows documents done while their chunks are embedded (before the one commit), and ends with
    every input counted and the rates."""
    records = [make_record(id=f"p-{n}", text=" ".join(f"Progress note {n}, sentence {s}." for s in range(60)))
               for n in range(40)]  # fmt: skip
    path = tmp_path / "progress.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"id": "broken"}\n', encoding="utf-8")
    report = demo_policy_warehouse.ingest(path, progress=True)
    assert report.documents == 40 and len(report.rejected) == 1
    frames = [frame for frame in re.split(r"[\r\n]", capsys.readouterr().err) if frame.startswith("ingest")]
    done = [int(found.group(1)) for frame in frames if (found := re.search(r"\| *(\d+)/41 inputs", frame))]
    assert done and done[-1] == 41, frames[-3:]
    assert any(1 < n < 41 for n in done), f"the bar moved only at the commit: {done}"
    assert re.search(r"\d+ chunks, [\d.]+ chunks/s, [\d.]+ docs/s", frames[-1]), frames[-1]


def test_with_ingest_maintenance_off_an_ingest_only_commits_its_rows(fresh_warehouse, make_record):
    """Maintenance left to a scheduled ``optimize``: each ingest adds its fragment and nothing else,
    and its rows are searched all the same."""
    from dataclasses import replace as replaced

    from ragwarden.warehouse import Warehouse

    settings = replaced(fresh_warehouse.settings, ingest_maintenance=False)
    writer = Warehouse(settings, embedder=fresh_warehouse.embedder)
    for n in range(12):
        version = writer.store.chunks.latest_version()
        assert writer.ingest_records([make_record(id=f"doc-{n}", text=f"note number {n} about pumps")]).ok
        assert writer.store.chunks.latest_version() == version + 1, "one commit: the rows, no fold or merge"
    assert writer.store.chunks.count() == 12


def test_objects_alive_at_an_ingest_are_left_out_of_collections_until_it_ends_however_ingests_overlap():
    import gc

    from ragwarden.ingest.pipeline import held_apart

    assert gc.get_freeze_count() == 0
    alive = [[float(i)] for i in range(1_000)]
    with held_apart():
        assert gc.get_freeze_count() >= len(alive)
        with held_apart():  # a second ingest beside it leaves the first's freeze alone
            pass
        assert gc.get_freeze_count() >= len(alive), "the inner block's end unfroze nothing"
    assert gc.get_freeze_count() == 0
