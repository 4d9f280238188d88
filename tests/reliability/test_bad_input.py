"""Bad input is refused with a clear error and nothing written: fuzzed parsers raise only their own
error (or reject the record), hostile strings stay data, limits hold, paths never escape."""

from __future__ import annotations

import gzip
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwarden.api_keys import api_keys_at
from ragwarden.config import AuthSettings
from ragwarden.credentials import Authenticator
from ragwarden.errors import AuthenticationError, InvalidRequestError, InvalidSourceError, PolicyError
from ragwarden.governance.policy import Policy
from ragwarden.ingest.files import _load_manifest
from ragwarden.ingest.records import Rejected, Skipped, SourceRecord, read_jsonl
from ragwarden.warehouse import Warehouse

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POLICY_ALPHABET = st.sampled_from(list("gp, :\n\r\t\"'\\%_#-*.acmeuserlabl0\x00é\u200bＡ"))
HOSTILE = ["' OR '1'='1", "a\\' OR 1=1 --", "x%", "100%_", "line\nbreak", "nul\x00byte", "ａｌｉｃｅ", "alice\u200b",
           "\"quoted\"", "back\\slash", "x" * 5000]  # fmt: skip


# ---------------------------------------------------------------- fuzzed parsers


@FUZZ
@given(st.text(POLICY_ALPHABET, max_size=400) | st.text(max_size=400))
def test_any_policy_text_loads_or_is_refused_with_a_policy_error(text: str):
    try:
        policy = Policy.from_text(text, source="fuzz.csv")
    except PolicyError as exc:
        assert str(exc).startswith("fuzz.csv")
    else:
        assert Policy.from_text(policy.text, source="again").rules == policy.rules  # it round-trips


@FUZZ
@given(st.binary(max_size=2000) | st.text(max_size=600).map(lambda t: t.encode("utf-8", "surrogatepass")),
       st.sampled_from([".jsonl", ".jsonl.gz"]))  # fmt: skip
def test_any_bytes_in_a_jsonl_file_become_records_or_named_rejections(content: bytes, suffix: str):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"input{suffix}"
        path.write_bytes(content)
        outcomes = list(read_jsonl(path, max_line_bytes=500))
    for outcome in outcomes:
        assert isinstance(outcome, SourceRecord | Skipped | Rejected)
        if isinstance(outcome, Rejected):
            assert outcome.source.startswith(str(path) + ":") and outcome.reason


@FUZZ
@given(st.text(max_size=400))
def test_any_manifest_text_loads_or_is_refused_naming_the_manifest(text: str):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "manifest.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            _load_manifest(path)
        except InvalidSourceError as exc:
            assert str(path) in str(exc)


@pytest.fixture(scope="module")
def authenticator(tmp_path_factory: pytest.TempPathFactory) -> Authenticator:
    keys = api_keys_at(str(tmp_path_factory.mktemp("keys")))
    return Authenticator(AuthSettings(jwt_secret=b"s" * 32, issuer="https://idp.test", audience="ragwarden"), keys)


@FUZZ
@given(st.text(max_size=300) | st.builds(lambda h, p, s: f"{h}.{p}.{s}", st.text(max_size=60), st.text(max_size=60),
                                         st.text(max_size=60)))  # fmt: skip
def test_any_credential_verifies_or_is_refused_as_unauthenticated(authenticator: Authenticator, credential: str):
    with pytest.raises(AuthenticationError):
        authenticator.from_header(f"Bearer {credential}")


# ---------------------------------------------------------------- limits and malformed files


def test_a_jsonl_line_over_the_limit_is_refused_and_the_next_line_still_read(tmp_path: Path, make_record):
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps(make_record(text="x" * 5000)) + "\n" + json.dumps(make_record(id="small")) + "\n")
    first, second = list(read_jsonl(path, max_line_bytes=1000))
    assert isinstance(first, Rejected) and "over the limit of 1000 bytes" in first.reason and first.source.endswith(":1")
    assert isinstance(second, SourceRecord) and second.doc_id == "small"


