"""What a tenant's receipts say over time: searches and refusals a day, the labels its answers
carried (in all, and a day for the most returned), and the documents returned most. Counted from
the receipts alone, so a trend is as tamper-evident as the log it is read from."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Any

from .audit import StoredReceipt

TOP = 10
"""How many labels and documents a trend names (the most returned first)."""
RETURNING = ("search", "get")
"""The operations whose receipts name what they returned."""


@dataclass(frozen=True, kw_only=True)
class Trends:
    """One tenant's last ``len(days)`` days, oldest first."""

    tenant: str
    days: tuple[str, ...]
    searches: tuple[int, ...]
    refusals: tuple[int, ...]
    labels: Mapping[str, int]
    label_days: Mapping[str, tuple[int, ...]]
    top_documents: Mapping[str, int]

    def as_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "days": list(self.days), "searches": list(self.searches),
                "refusals": list(self.refusals), "labels": dict(self.labels),
                "label_days": {k: list(v) for k, v in self.label_days.items()},
                "top_documents": dict(self.top_documents)}  # fmt: skip


def since(days: int, now: datetime | None = None) -> datetime:
    """The start (UTC midnight) of the first of the last ``days`` days."""
    today = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).date()
    first = today - timedelta(days=days - 1)
    return datetime(first.year, first.month, first.day, tzinfo=timezone.utc)


def trends(receipts: Iterable[StoredReceipt], *, tenant: str, days: int, now: datetime | None = None) -> Trends:
    """The trends of ``receipts`` (one tenant's, from ``since(days)`` on) over ``days`` days."""
    start = since(days, now).date()
    calendar = [start + timedelta(days=n) for n in range(days)]
    index = {day: n for n, day in enumerate(calendar)}
    searches, refusals = [0] * days, [0] * days
    labels: Counter[str] = Counter()
    by_day: dict[str, list[int]] = {}
    documents: Counter[str] = Counter()
    for receipt in receipts:
        n = index.get(_day(receipt))
        if n is None:
            continue
        if not receipt.allowed:
            refusals[n] += 1
            continue
        if receipt.operation not in RETURNING:
            continue
        searches[n] += receipt.operation == "search"
        returned = [label for chunk_labels in receipt.chunk_labels.values() for label in chunk_labels]
        labels.update(returned)
        for label, count in Counter(returned).items():
            by_day.setdefault(label, [0] * days)[n] += count
        documents.update(set(receipt.doc_ids))
    top = [label for label, _ in labels.most_common(TOP)]
    return Trends(
        tenant=tenant,
        days=tuple(day.isoformat() for day in calendar),
        searches=tuple(searches),
        refusals=tuple(refusals),
        labels=dict(labels.most_common(TOP)),
        label_days={label: tuple(by_day[label]) for label in top},
        top_documents=dict(documents.most_common(TOP)),
    )


def _day(receipt: StoredReceipt) -> date:
    return receipt.time.astimezone(timezone.utc).date()
