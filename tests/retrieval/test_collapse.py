"""Collapsing an answer by document and by identical text: k hits still come back when k exist,
each the best the hits above it leave room for, exactly as collapsing the full ranking would."""

from __future__ import annotations

from typing import Any

import pytest

from ragwarden.errors import InvalidRequestError
from ragwarden.warehouse import Warehouse

LICENCE = (
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this software, to deal "
    "in the software without restriction, subject to the licence notice being included in all copies."
)
TOPICS = ["the cafeteria menu for the spring", "parking permits for visitors", "the annual licence renewal fee",
          "open source licence compliance reviews", "the holiday schedule for the office"]  # fmt: skip


def _record(doc_id: str, text: str) -> dict[str, Any]:
    return {"id": doc_id, "text": text, "tenant": "acme", "acl": {"allow": ["group:staff"]}, "labels": [],
            "classification": "internal", "uri": f"test://{doc_id}"}  # fmt: skip


@pytest.fixture
def licence_copies_warehouse(demo_policy_warehouse: Warehouse) -> Warehouse:
    """Three documents that are one licence word for word, one long document about licences (many
    chunks), and a few short ones on other topics, all readable by staff in acme."""
    long_text = " ".join(f"Section {n}: how the licence applies to module {n}, its copies and its notices." for n in range(120))
    records = [_record(f"copy-{n}", LICENCE) for n in range(3)]
    records += [_record("handbook", long_text)]
    records += [_record(f"topic-{n}", f"A note about {topic}.") for n, topic in enumerate(TOPICS)]
    demo_policy_warehouse.ingest_records(records)
    return demo_policy_warehouse


def _search(warehouse: Warehouse, k: int, **collapse: Any) -> list[Any]:
    return warehouse.search("software licence copies and notices", subject="user:alice", tenant="acme", k=k, **collapse)


def test_copies_of_one_text_fill_the_answer_unless_distinct(licence_copies_warehouse: Warehouse):
    plain = _search(licence_copies_warehouse, 3)
    assert [hit.text for hit in plain].count(LICENCE) == 3, "the three copies rank first: the case to collapse"
    distinct = _search(licence_copies_warehouse, 3, distinct=True)
    assert len(distinct) == 3 and [hit.text for hit in distinct].count(LICENCE) == 1
    assert len({hit.text for hit in distinct}) == 3


def test_group_by_doc_keeps_at_most_per_group_chunks_of_a_document(licence_copies_warehouse: Warehouse):
    assert len(licence_copies_warehouse.store.chunks.chunk_ids_of("handbook", "acme")) > 3, "a document of many chunks"
    for per_group in (1, 2):
        hits = _search(licence_copies_warehouse, 6, group_by="doc", per_group=per_group)
        docs = [hit.doc_id for hit in hits]
        assert len(hits) == 6 and max(docs.count(doc) for doc in set(docs)) <= per_group


@pytest.mark.parametrize("collapse", [{"distinct": True}, {"group_by": "doc"}, {"group_by": "doc", "per_group": 2, "distinct": True}])
def test_a_collapsed_answer_is_the_full_ranking_collapsed(licence_copies_warehouse: Warehouse, collapse: dict[str, Any]):
    """The oracle: rank every readable chunk, then keep each hit the ones above it leave room for."""
    everything = _search(licence_copies_warehouse, 1000)
    kept: list[str] = []
    per_doc: dict[str, int] = {}
    texts: set[str] = set()
    for hit in everything:
        if collapse.get("group_by") and per_doc.get(hit.doc_id, 0) >= collapse.get("per_group", 1):
            continue
        if collapse.get("distinct") and hit.text in texts:
            continue
        per_doc[hit.doc_id] = per_doc.get(hit.doc_id, 0) + 1
        texts.add(hit.text)
        kept.append(hit.chunk_id)
    for k in (1, 4, 7):
        assert [hit.chunk_id for hit in _search(licence_copies_warehouse, k, **collapse)] == kept[:k]


def test_fewer_hits_come_back_only_when_fewer_remain_after_collapsing(licence_copies_warehouse: Warehouse):
    documents = {hit.doc_id for hit in _search(licence_copies_warehouse, 1000)}
    assert len(_search(licence_copies_warehouse, 50, group_by="doc")) == len(documents)


def test_the_receipt_says_how_the_answer_was_collapsed(licence_copies_warehouse: Warehouse):
    _search(licence_copies_warehouse, 3, group_by="doc", per_group=2, distinct=True)
    receipt = licence_copies_warehouse.audit.query(subject="user:alice", limit=1)[0]
    assert "at most 2 per document" in receipt.reason and "distinct texts" in receipt.reason


@pytest.mark.parametrize(
    ("collapse", "named"),
    [({"group_by": "folder"}, "group_by 'folder'"), ({"group_by": "doc", "per_group": 0}, "per_group"),
     ({"distinct": "yes"}, "distinct")],  # fmt: skip
)
def test_a_malformed_collapse_is_refused_naming_it(licence_copies_warehouse: Warehouse, collapse: dict[str, Any], named: str):
    with pytest.raises(InvalidRequestError, match=named):
        _search(licence_copies_warehouse, 3, **collapse)


def test_a_collapsing_search_ranks_at_most_64k_rows_in_three_rounds():
    from ragwarden.retrieval.collapse import Collapse

    assert list(Collapse(distinct=True).depths(10)) == [40, 160, 640]
    assert list(Collapse(group_by="doc").depths(1000)) == [4000, 10_000]
