"""JSONL records: what is accepted, what is refused with which reason, what is skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragwarden.governance.tags import Classification
from ragwarden.ingest.records import Rejected, Skipped, SourceRecord, read_jsonl


def write_jsonl(path: Path, *records: object) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_valid_record_carries_its_tags(tmp_path, make_record):
    (outcome,) = read_jsonl(write_jsonl(tmp_path / "a.jsonl", make_record()))
    assert isinstance(outcome, SourceRecord)
    assert outcome.tags.tenant == "acme"
    assert outcome.tags.acl_allow == ["group:finance"]
    assert outcome.tags.labels == frozenset({"finance"})
    assert outcome.tags.classification is Classification.INTERNAL


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"acl": None}, "no ACL"),
        ({"acl": {"allow": []}}, "acl.allow is empty"),
        ({"acl": {"allow": ["alice"]}}, "not of the form user:NAME"),
        ({"acl": {"allow": ["user:alice"], "deny": ["role:x"]}}, "'role:x' is not of the form"),
        ({"acl": {"allow": ["user:" + "a" * 300]}}, "longer than 256"),
        ({"acl": {"allow": ["user:al\u0000ice"]}}, "non-printable"),
        ({"labels": ["pii\n"]}, "non-printable"),
        ({"labels": ["x" * 257]}, "longer than 256"),
        ({"classification": "secret"}, "unknown classification 'secret'"),
        ({"classification": None}, "no classification"),
        ({"tenant": None}, "no tenant"),
        ({"id": None}, "no id; every source needs an id"),
        ({"id": 7}, "id 7 must be printable"),
        ({"text": 42}, "text must be a string"),
        ({"acls": {"allow": ["user:a"]}}, "unknown fields ['acls']"),
    ],
)
def test_bad_record_is_rejected_naming_line_and_reason(tmp_path, make_record, overrides, reason):
    path = write_jsonl(tmp_path / "bad.jsonl", make_record(), make_record(**{"id": "doc-2", **overrides}))
    good, bad = read_jsonl(path)
    assert isinstance(good, SourceRecord)
    assert isinstance(bad, Rejected)
    assert bad.source.startswith(f"{path}:2")
    assert reason in bad.reason


def test_every_problem_of_a_record_is_reported_at_once(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", {"text": "x", "labels": ["pii\n"], "acl": {"allow": ["alice"]},
                                                  "metadata": [1], "vector": [0.0]})  # fmt: skip
    (bad,) = read_jsonl(path)
    assert isinstance(bad, Rejected)
    for said in ("no id", "no tenant", "no classification", "metadata must be an object", "a vector needs model",
                 "'alice' is not of the form", "non-printable"):  # fmt: skip
        assert said in bad.reason, bad.reason


def test_invalid_utf8_line_is_rejected_with_its_byte_offset(tmp_path, make_record):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(make_record()).encode() + b"\n" + b'{"id": "caf\xe9"}\n')
    good, bad = read_jsonl(path)
    assert isinstance(good, SourceRecord)
    assert isinstance(bad, Rejected) and bad.source == f"{path}:2"
    assert "invalid UTF-8 at byte 11" in bad.reason


def test_malformed_json_and_non_objects_are_rejected(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"id": \n[1, 2]\n', encoding="utf-8")
    first, second = read_jsonl(path)
    assert isinstance(first, Rejected) and "not valid JSON" in first.reason
    assert isinstance(second, Rejected) and "must be a JSON object, not list" in second.reason


def test_empty_text_is_skipped_not_rejected(tmp_path, make_record):
    (outcome,) = read_jsonl(write_jsonl(tmp_path / "e.jsonl", make_record(text="  \n ")))
    assert isinstance(outcome, Skipped)
    assert outcome.reason == "empty text"


def test_version_changes_with_text_only(make_record, tmp_path):
    a, b, c = read_jsonl(
        write_jsonl(
            tmp_path / "v.jsonl",
            make_record(),
            make_record(id="doc-2", labels=["other"]),
            make_record(id="doc-3", text="Different text."),
        )
    )
    assert a.version == b.version != c.version
    assert a.tags.fingerprint() != b.tags.fingerprint()
