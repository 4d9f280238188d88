"""Full-text ranking over a caller's visible rows: LanceDB's analyser exactly, held per caller and
table version within the cache budget, and the same answer whatever the budget holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.raw_tables import raw_table

from ragwarden.governance.caller import Caller
from ragwarden.retrieval.hits import Hit
from ragwarden.retrieval.lexical import LexicalRows, analyse, query_terms
from ragwarden.retrieval.search import Searcher
from ragwarden.stages import work_done
from ragwarden.state import text_analysis
from ragwarden.warehouse import Warehouse

# Pieces of text that stress the analyser: every kind of whitespace and punctuation, case, accents
# (composed and combining), a ligature, full-width letters, CJK, digits, stop words, stems, a word
# over the 40-byte limit and one just under it, and the separator word the batching cuts at.
PIECES = [
    " ", "  ", "\t", "\n", "\u00a0", "\u2003", "\u3000", "\x1c", "-", "—", "'", ".", ",", "/", "_", "&",
    "The", "the", "and", "Running", "runs", "café", "cafe\u0301", "ﬁne", "ＡＢＣ", "東京", "Straße", "ŒUVRE",
    "1,000", "x2", "don't", "a" * 45, "b" * 39, "é" * 25, "zqxragwardenzqx", "ZqxRagwardenZqx", "İstanbul",
]  # fmt: skip
texts = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)


def _lance_terms(text: str) -> list[str]:
    return [token.text for token in lancedb.tokenize(text)]


def _analysed_terms(batch: list[str | None]) -> list[list[str]]:
    analysed = analyse(pa.array(batch, pa.string()))
    names = list(analysed.vocabulary)
    terms: list[list[str]] = [[] for _ in batch]
    for text, term in zip(analysed.text_of.tolist(), analysed.term_of.tolist(), strict=True):
        terms[text].append(names[term])
    return terms


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(batch=st.lists(texts, max_size=6), words=st.sampled_from([1, 2, 3, 8192]), chars=st.sampled_from([50, 1 << 20]))
def test_texts_are_analysed_exactly_as_lances_analyser_does_text_by_text(batch: list[str], words: int, chars: int):
    with mock.patch.object(text_analysis, "WORDS_PER_CALL", words), mock.patch.object(text_analysis, "CHARACTERS_PER_CALL", chars):
        assert _analysed_terms([*batch, None]) == [*map(_lance_terms, batch), []]  # batches cut anywhere


def test_a_word_that_analyses_to_the_separator_is_analysed_word_by_word() -> None:
    batch = ["pumps zqxragwardenzqx valves", "ZQXRAGWARDENZQX", "plain words"]
    assert _analysed_terms(batch) == [_lance_terms(text) for text in batch]
    assert query_terms("Pumps, PUMPING and the pump") == ["pump", "pump", "pump"]


def test_the_analyser_is_the_one_the_text_index_is_built_with() -> None:
    from lancedb.index import FTS

    config = FTS()
    assert all(getattr(config, option) == value for option, value in text_analysis.ANALYZER.items())


def _rows(texts: list[str]) -> pa.Table:
    return pa.table({"chunk_id": [f"c{i}" for i in range(len(texts))], "text": texts})


def test_statistics_count_only_the_rows_the_post_check_admits() -> None:
    """A refused row is still ranked (so the post-check withholds it, as from any plan), but it
    moves no other row's score: the scores are those of the table without it."""
    texts = ["pump valve", "pump pump pump pump", "valve seat", "other words entirely"]
    refused = LexicalRows.from_arrow(_rows(texts), counted=lambda rows: np.array([True, False, True, True]))
    without = LexicalRows.from_arrow(_rows(texts).filter(pa.array([True, False, True, True])))
    ranked = {row["chunk_id"]: score for row, score in refused.top(["pump"], 10)}
    assert set(ranked) == {"c0", "c1"}  # c1 is ranked, for the post-check to withhold
    assert ranked["c0"] == {row["chunk_id"]: score for row, score in without.top(["pump"], 10)}["c0"]
    assert (refused.documents, refused.average_length) == (without.documents, without.average_length)


def test_equal_scores_go_to_the_smaller_chunk_id_and_a_repeated_term_counts_twice() -> None:
    rows = LexicalRows.from_arrow(pa.table({"chunk_id": ["b", "c", "a", "d"], "text": ["pump", "pump", "pump", "x"]}))
    once, twice = rows.top(["pump"], 2), rows.top(["pump", "pump"], 2)
    assert [row["chunk_id"] for row, _ in once] == ["a", "b"]
    assert [score for _, score in twice] == pytest.approx([2 * score for _, score in once], rel=1e-12)
    assert rows.top(["absent"], 5) == [] and rows.top(["pump"], 0) == []