def test_a_damaged_gzip_refuses_the_rest_of_the_file_naming_where(tmp_path: Path, make_record):
    whole = gzip.compress("".join(json.dumps(make_record(id=f"d{i}")) + "\n" for i in range(200)).encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    outcomes = list(read_jsonl(path))
    assert all(isinstance(o, SourceRecord) for o in outcomes[:-1])
    assert isinstance(outcomes[-1], Rejected) and "cannot be read from here on" in outcomes[-1].reason


@pytest.mark.parametrize("line", ["[" * 100_000, '{"id": ' + "9" * 10_000 + "}"], ids=["deep nesting", "huge number"])
def test_json_that_breaks_the_parser_is_a_rejected_record(tmp_path: Path, line: str):
    path = tmp_path / "odd.jsonl"
    path.write_text(line + "\n")
    (outcome,) = read_jsonl(path)
    assert isinstance(outcome, Rejected) and "not valid JSON" in outcome.reason


# ---------------------------------------------------------------- requests


@pytest.mark.parametrize("vector", [[float("nan")] * 384, [float("inf")] * 384, [0.1] * 383, [[0.1] * 384]],
                         ids=["nan", "inf", "short", "nested"])  # fmt: skip
def test_a_supplied_vector_that_is_not_finite_or_not_the_models_shape_is_refused(demo_warehouse: Warehouse, vector):
    with pytest.raises(InvalidRequestError, match="vector"):
        demo_warehouse.search("budget", subject="user:alice", tenant="acme", vector=np.array(vector, dtype=np.float32))


@pytest.mark.parametrize("body", [{"query": "budget", "k": -1}, {"query": "budget", "k": 10**18},
                                  {"query": "budget", "k": 0}, {"query": "x" * (1024 * 1024)}, {"query": ""}])  # fmt: skip
def test_out_of_range_search_requests_are_refused_naming_the_field(demo_service_url: str, bearer, body: dict):
    response = httpx.post(f"{demo_service_url}/v1/search", json=body, headers=bearer("alice"), timeout=60)
    assert response.status_code in (413, 422), response.text
    error = response.json()["error"]
    assert error["code"] in ("invalid_request", "payload_too_large")
    assert ("k" in error["message"] or "query" in error["message"] or "limit" in error["message"])


def _search_as(url: str, token: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/search", json={"query": "salary budget plans"},
                      headers={"Authorization": f"Bearer {token}"}, timeout=60)  # fmt: skip


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_identity_claims_are_refused_or_see_what_a_stranger_sees(demo_service_url: str, mint, value: str):
    stranger = {h["chunk_id"] for h in _search_as(demo_service_url, mint("stranger-without-roles")).json()["hits"]}
    as_subject = _search_as(demo_service_url, mint(value))
    assert as_subject.status_code in (200, 401), as_subject.text
    if as_subject.status_code == 200:
        assert {h["chunk_id"] for h in as_subject.json()["hits"]} == stranger
    as_tenant = _search_as(demo_service_url, mint("alice", tenant=value))
    assert as_tenant.status_code in (200, 401), as_tenant.text
    if as_tenant.status_code == 200:
        assert as_tenant.json()["hits"] == []  # no tenant of that name: nothing


# ---------------------------------------------------------------- paths


@pytest.mark.parametrize("doc_id", ["../../outside", "/etc/passwd", "..\\..\\win", "a/../../b", "%2e%2e%2fup"])
def test_an_id_or_uri_that_looks_like_a_path_stays_an_opaque_string(
    demo_policy_warehouse: Warehouse, make_record, tmp_path: Path, serve: Callable[..., str], bearer, doc_id: str
):
    before = {p for p in tmp_path.rglob("*")}
    record = make_record(id=doc_id, uri="file:///../../etc/passwd", acl={"allow": ["everyone"]}, labels=[],
                         classification="public")  # fmt: skip
    report = demo_policy_warehouse.ingest_records([record])
    assert report.ok, report.rejected
    created = {p for p in tmp_path.rglob("*")} - before
    assert all(Path(demo_policy_warehouse.uri) in p.parents for p in created)  # nothing written outside
    (chunk_id,) = demo_policy_warehouse.store.chunks.chunk_ids_of(doc_id)
    url = serve(demo_policy_warehouse)
    response = httpx.get(f"{url}/v1/chunks/{chunk_id}", headers=bearer("dave"), timeout=60)
    assert response.status_code == 200 and response.json()["doc_id"] == doc_id
    hits = demo_policy_warehouse.search("budget review", subject="user:dave", tenant="acme")
    assert [h.doc_id for h in hits] == [doc_id] and hits[0].source_uri == "file:///../../etc/passwd"
