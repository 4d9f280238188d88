"""Fixtures for the governance tests: policies kept as data files, and real LanceDB tables.

Policy files live under ``tests/governance/policies/``: good ones describe a state (nested groups,
a deny overriding an allow, rules for ``everyone``...), bad ones one defect each, on a known line.
Tables are real LanceDB tables in ``tmp_path`` with the warehouse's ``chunks`` schema.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa
import pytest
from support.raw_tables import raw_table

from ragwarden.governance.compiler import SubjectView, compile_filter
from ragwarden.governance.policy import Policy
from ragwarden.governance.tags import GovernanceTags
from ragwarden.state import chunks_schema

POLICIES = Path(__file__).parent / "policies"
DIMENSION = 2


def chunk_row(chunk_id: str, tags: GovernanceTags, **overrides: Any) -> dict[str, Any]:
    """A ``chunks`` row carrying ``tags`` as the writer stores them; other columns are dummies."""
    row: dict[str, Any] = {
        "chunk_id": chunk_id,
        "doc_id": f"doc-{chunk_id}",
        "source_uri": f"file:///{chunk_id}.txt",
        "doc_version": "v1",
        "kind": "chunk",
        "position": 0,
        "text": f"text of {chunk_id}",
        "vector": [0.0] * DIMENSION,
        **tags.row_columns(),
        "parents": [],
        "ingest_run_id": "run-1",
        "embedding_model": "dummy",
        "created_at": None,
    }
    row.update(overrides)
    return row


def nullable_chunks_schema(dimension: int = DIMENSION) -> pa.Schema:
    """The ``chunks`` schema with every column (and every list element) nullable, so that rows
    with missing governance data can be stored and shown to fail closed."""
    fields = []
    for field in chunks_schema(dimension):
        kind = field.type
        if pa.types.is_list(kind):
            kind = pa.list_(pa.field("item", kind.value_type, nullable=True))
        fields.append(pa.field(field.name, kind, nullable=True))
    return pa.schema(fields)


def registry_of(tags: Iterable[GovernanceTags]) -> dict[str, list[str]]:
    """The clause registry (token -> principals) the writer keeps for rows with these tags."""
    registry: dict[str, list[str]] = {}
    for one in tags:
        registry.update(one.clauses_by_token)
    return registry


def visible_ids(
    table: Any, policy: Policy, subject: str, tenant: str, registry: Mapping[str, Sequence[str]]
) -> set[str]:
    """The chunk ids the compiled prefilter lets ``subject`` read in ``tenant``."""
    view = SubjectView.of(policy, subject, tenant)
    where = compile_filter(view, view.satisfied_clauses(registry))
    found = table.search().where(where, prefilter=True).select(["chunk_id"]).limit(None).to_arrow()
    return set(found["chunk_id"].to_pylist())


# The helpers above, as session fixtures (stateless, so hypothesis tests may use them too).


@pytest.fixture(scope="session")
def make_row() -> Callable[..., dict[str, Any]]:
    """Build a ``chunks`` row from tags: ``make_row(chunk_id, tags, **column_overrides)``."""
    return chunk_row


@pytest.fixture(scope="session")
def make_registry() -> Callable[[Iterable[GovernanceTags]], dict[str, list[str]]]:
    """Build the clause registry (token -> principals) for an iterable of tags."""
    return registry_of


@pytest.fixture(scope="session")
def filtered_ids() -> Callable[..., set[str]]:
    """Ids the compiled prefilter returns: ``filtered_ids(table, policy, subject, tenant, registry)``."""
    return visible_ids


@pytest.fixture(scope="session")
def nullable_schema() -> pa.Schema:
    """The ``chunks`` schema with every column and list element nullable."""
    return nullable_chunks_schema()


@pytest.fixture
def policy_path() -> Callable[[str], Path]:
    """The path of a policy fixture file by name."""

    def path(name: str) -> Path:
        found = POLICIES / name
        assert found.is_file(), f"no policy fixture {name}"
        return found

    return path


@pytest.fixture
def nested_groups_policy() -> Policy:
    """acme: alice -> fpa -> finance -> staff, bob -> hr -> staff, carol -> staff; globex: alice
    is an auditor. finance reads label finance and confidential rows, staff internal ones."""
    return Policy.from_file(POLICIES / "nested_groups.csv")


@pytest.fixture
def deny_overrides_policy() -> Policy:
    """finance may read pii but bob (a member) is denied it; contractors (inside finance) are
    denied payroll, which finance may read."""
    return Policy.from_file(POLICIES / "deny_overrides.csv")


@pytest.fixture
def everyone_rules_policy() -> Policy:
    """acme: everyone reads handbook and internal rows; salaries allowed to finance but denied to
    everyone; globex: everyone reads globex-news."""
    return Policy.from_file(POLICIES / "everyone_rules.csv")


@pytest.fixture
def quoted_values_policy() -> Policy:
    """Principals and labels holding commas (quoted), and rules with trailing comments."""
    return Policy.from_file(POLICIES / "quoted_values.csv")


@pytest.fixture
def classification_denies_policy() -> Policy:
    """acme: bob holds confidential through group:finance but is denied internal (line 9), so he
    is cleared for public only; carol's group is denied public (line 10): nothing; erin holds
    confidential; everyone is denied restricted (line 12), which overrides frank's grant of it."""
    return Policy.from_file(POLICIES / "classification_denies.csv")


@pytest.fixture
def nine_deep_chain_policy() -> Policy:
    """user:deep reaches group:level10 through 10 nested memberships; level10 reads label deep."""
    return Policy.from_file(POLICIES / "chain_9.csv")


@pytest.fixture
def make_chunks_table(tmp_path: Path) -> Callable[..., Any]:
    """Create a real LanceDB table from rows, with the ``chunks`` schema unless told otherwise."""
    counter = iter(range(1_000_000))

    def make(rows: Sequence[Mapping[str, Any]], schema: pa.Schema | None = None) -> Any:
        db = lancedb.connect(tmp_path / "warehouse")
        data = pa.Table.from_pylist(list(rows), schema=schema or chunks_schema(DIMENSION))
        return db.create_table(f"chunks_{next(counter)}", data)

    return make


@pytest.fixture(scope="session")
def demo_rows_by_person(demo_warehouse) -> dict[str, dict[str, bool]]:
    """For each acme demo person, every acme row id -> whether a big-k search returns it."""
    rows = [r["chunk_id"] for r in raw_table(demo_warehouse.store).search().where("tenant = 'acme'").limit(None).to_list()]
    result = {}
    for subject in ("user:alice", "user:bob", "user:carol", "user:dave"):
        found = {h.chunk_id for h in demo_warehouse.search("anything at all", subject=subject, tenant="acme", k=1000)}
        result[subject] = {row: row in found for row in rows}
    return result