def _answers(searcher: Searcher, warehouse: Warehouse, subject: str, mode: str) -> list[list[tuple[str, str]]]:
    vector = [0.1] * warehouse.store.dimension
    result = []
    for question in ("salary bands", "acquisition due diligence", "Rotterdam", "litigation hold"):
        found = searcher.search(question, policy=warehouse.policy, caller=Caller(subject=subject, tenant="acme"), k=5, mode=mode,
                                  vector=vector)
        hits = found.hits  # fmt: skip
        result.append([(hit.chunk_id, hit.score.hex()) for hit in hits])
    return result


@pytest.mark.parametrize("mode", ["fts", "hybrid"])
def test_the_answer_is_the_same_whatever_the_budget_holds(demo_warehouse: Warehouse, mode: str) -> None:
    """Held with its columns, held as statistics and chunk ids (the winners read back by id), or
    not held at all: the same hits and the same scores."""
    store = demo_warehouse.store
    roomy = Searcher(store.read_doors(), None, flat_cache_bytes=64 * 2**20)  # type: ignore[arg-type]
    expected = _answers(roomy, demo_warehouse, "user:carol", mode)
    assert any(expected)
    lexical_bytes = roomy.visible.nbytes - (0 if mode == "fts" else _vector_bytes(roomy))
    tight = Searcher(store.read_doors(), None, flat_cache_bytes=4 * (lexical_bytes - 1))  # type: ignore[arg-type]
    none = Searcher(store.read_doors(), None, flat_cache_bytes=0)  # type: ignore[arg-type]
    assert _answers(tight, demo_warehouse, "user:carol", mode) == expected
    assert 0 < tight.visible.nbytes - (0 if mode == "fts" else _vector_bytes(tight)) < lexical_bytes  # ids only
    assert _answers(none, demo_warehouse, "user:carol", mode) == expected and len(none.visible) == 0


def _vector_bytes(searcher: Searcher) -> int:
    """Bytes the cache holds for vector scans (``VisibleRows``), beside the lexical sets."""
    return sum(value.nbytes for key, value in searcher.visible._items.items() if key[0] != "lexical")


def test_a_callers_rows_are_analysed_once_per_table_version(
    demo_policy_warehouse: Warehouse, make_record: Callable[..., dict[str, Any]]
) -> None:
    public = {"acl": {"allow": ["everyone"]}, "labels": [], "classification": "public"}
    warehouse = demo_policy_warehouse
    assert warehouse.ingest_records([make_record(id="one", text="pumps and valves", **public)]).ok
    analyses: list[int] = []

    def search(query: str, subject: str) -> list[Hit]:
        before = work_done()["rows_analysed"]
        found = warehouse.search(query, subject=subject, tenant="acme", k=5, mode="fts")
        analyses.append(work_done()["rows_analysed"] - before)
        return found

    first = [h.chunk_id for h in search("pump", "user:dave")]
    for _ in range(3):
        assert [h.chunk_id for h in search("valve", "user:dave")] == first
    assert analyses[0] > 0 and analyses[1:] == [0, 0, 0]  # one read and analysis, then from memory
    assert warehouse.ingest_records([make_record(id="two", text="a pump", **public)]).ok
    assert {h.doc_id for h in search("pump", "user:dave")} == {"one", "two"}
    assert analyses[-1] > 0  # the commit is seen at once
    search("pump", "user:alice")
    assert analyses[-1] > 0  # another caller: its own rows, its own statistics


def test_a_row_whose_label_slipped_past_the_registry_is_withheld_and_moves_no_score(
    demo_policy_warehouse: Warehouse, make_record: Callable[..., dict[str, Any]]
) -> None:
    warehouse = demo_policy_warehouse
    public = {"acl": {"allow": ["everyone"]}, "labels": [], "classification": "public"}
    texts = ["pump valve", "valve seat pump"]
    records = [make_record(id=f"doc-{i}", text=text, **public) for i, text in enumerate(texts)]
    assert warehouse.ingest_records(records).ok
    searcher, policy = warehouse._searcher, warehouse.policy
    found = searcher.search("pump", policy=policy, caller=Caller(subject="user:dave", tenant="acme"), k=5, mode="fts")
    before = found.hits
    row = raw_table(warehouse.store).search().limit(1).to_list()[0]
    row.pop("_distance", None)
    row.update(chunk_id="slipped", doc_id="slipped", text="pump pump pump pump", labels=["unregistered-secret"])
    raw_table(warehouse.store).add([row])  # a writer racing the label registry: the indexed filter lets it through
    found = searcher.search("pump", policy=policy, caller=Caller(subject="user:dave", tenant="acme"), k=5, mode="fts")
    after, withheld = found.hits, found.withheld
    assert withheld == 1  # ranked first, withheld by the post-check, then asked again exactly
    assert [(h.chunk_id, h.score) for h in after] == [(h.chunk_id, h.score) for h in before]
