"""The file loader: each format's text, governance from manifest, sidecar or POSIX, refusals."""

from __future__ import annotations

import grp
import gzip
import json
import pwd
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ragwarden.errors import InvalidRequestError, InvalidSourceError
from ragwarden.governance.tags import Classification
from ragwarden.ingest.files import iter_file_sources
from ragwarden.ingest.pipeline import dedupe_ids, iter_sources
from ragwarden.ingest.records import Rejected, Skipped, SourceRecord


def by_source(outcomes) -> dict[str, object]:
    return {outcome.origin if isinstance(outcome, SourceRecord) else outcome.source: outcome for outcome in outcomes}


def only(outcomes) -> object:
    outcomes = list(outcomes)
    assert len(outcomes) == 1, outcomes
    return outcomes[0]


# --- formats -------------------------------------------------------------------------------


def test_every_supported_format_becomes_a_record_with_its_text_and_media_type(folder_of_every_format: Path) -> None:
    folder = folder_of_every_format
    got = by_source(iter_file_sources([folder], manifest=folder / "manifest.yaml"))
    expected = {
        "a.txt": ("text/plain", "plain text"),
        "b.md": ("text/markdown", "# Title\n\nmarkdown *body*"),
        "c.html": ("text/html", "Heading\n\nParagraph one\nParagraph two"),
        "d.pdf": ("application/pdf", "Hello from a PDF"),
        "e.markdown": ("text/markdown", "long suffix"),
        "f.htm": ("text/html", "short suffix"),
        "g.rst": ("text/x-rst", "Title\n=====\n\nrestructured text"),
        "h.csv": ("text/csv", "name,band\nalice,4"),
        "i.json": ("application/json", '{"note": "json text"}'),
        "LICENSE": ("text/plain", "Permission is hereby granted"),
        "j.docx": ("application/vnd.openxmlformats-officedocument.wordprocessingml.document",
                   "A Word paragraph\ncell a\tcell b"),
    }
    assert set(got) == {str(folder / name) for name in expected}
    for name, (media_type, text) in expected.items():
        record = got[str(folder / name)]
        assert isinstance(record, SourceRecord), record
        assert record.metadata["media_type"] == media_type
        assert record.text == text


def test_html_text_leaves_out_script_and_style(folder_of_every_format: Path) -> None:
    folder = folder_of_every_format
    record = only(iter_file_sources([folder / "c.html"], manifest=folder / "manifest.yaml"))
    assert "secret" not in record.text and "color" not in record.text
    assert "\n\n\n" not in record.text


def test_pdf_pages_are_joined_by_a_blank_line(tmp_path: Path, make_pdf: Callable[..., bytes]) -> None:
    (tmp_path / "two.pdf").write_bytes(make_pdf("First page", "Second page"))
    (tmp_path / "two.pdf.acl.yaml").write_text("tenant: acme\nacl: {allow: [everyone]}\nclassification: public\n")
    record = only(iter_file_sources([tmp_path / "two.pdf"]))
    assert record.text == "First page\n\nSecond page"


def test_a_pdf_pypdf_cannot_read_is_rejected_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is no pdf at all")
    (tmp_path / "broken.pdf.acl.yaml").write_text("tenant: acme\nacl: {allow: [everyone]}\nclassification: public\n")
    outcome = only(iter_file_sources([tmp_path / "broken.pdf"]))
    assert isinstance(outcome, Rejected)
    assert outcome.source == str(tmp_path / "broken.pdf")
    assert "unreadable PDF" in outcome.reason


# --- governance from a manifest or sidecar --------------------------------------------------


def test_the_first_matching_manifest_rule_wins(folder_with_manifest: Path) -> None:
    folder = folder_with_manifest
    got = by_source(iter_file_sources([folder], manifest=folder / "manifest.yaml"))
    q1 = got[str(folder / "finance/q1.md")]  # matched by finance/** and by **/*.md
    assert isinstance(q1, SourceRecord)
    assert q1.tags.acl_allow == ["group:finance"]
    assert q1.tags.acl_deny == frozenset({"user:mallory"})
    assert q1.tags.labels == frozenset({"finance"})
    assert q1.tags.classification is Classification.CONFIDENTIAL
    guide = got[str(folder / "guide.md")]  # second rule only
    assert guide.tags.acl_allow == ["everyone"]
    assert guide.tags.classification is Classification.PUBLIC


