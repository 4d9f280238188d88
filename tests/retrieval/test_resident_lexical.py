"""The resident terms: postings by (tag set, term), moved by re-tags, merged, scored over a mask.

Checked against BM25 written out from its definition (``support.bm25``) over the rows a caller's
sets hold at each step, after rows moved between tag sets back and forth more often than segments
are kept (so merges happen and left-behind pairs must never count twice)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyarrow import ipc
from support.bm25 import bm25_ranking

from ragwarden.errors import InvalidValueError
from ragwarden.retrieval.lexical import query_terms
from ragwarden.retrieval.resident_lexical import SEGMENTS_KEPT, ResidentTerms, TermPairs, TermVocabulary
from ragwarden.stages import counting

WORDS = ["apple", "pear", "plum", "fig", "kiwi", "lime", "date", "quince"]
QUERY = "apple plum plum quince"


def _texts(count: int, seed: int = 3) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 9)))) for _ in range(count)]


def _terms(texts: list[str], sets: np.ndarray) -> ResidentTerms:
    pairs = TermPairs.of_texts(pa.array(texts), np.arange(len(texts)), TermVocabulary())
    return ResidentTerms.placed_in(pairs, sets)


def _ranked(terms: ResidentTerms, row_sets: np.ndarray, readable: list[int]) -> list[tuple[int, float]]:
    mask = np.isin(row_sets, readable)
    slots, scores = terms.scores(np.asarray(readable), mask, query_terms(QUERY))
    return sorted(zip(slots.tolist(), scores.tolist(), strict=True), key=lambda pair: (-pair[1], pair[0]))


def _expected(texts: list[str], row_sets: np.ndarray, readable: list[int]) -> list[tuple[int, float]]:
    rows = [{"chunk_id": f"{slot:05d}", "text": texts[slot]} for slot in np.flatnonzero(np.isin(row_sets, readable))]
    return [(int(chunk_id), score) for chunk_id, score in bm25_ranking(rows, QUERY, len(texts))]


def _assert_bm25(terms: ResidentTerms, texts: list[str], row_sets: np.ndarray) -> None:
    for readable in ([0], [1], [0, 2], [1, 2], [0, 1, 2]):
        got, expected = _ranked(terms, row_sets, readable), _expected(texts, row_sets, readable)
        assert [slot for slot, _ in got] == [slot for slot, _ in expected], readable
        assert [score for _, score in got] == pytest.approx([score for _, score in expected], rel=0, abs=1e-9)


def test_rows_moved_between_sets_back_and_forth_score_once_under_their_current_set():
    texts = _texts(300)
    row_sets = np.arange(300, dtype=np.int32) % 3
    terms = _terms(texts, row_sets)
    rng = np.random.default_rng(8)
    for step in range(3 * SEGMENTS_KEPT):
        moved = rng.choice(300, size=20, replace=False)
        row_sets = row_sets.copy()
        row_sets[moved] = (row_sets[moved] + 1 + step % 2) % 3
        pairs = TermPairs.of_texts(pa.array([texts[s] for s in moved]), moved, terms.vocabulary)
        terms = terms.with_rows(pairs, row_sets[moved], len(row_sets))
        _assert_bm25(terms, texts, row_sets)
    assert len(terms.segments) <= SEGMENTS_KEPT + 1, "the later segments merged"


def test_rows_added_score_with_the_rest():
    texts = _texts(200)
    row_sets = np.arange(200, dtype=np.int32) % 3
    terms = _terms(texts[:150], row_sets[:150])
    pairs = TermPairs.of_texts(pa.array(texts[150:]), np.arange(150, 200), terms.vocabulary)
    terms = terms.with_rows(pairs, row_sets[150:], 200)
    _assert_bm25(terms, texts, row_sets)


def test_a_search_touches_no_posting_of_a_set_it_cannot_read():
    """The work is the caller's own rows holding its terms: rows of other sets, however many and
    whatever they hold, add nothing to it."""
    texts = _texts(100)
    alone = _terms(texts, np.zeros(100, dtype=np.int32))
    crowded = _terms(texts + ["apple plum quince " * 5] * 5_000, np.append(np.zeros(100, np.int32), np.ones(5_000, np.int32)))
    scanned = []
    for terms in (alone, crowded):
        mask = np.zeros(len(terms.lengths), dtype=bool)
        mask[:100] = True
        with counting() as measured:
            slots, scores = terms.scores(np.asarray([0]), mask, query_terms(QUERY))
        scanned.append((measured["postings_scored"], slots.tolist(), scores.tolist()))
    assert scanned[0] == scanned[1]


def test_the_stored_pairs_read_back_as_written_and_anything_else_is_refused():
    pairs = TermPairs.of_texts(pa.array(_texts(50)), np.arange(50), TermVocabulary())
    back = TermPairs.from_bytes(pairs.to_bytes())
    for name in ("slot_of", "term_of", "frequency", "lengths"):
        assert np.array_equal(getattr(back, name), getattr(pairs, name)), name
    assert back.vocabulary.terms() == pairs.vocabulary.terms()
    with pytest.raises(pa.ArrowInvalid):  # what the loader catches, then analyses the rows
        TermPairs.from_bytes(b"not arrow at all")
    other = pa.BufferOutputStream()
    with ipc.new_file(other, pa.schema([("x", pa.int64())])) as out:
        out.write_table(pa.table({"x": [1]}))
    with pytest.raises(InvalidValueError, match="not a terms artifact"):
        TermPairs.from_bytes(other.getvalue().to_pybytes())
