"""A policy that does not load: refused at start-up naming its line; while serving, the last good
policy stays in force, the problem is reported, and nothing ever falls open."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from click.testing import CliRunner
from support.raw_tables import raw_table

from ragwarden.api.cli import main
from ragwarden.api.http import create_app
from ragwarden.config import Settings
from ragwarden.errors import InvalidPolicyError
from ragwarden.policies import policy_file
from ragwarden.state.schema import POLICIES_SCHEMA
from ragwarden.warehouse import Warehouse

BAD_POLICY = "g, user:alice, group:fpa, acme\np, group:finance, acme, label:finance, read, maybe\n"
QUERY = "quarterly budget review forecasts cafeteria menu"


def _docs(url: str, headers: dict[str, str]) -> set[str]:
    response = httpx.post(f"{url}/v1/search", json={"query": QUERY, "k": 10}, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return {hit["doc_id"] for hit in response.json()["hits"]}


def _readiness(url: str) -> dict:
    response = httpx.get(f"{url}/readyz", timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _store_policy_text(warehouse: Warehouse, text: str) -> None:
    """A policy row that never went through validation (a damaged or hand-edited table)."""
    seq = raw_table(warehouse.store, "policies").count_rows() + 1  # the next install in commit order
    row = {"seq": seq, "version": "damaged", "source": "hand edit", "text": text, "installed_at": datetime.now(UTC)}
    raw_table(warehouse.store, "policies").add(pa.Table.from_pylist([row], schema=POLICIES_SCHEMA))


def test_serve_refuses_a_policy_file_with_a_bad_line_naming_it(small_warehouse: Warehouse, tmp_path: Path):
    bad = tmp_path / "bad.csv"
    bad.write_text(BAD_POLICY, encoding="utf-8")
    result = CliRunner().invoke(main, ["serve", "--warehouse", small_warehouse.uri, "--policy", str(bad), "--port", "1"])
    assert result.exit_code != 0
    assert f"{bad}:2" in result.output and "maybe" in result.output


def test_a_stored_policy_that_does_not_load_is_refused_before_serving(small_warehouse: Warehouse):
    _store_policy_text(small_warehouse, BAD_POLICY)
    reopened = Warehouse(Settings(warehouse=small_warehouse.uri), embedder=small_warehouse.embedder)
    with pytest.raises(InvalidPolicyError, match=r"policy damaged\):2: .*maybe"):
        create_app(Settings(warehouse=small_warehouse.uri), warehouse=reopened, with_mcp=False)


def test_a_policy_file_turned_bad_while_serving_leaves_the_last_good_one_in_force(
    small_warehouse: Warehouse, tmp_path: Path, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    file = tmp_path / "policy.csv"
    file.write_text(policy_file("demo.csv").read_text(encoding="utf-8"), encoding="utf-8")
    warehouse = Warehouse(Settings(warehouse=small_warehouse.uri, policy=str(file)), embedder=small_warehouse.embedder)
    url = serve(warehouse)
    before = {user: _docs(url, bearer(user)) for user in ("alice", "dave")}
    assert "acme-budget" in before["alice"] and "acme-budget" not in before["dave"]

    file.write_text(BAD_POLICY, encoding="utf-8")
    assert {user: _docs(url, bearer(user)) for user in ("alice", "dave")} == before
    problem = _readiness(url)["policy_problem"]
    assert f"{file}:2" in problem and "still serving policy" in problem

    file.unlink()  # gone altogether: still the last good policy, never none, never open
    assert {user: _docs(url, bearer(user)) for user in ("alice", "dave")} == before
    assert "does not exist" in _readiness(url)["policy_problem"]

    narrower = policy_file("demo.csv").read_text(encoding="utf-8").replace("g, user:alice, group:fpa, acme\n", "")
    file.write_text(narrower, encoding="utf-8")  # a good edit takes effect at the next request
    assert "acme-budget" not in _docs(url, bearer("alice"))
    assert _readiness(url)["policy_problem"] is None


def test_a_damaged_installed_policy_leaves_the_last_good_one_in_force(
    small_warehouse: Warehouse, serve: Callable[..., str], bearer: Callable[..., dict[str, str]]
):
    url = serve(small_warehouse)
    before = {user: _docs(url, bearer(user)) for user in ("alice", "dave", "admin")}
    _store_policy_text(small_warehouse, BAD_POLICY)
    assert {user: _docs(url, bearer(user)) for user in ("alice", "dave", "admin")} == before
    problem = _readiness(url)["policy_problem"]
    assert ":2 is not a valid rule" in problem and "still serving policy" in problem
    assert "maybe" not in problem and "finance" not in problem, "the probe, open to anyone, shows the policy's content"
    assert "maybe" in small_warehouse.policy_problem  # the full reason is the operator's
    _store_policy_text(small_warehouse, "")  # loads, and grants nothing: in force at once
    assert _docs(url, bearer("alice")) == {"acme-memo"}  # what "everyone" may read, no more
    assert _readiness(url)["policy_problem"] is None
