"""Collapsing an answer: at most so many chunks of one document, and one copy of a text.

Why: a corpus holds the same licence, disclaimer or signature in many documents, and a long
document's neighbouring chunks say nearly the same thing; either can fill the top-k with one
answer said k times. A collapse keeps a hit only if the hits ranked above it leave room for it
(fewer than ``per_doc`` of its document, no byte-identical text), so whether a hit is kept depends
on the hits above it alone: collapsing the best n ranked rows gives the first hits of collapsing
them all, and the search ranks deeper until k are kept or no row is left.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from ..errors import InvalidRequestError
from .hits import Hit

GroupBy = Literal["doc"]
GROUP_BYS: tuple[str, ...] = ("doc",)
MAX_DEPTH = 10_000
DEPTH_PER_K = 64
"""A collapsing search ranks at most ``DEPTH_PER_K`` * k rows (and never more than ``MAX_DEPTH``), so
one request costs a few searches at most; past that, fewer than k hits may be returned."""


@dataclass(frozen=True, kw_only=True)
class Collapse:
    """``group_by="doc"``: at most ``per_group`` hits of one document. ``distinct``: a text that
    is byte for byte that of a better hit is left out. The default collapses nothing."""

    group_by: GroupBy | None = None
    per_group: int = 1
    distinct: bool = False

    def __post_init__(self) -> None:
        if self.group_by is not None and self.group_by not in GROUP_BYS:
            raise InvalidRequestError(f"group_by {self.group_by!r} is not one of {', '.join(GROUP_BYS)} (or none)")
        if isinstance(self.per_group, bool) or not isinstance(self.per_group, int) or self.per_group < 1:
            raise InvalidRequestError(f"per_group must be a whole number of at least 1, got {self.per_group!r}")
        if not isinstance(self.distinct, bool):
            raise InvalidRequestError(f"distinct must be true or false, got {self.distinct!r}")

    @property
    def active(self) -> bool:
        return self.group_by is not None or self.distinct

    def describe(self) -> str:
        """How a receipt's reason names it ("" when it collapses nothing)."""
        parts = [f"at most {self.per_group} per document"] if self.group_by == "doc" else []
        return ", ".join([*parts, "distinct texts"] if self.distinct else parts)

    def apply(self, ranked: Iterable[Hit], k: int) -> list[Hit]:
        """The first ``k`` of ``ranked`` (best first) that the hits kept before them leave room for."""
        per_doc: Counter[str] = Counter()
        texts: set[str] = set()
        kept: list[Hit] = []
        for hit in ranked:
            if len(kept) == k:
                break
            if self.group_by == "doc" and per_doc[hit.doc_id] >= self.per_group:
                continue
            if self.distinct and hit.text in texts:
                continue
            per_doc[hit.doc_id] += 1
            texts.add(hit.text)
            kept.append(hit)
        return kept

    def depths(self, k: int) -> Iterable[int]:
        """How many rows to rank, in turn, for ``k`` hits to be kept: 4k, then four times more, up
        to ``DEPTH_PER_K`` * k or ``MAX_DEPTH``, whichever is less (and at least k)."""
        limit = max(k, min(MAX_DEPTH, DEPTH_PER_K * k))
        depth = k
        while True:
            depth = min(limit, depth * 4)
            yield depth
            if depth >= limit:
                return


NO_COLLAPSE = Collapse()
