"""Full-text ranking over the rows one caller may read: BM25 whose statistics come from those rows alone.

LanceDB's full-text index scores a match with statistics of its whole index (row count, document
frequencies and average length over every row of every tenant): a globex HR reader's score on her
own salary scales fell from 6.89 to 4.14 when acme stored five restricted documents holding the same
words (``tests/retrieval/test_lexical_privacy.py``), a side channel on rows she cannot see (DESIGN
§4). Here a caller's visible rows are analysed once per (caller, table version) and scored in
memory, with N, the document frequencies and the average length taken over those rows only, so a
caller's hits, their order and their scores are a function of what it may read and of nothing else.

One analyser both finds the candidates and scores them: LanceDB's own (``lancedb.tokenize`` with the
options of ``FTS()``, the configuration a Lance ``text`` index is built with), so a row's terms are
what such an index makes of its text. The BM25 is Lance's too (k1 = 1.2, b = 0.75, idf = ln(1 + (N - df
+ 0.5) / (df + 0.5)), a query term counted as often as it occurs): a caller who may read every row
of a table gets the scores Lance's own index gives.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..stages import work
from ..state import terms_of_words
from .visible_rows import best_first, id_ranks

K1 = 1.2
B = 0.75
VOCABULARY_ENTRY_BYTES = 120  # a dict entry and its str object, besides the term's characters
@dataclass(frozen=True, kw_only=True)
class Analysed:
    """Texts as terms: the vocabulary (term -> id) and, for every term occurrence in text order,
    the text it occurs in and its term id."""

    vocabulary: dict[str, int]
    text_of: np.ndarray  # (occurrences,) int64
    term_of: np.ndarray  # (occurrences,) int64


def analyse(texts: pa.Array | pa.ChunkedArray) -> Analysed:
    """Every text's terms, exactly as ``lancedb.tokenize`` gives them text by text (null: no terms).

    The base tokenizer ends a token at every character that is not alphanumeric, a space included,
    and every filter after it (lower case, length, stop words, ASCII folding, stemming) acts on one
    token at a time: so a text's terms are its space-separated words' terms, in order (a word
    holding other whitespace or punctuation is cut there by the analyser itself), and each distinct
    word is analysed once: a call's fixed cost is paid per batch, not per text."""
    array = pc.fill_null(pc.cast(texts, pa.large_string()), "")
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    words = pc.split_pattern(array, " ")  # a literal split, far cheaper than at Unicode whitespace
    text_of_word = pc.list_parent_indices(words).to_numpy().astype(np.int64)
    encoded = pc.dictionary_encode(pc.list_flatten(words))
    word_ids = encoded.indices.to_numpy().astype(np.int64)
    per_word = terms_of_words(encoded.dictionary.to_pylist())
    vocabulary: dict[str, int] = {}
    counts = np.fromiter(map(len, per_word), np.int64, len(per_word))
    firsts = np.zeros(len(per_word) + 1, np.int64)
    np.cumsum(counts, out=firsts[1:])
    term_ids = (vocabulary.setdefault(term, len(vocabulary)) for terms in per_word for term in terms)
    word_terms = np.fromiter(term_ids, np.int64, int(firsts[-1]))
    times = counts[word_ids]  # each word occurrence becomes its word's terms, in order
    text_of = np.repeat(text_of_word, times)
    block = np.repeat(firsts[word_ids] - (np.cumsum(times) - times), times)
    term_of = word_terms[block + np.arange(len(text_of), dtype=np.int64)]
    return Analysed(vocabulary=vocabulary, text_of=text_of, term_of=term_of)


def query_terms(query: str) -> list[str]:
    """The query's terms, by the analyser that made the rows' terms (a repeated term repeats)."""
    analysed = analyse(pa.array([query], pa.large_string()))
    names = list(analysed.vocabulary)
    return [names[term] for term in analysed.term_of.tolist()]


