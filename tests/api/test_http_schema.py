"""The served OpenAPI schema tells the truth: schemathesis generates requests from it, valid and
invalid, against a real server on 127.0.0.1 over a fresh demo warehouse, and every answer must be
documented (status code, content type, body) and none may be a server error.

It runs twice: as user:admin (ingest, sync, forget and policy are granted, so the write routes do
real work) and as user:carol (derive, audit, and the widest view of the corpus). Policy installs go
to a warehouse of their own, so a generated policy cannot lock the other routes out mid-run.
SCHEMA_EXAMPLES=150 runs more examples per operation (the default, 25, keeps the run short).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from support.live_server import api_app, serving

from ragwarden.config import AuthSettings
from ragwarden.warehouse import Warehouse

REPO = Path(__file__).resolve().parents[2]
DEMO_CORPUS = REPO / "examples" / "demo" / "corpus.jsonl"


def no_server_error(ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """``not_a_server_error``, but for the one documented 503 a valid request may get: a search asking
    for a table version the warehouse has not reached (``min_version``, read-your-writes), to retry."""
    asked = case.body.get("min_version") if isinstance(case.body, dict) else None
    if response.status_code == 503 and case.path == "/v1/search" and asked:
        error = json.loads(response.content)["error"]
        assert error["code"] == "warehouse_unavailable" and "older than the" in error["message"], error
        return
    not_a_server_error(ctx, response, case)


CHECKS = [
    no_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]
# 413 rejects invalid data too: a policy text over its maxLength (10^6 characters) is also a body
# over the service's 1 MiB limit, and the limit answers before the schema is checked.
CONFIG = schemathesis.Config.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": [400, 401, 403, 404, 405, 406, 409, 413, 415, 422]}}}
)
BOUNDED = settings(
    max_examples=int(os.environ.get("SCHEMA_EXAMPLES", "25")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, copy_of: Callable[[str, Path], Warehouse],
           auth_settings: AuthSettings) -> Iterator[dict[str, str]]:  # fmt: skip
    """Base URLs: "main" serves a fresh copy of the demo corpus, "policy" a warehouse for policy installs."""
    main = copy_of("demo", tmp_path_factory.mktemp("schema-main") / "warehouse")
    policy = copy_of("demo-policy", tmp_path_factory.mktemp("schema-policy") / "warehouse")
    with serving(api_app(main, auth_settings)) as main_url, serving(api_app(policy, auth_settings)) as policy_url:
        yield {"main": main_url, "policy": policy_url}


@pytest.fixture(scope="module")
def api_schema(served: dict[str, str]) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{served['main']}/openapi.json", config=CONFIG)


# The pytest integration of schemathesis (``schemathesis.pytest.from_fixture``) does not run under
# pytest 9.2 (it sets ``Node._nodeid``, which is gone), so each operation is its own Hypothesis test.
OPERATIONS = [
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/v1/whoami"),
    ("POST", "/v1/search"),
    ("GET", "/v1/chunks/{chunk_id}"),
    ("GET", "/v1/chunks/{chunk_id}/explain"),
    ("POST", "/v1/ingest"),
    ("POST", "/v1/derive"),
    ("POST", "/v1/sync"),
    ("POST", "/v1/forget"),
    ("GET", "/v1/lineage/{item_id}"),
    ("GET", "/v1/audit/receipts"),
    ("GET", "/v1/audit/verify"),
    ("GET", "/v1/audit/access-review"),
    ("GET", "/v1/audit/inventory"),
    ("GET", "/v1/audit/readers"),
    ("GET", "/v1/audit/trends"),
    ("GET", "/v1/audit/vocabulary"),
    ("PUT", "/v1/policy"),
]
USERS = ["admin", "carol"]  # admin: ingest, sync, forget, policy; carol: derive, audit, the widest view


def test_the_operations_fuzzed_are_every_operation_the_schema_documents(api_schema):
    documented = {(method.upper(), path) for path, item in api_schema.raw_schema["paths"].items() for method in item}
    assert documented == set(OPERATIONS)


PARAMETERLESS = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/v1/whoami"), ("GET", "/v1/audit/verify"),
                 ("GET", "/v1/audit/vocabulary")}
CASES = [
    pytest.param(method, path, user, mode, id=f"{method} {path} as {user}, {mode}")
    for method, path in OPERATIONS
    for user in USERS
    for mode in schemathesis.GenerationMode
    if not (mode.is_negative and (method, path) in PARAMETERLESS)  # nothing there to make invalid
]


@pytest.mark.parametrize(("method", "path", "user", "mode"), CASES)
def test_every_answer_is_documented_and_none_is_a_server_error(
    api_schema, served: dict[str, str], mint: Callable[..., str], method: str, path: str, user: str, mode: str
) -> None:
    operation = api_schema[path][method]
    base_url = served["policy"] if path == "/v1/policy" else served["main"]
    # the credential is fixed, so that no negative case "removes" it only to have it added back
    headers = {"Authorization": f"Bearer {mint(user)}"}

    @BOUNDED
    @given(case=operation.as_strategy(generation_mode=mode, headers=headers))
    def answers_conform(case: schemathesis.Case) -> None:
        case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS, timeout=60)

    answers_conform()
