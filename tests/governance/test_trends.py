"""Trends are counted from the receipts alone: searches and refusals on the day they happened,
the labels the answers carried, the documents returned most; a tenant sees only its own."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from ragwarden.errors import InvalidRequestError, NotFoundError
from ragwarden.governance.trends import since
from ragwarden.warehouse import Warehouse


def test_todays_searches_refusals_labels_and_documents_are_counted_from_the_receipts(small_warehouse: Warehouse):
    wh = small_warehouse
    before = wh.trends(caller="user:carol", tenant="acme", days=7)
    for _ in range(3):
        wh.search("quarterly budget review", subject="user:alice", tenant="acme", k=2)
    with pytest.raises(NotFoundError):
        wh.get_chunk(wh.store.chunks.chunk_ids_of("acme-budget", "acme")[0], subject="user:dave", tenant="acme")
    wh.search("widget warehouse", subject="user:hank", tenant="globex", k=2)  # another tenant's
    after = wh.trends(caller="user:carol", tenant="acme", days=7)
    assert after.days[-1] == datetime.now(timezone.utc).date().isoformat() and len(after.days) == 7
    assert after.searches[-1] - before.searches[-1] == 3
    assert after.refusals[-1] - before.refusals[-1] == 1
    assert after.labels.get("finance", 0) - before.labels.get("finance", 0) == 3
    assert after.label_days["finance"][-1] == after.labels["finance"]
    assert after.top_documents["acme-budget"] - before.top_documents.get("acme-budget", 0) == 3
    assert "globex-plan" not in after.top_documents


def test_days_start_at_utc_midnight_and_are_bounded():
    now = datetime(2026, 3, 10, 15, 30, tzinfo=timezone.utc)
    assert since(1, now) == datetime(2026, 3, 10, tzinfo=timezone.utc)
    assert since(30, now) == datetime(2026, 3, 10, tzinfo=timezone.utc) - timedelta(days=29)


@pytest.mark.parametrize("days", [0, 367, True, "30"])
def test_a_window_outside_a_year_is_refused(small_warehouse: Warehouse, days):
    with pytest.raises(InvalidRequestError, match="days must be 1 to 366"):
        small_warehouse.trends(caller="user:carol", tenant="acme", days=days)
