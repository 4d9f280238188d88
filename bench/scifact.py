"""SciFact (BEIR format) as ragwarden records, its test queries, and nDCG@10 through governed search.

Shared by the retrieval-quality test and the ingest benchmark so both ingest and score the corpus
the same way: one record per abstract (``title + " " + text``), all readable by one reader group.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from ..warehouse import Warehouse

TENANT = "scifact"
READER = "user:reader"
POLICY = "g, user:reader, group:readers, scifact\n"
CORPUS_SIZE = 5183
TEST_QUERIES = 300


def records(folder: Path, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """The corpus as ingest records (the JSONL format of DESIGN §6), in file order, the first ``limit``."""
    with (folder / "corpus.jsonl").open(encoding="utf-8") as handle:
        for line in islice(handle, limit):
            doc = json.loads(line)
            yield {
                "id": doc["_id"],
                "text": f"{doc['title']} {doc['text']}",
                "tenant": TENANT,
                "acl": {"allow": ["group:readers"]},
                "labels": [],
                "classification": "public",
            }


def write_records_jsonl(folder: Path, target: Path, limit: int | None = None) -> int:
    """Write the corpus as an ingest JSONL file (for ``Warehouse.ingest``); returns the record count."""
    count = 0
    with target.open("w", encoding="utf-8") as out:
        for record in records(folder, limit):
            out.write(json.dumps(record) + "\n")
            count += 1
    return count


def judged_queries(folder: Path) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """The test queries that have judgments, and those judgments (query id -> corpus id -> grade)."""
    texts: dict[str, str] = {}
    with (folder / "queries.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            query = json.loads(line)
            texts[query["_id"]] = query["text"]
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    with (folder / "qrels" / "test.tsv").open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            qrels[row["query-id"]][row["corpus-id"]] = int(row["score"])
    return {q: texts[q] for q in qrels}, dict(qrels)


def ndcg_at_10(ranked: list[str], relevant: Mapping[str, int]) -> float:
    """nDCG@10 of one ranking of document ids against graded judgments."""
    dcg = sum(relevant.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(ranked[:10]))
    ideal = sum(rel / math.log2(rank + 2) for rank, rel in enumerate(sorted(relevant.values(), reverse=True)[:10]))
    return dcg / ideal if ideal else 0.0


def governed_ndcg_at_10(
    warehouse: Warehouse, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]]
) -> float:
    """Mean nDCG@10 over ``qrels``'s queries, searched as the reader through the governed path.

    A document ranks by its best chunk: 40 chunks are fetched so ten distinct documents remain.
    """
    scores = []
    for query_id, relevant in qrels.items():
        hits = warehouse.search(queries[query_id], subject=READER, tenant=TENANT, k=40)
        ranked: list[str] = []
        for hit in hits:
            if hit.doc_id not in ranked:
                ranked.append(hit.doc_id)
        scores.append(ndcg_at_10(ranked, relevant))
    return sum(scores) / len(scores) if scores else 0.0
