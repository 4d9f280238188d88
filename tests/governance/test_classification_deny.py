"""A deny on a classification, end to end: a real warehouse, real ingest, every search mode.

bob holds confidential through group:finance, and internal is denied to him (DESIGN §4, point 5:
a deny on a level caps the clearance strictly below it), so of four documents, one per level,
every search he makes returns the public one only, and a direct read of the others finds nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.errors import NotFoundError
from ragwarden.governance.tags import Classification
from ragwarden.retrieval.search import MODES
from ragwarden.warehouse import Warehouse

POLICY = Path(__file__).parent / "policies" / "classification_denies.csv"


@pytest.fixture
def leveled_warehouse(tmp_path: Path, embedder: Embedder) -> Warehouse:
    """The classification_denies policy installed, and one quarterly report at each level, all
    allowed to group:staff (which bob, carol and erin hold)."""
    warehouse = Warehouse(Settings(warehouse=str(tmp_path / "warehouse")), embedder=embedder)
    warehouse.install_policy(POLICY)
    report = warehouse.ingest_records(
        {
            "id": f"report-{level.label}",
            "text": f"The quarterly report, {level.label} edition: revenue, costs and the outlook.",
            "tenant": "acme",
            "acl": {"allow": ["group:staff"], "deny": []},
            "labels": [],
            "classification": level.label,
            "uri": f"test://report-{level.label}",
        }
        for level in Classification
    )
    assert report.documents == len(Classification), report.summary()
    return warehouse


@pytest.mark.parametrize("mode", MODES)
def test_bob_with_confidential_through_a_group_but_internal_denied_sees_only_public_rows(
    leveled_warehouse: Warehouse, mode: str
) -> None:
    def levels(subject: str) -> set[str]:
        hits = leveled_warehouse.search("quarterly report", subject=subject, tenant="acme", k=10, mode=mode)
        return {hit.classification.label for hit in hits}

    assert levels("user:bob") == {"public"}
    assert levels("user:carol") == set()  # public denied to her group: nothing at all
    assert levels("user:erin") == {"public", "internal", "confidential"}  # the control: same group, no deny


def test_bob_cannot_read_a_row_above_his_capped_clearance_by_id(leveled_warehouse: Warehouse) -> None:
    internal = leveled_warehouse.store.chunks.chunk_ids_of("report-internal")[0]
    public = leveled_warehouse.store.chunks.chunk_ids_of("report-public")[0]
    assert leveled_warehouse.get_chunk(public, subject="user:bob", tenant="acme").chunk_id == public
    with pytest.raises(NotFoundError):
        leveled_warehouse.get_chunk(internal, subject="user:bob", tenant="acme")
    assert not leveled_warehouse.explain(internal, subject="user:bob", tenant="acme").allowed