def test_double_star_spans_zero_or_more_folders(folder_with_manifest: Path) -> None:
    folder = folder_with_manifest
    got = by_source(iter_file_sources([folder], manifest=folder / "manifest.yaml"))
    assert got[str(folder / "finance/deep/q2.txt")].tags.acl_allow == ["group:finance"]  # finance/** two deep
    assert got[str(folder / "guide.md")].tags.tenant == "acme"  # **/*.md at the top level


def test_a_file_no_rule_matches_is_rejected_as_ungoverned(folder_with_manifest: Path) -> None:
    folder = folder_with_manifest
    outcome = by_source(iter_file_sources([folder], manifest=folder / "manifest.yaml"))[str(folder / "misc/notes.txt")]
    assert isinstance(outcome, Rejected)
    assert "no governance" in outcome.reason and "manifest.yaml" in outcome.reason


def test_files_without_manifest_or_sidecar_are_rejected(ungoverned_folder: Path) -> None:
    outcomes = list(iter_file_sources([ungoverned_folder]))
    assert [type(o) for o in outcomes] == [Rejected, Rejected]
    assert all("no governance" in o.reason and "--acl-from posix" in o.reason for o in outcomes)


def test_a_sidecar_replaces_the_matching_manifest_rule_whole(folder_with_sidecar: Path) -> None:
    folder = folder_with_sidecar
    record = by_source(iter_file_sources([folder], manifest=folder / "manifest.yaml"))[str(folder / "finance/q1.md")]
    assert record.tags.tenant == "globex"
    assert record.tags.acl_allow == ["user:alice"]
    assert record.tags.acl_deny == frozenset()  # the rule's deny and labels are not merged in
    assert record.tags.labels == frozenset()
    assert record.tags.classification is Classification.RESTRICTED


