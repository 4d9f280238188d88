"""BM25 written out from its definition, over whatever rows it is given, to check the product's
full-text scores against: it shares no code with ``ragwarden.retrieval.lexical``.

Terms come from LanceDB's analyser called on each whole text (``lancedb.tokenize`` with its
defaults, which are those of ``FTS()``, the configuration the ``text`` index is built with). The
constants and the idf are Lance's: k1 = 1.2, b = 0.75, idf = ln(1 + (N - df + 0.5) / (df + 0.5)),
and a query term counts as often as it occurs in the query.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import lancedb

K1, B = 1.2, 0.75


def terms(text: str) -> list[str]:
    """LanceDB's analyser on one whole text."""
    return [token.text for token in lancedb.tokenize(text)]


def bm25_ranking(rows: Iterable[Mapping[str, Any]], query: str, k: int) -> list[tuple[str, float]]:
    """The ``k`` best of ``rows`` holding a query term, as (chunk id, BM25 score), best first and
    equal scores by chunk id, with N, document frequencies and average length over ``rows``."""
    documents = {row["chunk_id"]: Counter(terms(row["text"] or "")) for row in rows}
    if not documents:
        return []
    length = {chunk_id: sum(counts.values()) for chunk_id, counts in documents.items()}
    average = sum(length.values()) / len(documents)
    asked = terms(query)
    scored: list[tuple[str, float]] = []
    for chunk_id, counts in documents.items():
        if not any(term in counts for term in asked):
            continue
        score = 0.0
        for term in asked:  # each occurrence of a query term adds its part once
            tf = counts[term]
            if tf == 0:
                continue
            df = sum(1 for other in documents.values() if term in other)
            idf = math.log(1 + (len(documents) - df + 0.5) / (df + 0.5))
            score += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length[chunk_id] / average))
        scored.append((chunk_id, score))
    scored.sort(key=lambda pair: (-pair[1], pair[0]))
    return scored[:k]
