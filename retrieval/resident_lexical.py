"""Every row's terms held in this process (a forward index over the resident state's slots), for
BM25 over any caller's visible rows without reading or analysing them again.

Why: analysing a caller's visible texts at its first search of each table version cost seconds
(2.5 s at 1M rows for a broad caller). Here the texts are analysed once, when the serving index
is built, and the rows each commit adds when the state moves; a search then takes N, the
document frequencies and the average length over the caller's visible slots (the resident mask),
so scores equal BM25 over exactly those rows (``lexical``'s analyser and formula).

The shape of the work, and why it is not a postings walk: a term's postings list holds every row
with the term, readable or not, so walking it costs what hidden rows contain, and a caller choosing
its query words could time that (the class of DESIGN §4's rule). Instead each search makes the
same two passes over every stored (row, term) pair, whatever the rows say: is the pair's row
visible, is its term asked; only the pairs that are both are scored. The time is a function of the
table's size in terms and of the caller's own rows and query.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..stages import work
from .lexical import K1, VOCABULARY_ENTRY_BYTES, B, analyse


class TermVocabulary:
    """Terms to ids for the life of one resident state's lineage (append-only)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def ids(self, terms: Sequence[str]) -> np.ndarray:
        """The ids of ``terms`` (new ones added)."""
        with self._lock:
            return np.fromiter((self._ids.setdefault(t, len(self._ids)) for t in terms), np.int32, len(terms))

    def get(self, term: str) -> int | None:
        return self._ids.get(term)

    @property
    def nbytes(self) -> int:
        return sum(len(term) + VOCABULARY_ENTRY_BYTES for term in self._ids)


@dataclass(frozen=True, kw_only=True)
class ResidentTerms:
    """The (slot, term, frequency) of every distinct term of every slot's text, and each slot's
    length in terms."""

    vocabulary: TermVocabulary
    slot_of: np.ndarray  # (pairs,) int32
    term_of: np.ndarray  # (pairs,) int32
    frequency: np.ndarray  # (pairs,) int32
    lengths: np.ndarray  # (slots,) int32

    @classmethod
    def empty(cls, vocabulary: TermVocabulary | None = None) -> ResidentTerms:
        none = np.empty(0, np.int32)
        return cls(vocabulary=vocabulary or TermVocabulary(), slot_of=none, term_of=none, frequency=none, lengths=none)

    def extended(self, texts: pa.Array | pa.ChunkedArray, slots: np.ndarray, total_slots: int) -> ResidentTerms:
        """These terms with those of ``texts`` (one per slot of ``slots``, new slots), for a
        state of ``total_slots`` slots."""
        lengths = np.zeros(total_slots, np.int32)
        lengths[: len(self.lengths)] = self.lengths
        if len(slots) == 0:
            return ResidentTerms(vocabulary=self.vocabulary, slot_of=self.slot_of, term_of=self.term_of,
                                 frequency=self.frequency, lengths=lengths)  # fmt: skip
        analysed = analyse(texts)
        global_ids = self.vocabulary.ids(list(analysed.vocabulary))
        slot = np.asarray(slots, dtype=np.int64)[analysed.text_of]
        term = global_ids[analysed.term_of].astype(np.int64)
        np.add.at(lengths, slot, 1)
        pairs = np.unique(slot * (1 << 31) + term, return_counts=True)
        keys, counts = pairs
        return ResidentTerms(
            vocabulary=self.vocabulary,
            slot_of=np.concatenate([self.slot_of, (keys >> 31).astype(np.int32)]),
            term_of=np.concatenate([self.term_of, (keys & ((1 << 31) - 1)).astype(np.int32)]),
            frequency=np.concatenate([self.frequency, counts.astype(np.int32)]),
            lengths=lengths,
        )

    @property
    def nbytes(self) -> int:
        return int(self.slot_of.nbytes + self.term_of.nbytes + self.frequency.nbytes + self.lengths.nbytes + self.vocabulary.nbytes)

    def scores(self, visible: np.ndarray, terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """BM25 over the ``visible`` slots (a mask) for the query ``terms`` (``query_terms``'s, a
        repeated term counted as often as it occurs): the slots holding an asked term, and their
        scores. N, document frequencies and average length count the visible slots alone."""
        asked = Counter(terms)
        ids = {term: self.vocabulary.get(term) for term in asked}
        wanted = np.zeros(max(len(self.vocabulary._ids), 1) + 1, dtype=np.int32)  # term id -> place among asked + 1
        times: list[int] = []
        for term, count in asked.items():
            if ids[term] is not None:
                times.append(count)
                wanted[ids[term]] = len(times)
        documents = int(np.count_nonzero(visible[: len(self.lengths)]))
        if not times or documents == 0:
            return np.empty(0, np.int64), np.empty(0)
        average = float(self.lengths[visible[: len(self.lengths)]].sum()) / documents
        if average == 0:
            return np.empty(0, np.int64), np.empty(0)
        place = wanted[self.term_of]  # every pair: the same two gathers whatever it holds
        taken = np.flatnonzero((place > 0) & visible[self.slot_of])
        work("postings_scored", len(taken))
        place, slots = place[taken] - 1, self.slot_of[taken]
        holding, at = np.unique(slots, return_inverse=True)
        scores = np.zeros(len(holding))
        for number, count in enumerate(times):  # term by term, in the query's order (so are sums' roundings)
            mine = place == number
            df = int(np.count_nonzero(mine))
            idf = math.log(1.0 + (documents - df + 0.5) / (df + 0.5))
            frequency = self.frequency[taken[mine]].astype(np.float64)
            norm = K1 * (1.0 - B + B * self.lengths[slots[mine]] / average)
            scores[at[mine]] += count * idf * frequency * (K1 + 1.0) / (frequency + norm)
        return holding.astype(np.int64), scores
