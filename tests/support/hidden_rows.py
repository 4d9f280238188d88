"""Worlds that differ only by rows one caller cannot read, for the rule of DESIGN §4: a search does no
work over rows its caller cannot read, so neither its answer nor its counted work may change.

Every world holds the same rows user:dave (an intern: group staff, clearance internal, no labels)
may read, and the same salary sheets he may not (group hr, label comp, restricted). ``with_hidden``
adds more sheets he may not read, written to match every query and filter the tests send: the
same words, the same metadata values, document ids in the same ranges. ``with_visible`` adds the
same rows readable by him: the positive control, whose counted work must change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse

READER = "user:dave"
TENANT = "acme"
QUERIES = ("salary bands review for ops staff", "remote work and ops salary")
FILTERS: tuple[dict[str, Any] | None, ...] = (
    None,
    {"dept": "ops"},
    {"metadata.dept": {"$eq": "ops"}},
    {"salary": {"$gt": 50000}},
    {"salary": {"$gte": 51000, "$lte": 200000}},
    {"salary": {"$lt": 190000}},
    {"year": {"$in": [2021, 2022]}},
    {"title": {"$nin": ["band-0"]}},
    {"title": {"$ne": "band-1"}},
    {"remote": False},
    {"$or": [{"dept": "ops"}, {"year": 2022}]},
    {"$and": [{"doc_id": {"$gte": "staff-"}}, {"kind": "chunk"}]},
    {"source_uri": {"$gt": "test://staff/"}},
    {"created_at": {"$gte": "2000-01-01T00:00:00Z"}},
)
"""Every operator, on metadata of every type and on each column a filter may name."""
VISIBLE_ACL = {"acl": {"allow": ["group:staff"], "deny": []}, "labels": [], "classification": "internal"}
HIDDEN_ACL = {"acl": {"allow": ["group:hr"], "deny": []}, "labels": ["comp"], "classification": "restricted"}


def _staff_note(i: int, acl: dict[str, Any], prefix: str = "staff") -> dict[str, Any]:
    return {
        "id": f"{prefix}-{i:02d}", "tenant": TENANT, "uri": f"test://staff/{prefix}-{i:02d}", **acl,
        "text": f"Salary bands review for {'ops' if i % 2 else 'sales'} staff, note {i}: band-{i % 4} at {50000 + 1000 * i}; "
                f"remote work {'allowed' if i % 3 else 'not allowed'}.",
        "metadata": {"salary": 50000 + 1000 * i, "dept": "ops" if i % 2 else "sales", "year": 2020 + i % 4,
                     "title": f"band-{i % 4}", "remote": bool(i % 3)},
    }  # fmt: skip


def _salary_sheet(i: int, acl: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A row matching every query and filter the tests send (``FILTERS``)."""
    return {
        "id": f"{prefix}-{i:02d}", "tenant": TENANT, "uri": f"test://staff/{prefix}-{i:02d}", **acl,
        "text": f"Salary bands review for ops staff: band-3 at 187000, remote work and ops salary, sheet {i}.",
        "metadata": {"salary": 187000, "dept": "ops", "year": 2022, "title": "band-3", "remote": False},
    }  # fmt: skip


BASE = [_staff_note(i, VISIBLE_ACL) for i in range(12)] + [_salary_sheet(i, HIDDEN_ACL, "staff-sheet") for i in range(4)]


def hidden_sheet_ids(count: int) -> list[str]:
    """The document ids of the sheets ``with_hidden`` adds."""
    return [_salary_sheet(i, HIDDEN_ACL, "staff-zz-hidden")["id"] for i in range(count)]


def world(folder: Path, embedder: Embedder, *, hidden: int = 0, visible: int = 0) -> Warehouse:
    """The base rows, ``hidden`` more sheets the reader may not read and ``visible`` he may, written
    in one ingest (so every world's table stands at the same version)."""
    warehouse = Warehouse(Settings(warehouse=str(folder / "warehouse")), embedder=embedder)
    warehouse.install_policy(policy_file("demo.csv"))
    records = [*BASE, *(_salary_sheet(i, HIDDEN_ACL, "staff-zz-hidden") for i in range(hidden)),
               *(_salary_sheet(i, VISIBLE_ACL, "staff-zz-shown") for i in range(visible))]  # fmt: skip
    report = warehouse.ingest_records(records)
    assert report.ok, report.rejected
    return warehouse