@dataclass(frozen=True, kw_only=True)
class LexicalRows:
    """One caller's visible rows at one table version, analysed for BM25.

    ``rows`` are the result columns in the order read, or the chunk ids alone when the columns
    would not fit the cache (``ids_only``); equal scores go to the smaller chunk id. Each row's
    length in terms and every term's postings (the rows holding it, how often) cover every row the filter
    admitted; the statistics (N, document frequencies, average length) count only the rows
    ``counted`` marks, those the post-check admits. A row the filter passed and the post-check
    refuses is still ranked, by the visible rows' statistics, so the post-check withholds it as it
    would from any plan; it never moves another row's score."""

    rows: pa.Table
    ranks: np.ndarray  # (n,) each row's place in chunk-id order
    lengths: np.ndarray  # (n,) int32: terms in each row
    counted: np.ndarray  # (n,) bool: the rows the statistics count
    vocabulary: Mapping[str, int]
    starts: np.ndarray  # (terms + 1,) int64: term t's postings are postings[starts[t]:starts[t + 1]]
    postings: np.ndarray  # int32 row positions, ascending within each term
    frequencies: np.ndarray  # int32: how often the term occurs in that row
    document_frequencies: np.ndarray  # (terms,) int64: counted rows holding each term
    documents: int  # N: counted rows
    average_length: float  # mean length of the counted rows

    @classmethod
    def from_arrow(cls, table: pa.Table, *, counted: Callable[[pa.Table], np.ndarray] | None = None) -> LexicalRows:
        """From the rows a filter admitted (``chunk_id`` and ``text`` among their columns);
        ``counted`` maps them to the mask of those the statistics count (None: all of them)."""
        n = table.num_rows
        work("rows_analysed", n)
        analysed = analyse(table.column("text"))
        lengths = np.bincount(analysed.text_of, minlength=n).astype(np.int32)
        pairs = analysed.term_of * max(n, 1) + analysed.text_of  # term-major (term, row) keys
        pairs.sort()
        first = np.ones(len(pairs), dtype=bool)
        first[1:] = pairs[1:] != pairs[:-1]
        openings = np.flatnonzero(first)
        unique = pairs[openings]
        frequencies = np.diff(np.append(openings, len(pairs))).astype(np.int32)
        term_of_posting = unique // max(n, 1)
        postings = (unique % max(n, 1)).astype(np.int32)
        terms = len(analysed.vocabulary)
        starts = np.zeros(terms + 1, np.int64)
        np.cumsum(np.bincount(term_of_posting, minlength=terms), out=starts[1:])
        mask = np.ones(n, dtype=bool) if counted is None else np.asarray(counted(table), dtype=bool)
        documents = int(mask.sum())
        document_frequencies = np.bincount(term_of_posting, weights=mask[postings], minlength=terms)
        return cls(
            rows=table,
            ranks=id_ranks(table.column("chunk_id")),
            lengths=lengths,
            counted=mask,
            vocabulary=analysed.vocabulary,
            starts=starts,
            postings=postings,
            frequencies=frequencies,
            document_frequencies=document_frequencies.astype(np.int64),
            documents=documents,
            average_length=float(lengths[mask].sum()) / documents if documents else 0.0,
        )

    def ids_only(self) -> LexicalRows:
        """The same statistics, holding of the rows only their chunk ids: the winners' columns
        are then read back by id (one indexed read) instead of held."""
        return replace(self, rows=self.rows.select(["chunk_id"]))

    @cached_property
    def nbytes(self) -> int:
        arrays = (self.ranks, self.lengths, self.counted, self.starts, self.postings, self.frequencies)
        arrays += (self.document_frequencies,)
        words = sum(len(term) + VOCABULARY_ENTRY_BYTES for term in self.vocabulary)
        return int(self.rows.nbytes + sum(array.nbytes for array in arrays) + words)

    def top(self, terms: Sequence[str], k: int) -> list[tuple[dict[str, Any], float]]:
        """The ``k`` best rows holding a query term (``terms``, from ``query_terms``) with their
        BM25 scores, best first, equal scores by chunk id."""
        if k < 1 or self.documents == 0 or self.average_length == 0:
            return []  # no counted row holds any term: nothing visible matches
        scores = np.zeros(self.rows.num_rows)
        holding = np.zeros(self.rows.num_rows, dtype=bool)
        for term, times in Counter(terms).items():
            index = self.vocabulary.get(term)
            if index is None:
                continue
            span = slice(self.starts[index], self.starts[index + 1])
            work("postings_scored", span.stop - span.start)
            rows, frequency = self.postings[span], self.frequencies[span].astype(np.float64)
            df = int(self.document_frequencies[index])
            idf = math.log(1.0 + (self.documents - df + 0.5) / (df + 0.5))
            norm = K1 * (1.0 - B + B * self.lengths[rows] / self.average_length)
            scores[rows] += times * idf * frequency * (K1 + 1.0) / (frequency + norm)
            holding[rows] = True
        best = best_first(scores, k, holding, self.ranks)
        return list(zip(self.rows.take(pa.array(best)).to_pylist(), scores[best].tolist(), strict=True))