def test_a_sidecar_can_set_the_id_and_uri(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("text")
    (tmp_path / "a.txt.acl.yaml").write_text(
        "id: policy-7\nuri: https://wiki.example/policy-7\ntenant: acme\nacl: {allow: [everyone]}\nclassification: public\n"
    )
    record = only(iter_file_sources([tmp_path]))
    assert (record.doc_id, record.uri) == ("policy-7", "https://wiki.example/policy-7")


@pytest.mark.parametrize(
    "sidecar, reason",
    [("tenant: [unclosed", "not valid YAML"), ("- a list", "must be a mapping"), ("owner: bob", "unknown keys")],
)
def test_a_malformed_sidecar_rejects_only_its_file(
    folder_with_manifest: Path, sidecar: str, reason: str
) -> None:
    folder = folder_with_manifest
    (folder / "guide.md.acl.yaml").write_text(sidecar)
    got = by_source(iter_file_sources([folder], manifest=folder / "manifest.yaml"))
    guide = got[str(folder / "guide.md")]
    assert isinstance(guide, Rejected)
    assert "guide.md.acl.yaml" in guide.reason and reason in guide.reason
    assert isinstance(got[str(folder / "finance/q1.md")], SourceRecord)


def test_a_governance_value_build_record_refuses_rejects_the_file(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("text")
    (tmp_path / "a.txt.acl.yaml").write_text("tenant: acme\nacl: {allow: []}\nclassification: public\n")
    outcome = only(iter_file_sources([tmp_path]))
    assert isinstance(outcome, Rejected) and "acl.allow is empty" in outcome.reason


@pytest.mark.parametrize(
    "manifest, named",
    [
        ("rules: [unclosed", "not valid YAML"),
        ("rules: {glob: '*'}", "rules must be a list"),
        ("- glob: '*'", "must be a mapping"),
        ("other: 1", "unknown keys"),
        ("rules:\n  - glob: '*'\n    tenant: acme\n  - tenant: acme\n", "rules[1]: needs a glob"),
        ("rules:\n  - glob: '*'\n    owner: bob\n", "rules[0]: has unknown keys ['owner']"),
    ],
)
def test_a_malformed_manifest_stops_the_run_naming_the_manifest(
    ungoverned_folder: Path, manifest: str, named: str
) -> None:
    path = ungoverned_folder / "manifest.yaml"
    path.write_text(manifest)
    with pytest.raises(InvalidSourceError) as raised:
        iter_file_sources([ungoverned_folder], manifest=path)
    assert raised.value.source == str(path)
    assert named in raised.value.reason


# --- ids, uris, metadata ---------------------------------------------------------------------


def test_ids_are_paths_relative_to_the_folder_or_the_file_name(folder_with_manifest: Path) -> None:
    folder = folder_with_manifest
    manifest = folder / "manifest.yaml"
    walked = by_source(iter_file_sources([folder], manifest=manifest))[str(folder / "finance/deep/q2.txt")]
    assert walked.doc_id == "finance/deep/q2.txt"
    assert walked.metadata == {"path": "finance/deep/q2.txt", "media_type": "text/plain"}
    assert walked.uri == (folder / "finance/deep/q2.txt").resolve().as_uri()
    named = only(iter_file_sources([folder / "finance/deep/q2.txt"], manifest=manifest))
    assert (named.doc_id, named.origin) == ("q2.txt", str(folder / "finance/deep/q2.txt"))


def test_a_second_file_with_an_id_already_used_in_the_run_is_rejected(folder_with_manifest: Path) -> None:
    folder = folder_with_manifest
    paths = [folder, folder / "guide.md"]  # the folder's guide.md, then the file by name: both id guide.md
    sources = iter_sources(paths, manifest=folder / "manifest.yaml", acl_from=None, default_tenant=None, max_bytes=10**6)
    outcomes = [o for o in dedupe_ids(sources) if "guide.md" in (o.origin if isinstance(o, SourceRecord) else o.source)]
    assert isinstance(outcomes[0], SourceRecord)
    assert isinstance(outcomes[1], Rejected) and "already appeared in this run" in outcomes[1].reason


# --- refusals of the bytes -------------------------------------------------------------------


def test_a_file_over_the_cap_is_rejected_naming_its_size_the_cap_and_the_setting(folder_with_manifest: Path) -> None:
    folder = folder_with_manifest
    outcome = only(iter_file_sources([folder / "guide.md"], manifest=folder / "manifest.yaml", max_bytes=5))
    assert isinstance(outcome, Rejected)
    assert outcome.source == str(folder / "guide.md")
    assert "13 bytes" in outcome.reason and "5 bytes" in outcome.reason and "RAGWARDEN_MAX_FILE_BYTES" in outcome.reason


def test_a_text_file_with_a_nul_byte_is_rejected_as_binary(folder_with_manifest: Path) -> None:
    folder = folder_with_manifest
    (folder / "guide.md").write_bytes(b"looks like text\x00\x01\x02")
    outcome = only(iter_file_sources([folder / "guide.md"], manifest=folder / "manifest.yaml"))
    assert isinstance(outcome, Rejected) and "binary" in outcome.reason


def test_invalid_utf8_is_rejected_with_the_byte_offset(folder_with_manifest: Path) -> None:
    folder = folder_with_manifest
    (folder / "guide.md").write_bytes(b"caf\xe9 au lait")
    outcome = only(iter_file_sources([folder / "guide.md"], manifest=folder / "manifest.yaml"))
    assert isinstance(outcome, Rejected) and "invalid UTF-8 at byte 3" in outcome.reason


def test_an_empty_file_is_skipped(folder_with_manifest: Path) -> None:
    folder = folder_with_manifest
    (folder / "guide.md").write_text("  \n")
    outcome = only(iter_file_sources([folder / "guide.md"], manifest=folder / "manifest.yaml"))
    assert outcome == Skipped(source=str(folder / "guide.md"), reason="empty text")


# --- POSIX permissions -------------------------------------------------------------------------


def _owner_and_group(path: Path) -> tuple[str, str]:
    info = path.stat()
    return f"user:{pwd.getpwuid(info.st_uid).pw_name}", f"group:{grp.getgrgid(info.st_gid).gr_name}"


@pytest.fixture
def searchable_folder() -> Iterator[Path]:
    """A 0755 folder under the system's temporary folder: pytest's own base folder is 0700, and
    ``--acl-from posix`` counts every folder above a file (tests/ingest/test_posix_access.py)."""
    folder = Path(tempfile.mkdtemp(prefix="ragwarden-files-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.parametrize(
    "mode, readers, denied",
    [
        (0o600, {"owner"}, set()),
        (0o640, {"owner", "group"}, set()),
        (0o644, {"owner", "group", "everyone"}, set()),
        (0o204, {"everyone"}, {"owner", "group"}),  # the owner and group classes refuse, and decide
    ],
)
def test_posix_acl_comes_from_owner_group_and_mode(
    searchable_folder: Path, mode: int, readers: set[str], denied: set[str]
) -> None:
    path = searchable_folder / "doc.txt"
    path.write_text("posix governed")
    path.chmod(mode)
    owner, group = _owner_and_group(path)
    record = only(iter_file_sources([path], acl_from="posix", default_tenant="acme"))
    names = {"owner": owner, "group": group, "everyone": "everyone"}
    # the owners of / and /tmp, when not the file's: no class of their own on it, so "other" decides
    above = {"user:root", "group:root"} - {owner, group} if "everyone" in readers else set()
    assert set(record.tags.acl_allow) == {names[r] for r in readers} | above
    assert record.tags.acl_deny == {names[r] for r in denied}
    assert (record.tags.tenant, record.tags.labels) == ("acme", frozenset())
    assert record.tags.classification is Classification.INTERNAL


def test_posix_takes_tenant_labels_and_level_from_the_manifest_but_not_its_acl(folder_with_manifest: Path) -> None:
    folder = folder_with_manifest
    path = folder / "finance/q1.md"
    path.chmod(0o600)
    record = only(iter_file_sources([path], manifest=folder / "manifest.yaml", acl_from="posix"))
    assert record.tags.acl_allow == [_owner_and_group(path)[0]]
    assert record.tags.labels == frozenset({"finance"})
    assert record.tags.classification is Classification.CONFIDENTIAL


def test_posix_without_a_tenant_is_rejected(ungoverned_folder: Path) -> None:
    outcomes = list(iter_file_sources([ungoverned_folder], acl_from="posix"))
    assert [type(o) for o in outcomes] == [Rejected, Rejected]
    assert all(o.reason.startswith("no tenant: pass --tenant or a manifest") for o in outcomes)


def test_an_unknown_acl_source_is_a_value_error(ungoverned_folder: Path) -> None:
    with pytest.raises(ValueError, match="acl_from") as caught:
        iter_file_sources([ungoverned_folder], acl_from="ntfs")
    assert isinstance(caught.value, InvalidRequestError), "a caller's bad argument is a ragwarden error"


# --- walking ---------------------------------------------------------------------------------


def test_an_unsupported_type_is_skipped_in_a_folder_and_rejected_when_named(folder_with_manifest: Path) -> None:
    folder = folder_with_manifest
    (folder / "finance/sheet.xlsx").write_bytes(b"PK\x03\x04")
    manifest = folder / "manifest.yaml"
    walked = by_source(iter_file_sources([folder], manifest=manifest))[str(folder / "finance/sheet.xlsx")]
    assert walked == Skipped(source=str(folder / "finance/sheet.xlsx"), reason="unsupported file type .xlsx")
    named = only(iter_file_sources([folder / "finance/sheet.xlsx"], manifest=manifest))
    assert isinstance(named, Rejected) and named.reason == "unsupported file type .xlsx"


def test_a_file_with_no_extension_is_text_only_when_its_bytes_are(tmp_path: Path, write_files) -> None:
    folder = write_files(tmp_path / "pkg", {"copyright": "Files: *\nCopyright: 2026", "blob": b"\x7fELF\x00\x01",
                                            "latin": b"caf\xe9 au lait", "ends-latin": b"caf\xe9"})  # fmt: skip
    got = by_source(iter_file_sources([folder], default_tenant="acme", manifest=None, acl_from="posix"))
    assert isinstance(got[str(folder / "copyright")], SourceRecord)
    for name in ("blob", "latin", "ends-latin"):
        assert got[str(folder / name)] == Skipped(source=str(folder / name), reason="not text (a file with no extension)")


def test_jsonl_records_found_in_a_folder_are_ingested_as_records(tmp_path: Path, write_files, make_record) -> None:
    folder = write_files(tmp_path / "mixed", {"records/batch.jsonl": json.dumps(make_record(id="r-1")) + "\n"
                                              + json.dumps(make_record(id="r-2")) + "\n"})  # fmt: skip
    got = list(iter_file_sources([folder]))
    assert [(o.doc_id, o.origin) for o in got] == [("r-1", f"{folder}/records/batch.jsonl:1 (id 'r-1')"),
                                                  ("r-2", f"{folder}/records/batch.jsonl:2 (id 'r-2')")]  # fmt: skip
    with gzip.open(folder / "records" / "MORE.JSONL.GZ", "wt", encoding="utf-8") as packed:
        packed.write(json.dumps(make_record(id="r-3")) + "\n")
    assert [o.doc_id for o in iter_file_sources([folder])] == ["r-3", "r-1", "r-2"]
    under_posix = list(iter_file_sources([folder], acl_from="posix", default_tenant="acme"))
    assert len(under_posix) == 2 and all(isinstance(o, Rejected) and "records carry their own ACL" in o.reason for o in under_posix)


def test_an_input_given_twice_is_read_once_and_the_manifest_given_as_input_is_no_document(
    folder_with_manifest: Path, tmp_path: Path, write_files, make_record
) -> None:
    folder = folder_with_manifest
    manifest = folder / "manifest.yaml"
    twice = list(dedupe_ids(iter_sources([folder / "guide.md", folder / "guide.md", folder / ".." / "docs" / "guide.md"],
                                         manifest=manifest, acl_from=None, default_tenant=None, max_bytes=1 << 20)))  # fmt: skip
    assert [o.doc_id for o in twice] == ["guide.md"] and all(isinstance(o, SourceRecord) for o in twice)
    records = write_files(tmp_path / "in", {"r.jsonl": json.dumps(make_record()) + "\n"}) / "r.jsonl"
    assert len(list(iter_sources([records, records], manifest=None, acl_from=None, default_tenant=None, max_bytes=1 << 20))) == 1
    assert list(iter_file_sources([manifest], manifest=manifest)) == []


def test_hidden_entries_sidecars_and_the_manifest_are_not_documents(folder_with_sidecar: Path) -> None:
    folder = folder_with_sidecar
    (folder / ".hidden.txt").write_text("x")
    (folder / ".git").mkdir()
    (folder / ".git/config.txt").write_text("x")
    sources = set(by_source(iter_file_sources([folder], manifest=folder / "manifest.yaml")))
    assert sources == {str(folder / p) for p in ("finance/q1.md", "finance/deep/q2.txt", "guide.md", "misc/notes.txt")}


def test_a_missing_path_is_rejected(tmp_path: Path) -> None:
    outcome = only(iter_file_sources([tmp_path / "nowhere"]))
    assert outcome == Rejected(source=str(tmp_path / "nowhere"), reason="no such file or folder")


def test_the_order_is_fixed_whatever_the_creation_order(tmp_path: Path, write_files: Callable[..., Path]) -> None:
    names = ["b.txt", "a/z.txt", "a/b.txt", "c/a.txt", "a.txt"]
    first = write_files(tmp_path / "one", {name: name for name in names})
    second = write_files(tmp_path / "two", {name: name for name in reversed(names)})

    def order(folder: Path) -> list[str]:
        return [o.doc_id for o in iter_file_sources([folder], acl_from="posix", default_tenant="acme")]

    assert order(first) == order(second) == order(first) == ["a.txt", "b.txt", "a/b.txt", "a/z.txt", "c/a.txt"]


@pytest.mark.parametrize(
    "glob, relative, matches",
    [
        ("*.txt", "a.txt", True),
        ("*.txt", "sub/a.txt", False),  # a glob matches the whole relative path, not a suffix
        ("sub/*.txt", "sub/deeper/a.txt", False),  # * stays inside one folder
        ("**/a.txt", "a.txt", True),
        ("sub/**/a.txt", "sub/x/y/a.txt", True),
        ("s?b/[ab].txt", "sub/b.txt", True),
        ("*.TXT", "a.txt", False),  # case-sensitive
    ],
)
def test_manifest_globs_match_the_path_relative_to_the_manifest(
    tmp_path: Path, write_files: Callable[..., Path], glob: str, relative: str, matches: bool
) -> None:
    rule = f"rules:\n  - glob: '{glob}'\n    tenant: acme\n    acl: {{allow: [everyone]}}\n    classification: public\n"
    folder = write_files(tmp_path, {"manifest.yaml": rule, relative: "text"})
    outcome = only(iter_file_sources([folder / relative], manifest=folder / "manifest.yaml"))
    assert isinstance(outcome, SourceRecord) is matches
