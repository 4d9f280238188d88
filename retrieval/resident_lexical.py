"""Every row's terms held in this process (a forward index over the resident state's slots), for
BM25 over any caller's visible rows without reading or analysing them again.

Why: analysing a caller's visible texts at its first search of each table version cost seconds
(2.5 s at 1M rows for a broad caller). Here the texts are analysed once, when the serving index
is built, and the rows each commit adds when the state moves; a search then takes N, the
document frequencies and the average length over the caller's visible slots (the resident mask),
so scores equal BM25 over exactly those rows (``lexical``'s analyser and formula).

The shape of the work, and why it is not a postings walk: a term's postings list holds every row
with the term, readable or not, so walking it costs what hidden rows contain, and a caller choosing
its query words could time that (the class of DESIGN §4's rule). Instead the pairs are stored by
row, and a search takes the pairs of its caller's visible rows (one pass over the mask, then their
pairs only) and, among them, those of an asked term: the work is a function of the caller's own
rows and query, and of the table's size in rows.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
from pyarrow import ipc

from ..errors import InvalidValueError
from ..stages import work
from .lexical import K1, VOCABULARY_ENTRY_BYTES, B, analyse

_ARTIFACT_TYPES = {"vocabulary": pa.string(), "slot_of": pa.int32(), "term_of": pa.int32(), "frequency": pa.int32(),
                   "lengths": pa.int32()}  # fmt: skip


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

    def terms(self) -> list[str]:
        """Every term, in id order."""
        with self._lock:
            return list(self._ids)

    @classmethod
    def of(cls, terms: Sequence[str]) -> TermVocabulary:
        vocabulary = cls()
        vocabulary._ids = {term: number for number, term in enumerate(terms)}
        return vocabulary

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def nbytes(self) -> int:
        return sum(len(term) + VOCABULARY_ENTRY_BYTES for term in self._ids)


SEGMENTS_KEPT = 8
"""Segments of pairs past the first before the later ones are merged (each commit adds one)."""


@dataclass(frozen=True, kw_only=True)
class _Pairs:
    """One segment of (slot, term, frequency) pairs, ordered by slot: the pairs of slot ``s`` are
    ``[starts[s - first], starts[s - first + 1])``."""

    slot_of: np.ndarray  # (pairs,) int32, ascending
    term_of: np.ndarray  # (pairs,) int32
    frequency: np.ndarray  # (pairs,) int32

    @classmethod
    def joined(cls, segments: Sequence[_Pairs]) -> _Pairs:
        return cls(**{name: np.concatenate([getattr(p, name) for p in segments]) if segments else np.empty(0, np.int32)
                      for name in ("slot_of", "term_of", "frequency")})  # fmt: skip

    @cached_property
    def span(self) -> tuple[int, np.ndarray]:
        """The first slot this segment covers, and where each slot's pairs start."""
        if not len(self.slot_of):
            return 0, np.zeros(1, np.int64)
        first, last = int(self.slot_of[0]), int(self.slot_of[-1])
        starts = np.searchsorted(self.slot_of, np.arange(first, last + 2, dtype=np.int64)).astype(np.int64)
        return first, starts

    def of_slots(self, visible: np.ndarray) -> np.ndarray:
        """The positions of the pairs of the ``visible`` slots (a mask over every slot): work of
        those slots' pairs and one pass over this segment's slots, none over other slots' pairs."""
        first, starts = self.span
        slots = np.flatnonzero(visible[first : first + len(starts) - 1])
        lengths = starts[slots + 1] - starts[slots]
        total = int(lengths.sum())
        if total == 0:
            return np.empty(0, np.int64)
        return np.repeat(starts[slots] - (np.cumsum(lengths) - lengths), lengths) + np.arange(total, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return int(self.slot_of.nbytes + self.term_of.nbytes + self.frequency.nbytes + self.span[1].nbytes)


@dataclass(frozen=True, kw_only=True)
class ResidentTerms:
    """The (slot, term, frequency) of every distinct term of every slot's text, and each slot's
    length in terms. The pairs of the rows each commit adds are a segment of their own, so moving
    to a new version copies no earlier pair."""

    vocabulary: TermVocabulary
    segments: tuple[_Pairs, ...]
    lengths: np.ndarray  # (slots,) int32

    @classmethod
    def empty(cls, vocabulary: TermVocabulary | None = None) -> ResidentTerms:
        return cls(vocabulary=vocabulary or TermVocabulary(), segments=(), lengths=np.empty(0, np.int32))

    @property
    def pairs(self) -> _Pairs:
        """Every pair, in one segment."""
        return self.segments[0] if len(self.segments) == 1 else _Pairs.joined(self.segments)

    def extended(self, texts: pa.Array | pa.ChunkedArray, slots: np.ndarray, total_slots: int) -> ResidentTerms:
        """These terms with those of ``texts`` (one per slot of ``slots``, new slots), for a
        state of ``total_slots`` slots."""
        lengths = np.zeros(total_slots, np.int32)
        lengths[: len(self.lengths)] = self.lengths
        if len(slots) == 0:
            return ResidentTerms(vocabulary=self.vocabulary, segments=self.segments, lengths=lengths)
        analysed = analyse(texts)
        global_ids = self.vocabulary.ids(list(analysed.vocabulary))
        slot = np.asarray(slots, dtype=np.int64)[analysed.text_of]
        term = global_ids[analysed.term_of].astype(np.int64)
        np.add.at(lengths, slot, 1)
        keys, counts = np.unique(slot * (1 << 31) + term, return_counts=True)
        added = _Pairs(slot_of=(keys >> 31).astype(np.int32), term_of=(keys & ((1 << 31) - 1)).astype(np.int32),
                       frequency=counts.astype(np.int32))  # fmt: skip
        segments = (*self.segments, added)
        if len(segments) > SEGMENTS_KEPT + 1:  # the later ones merged: work of the rows added since the first
            segments = (segments[0], _Pairs.joined(segments[1:]))
        return ResidentTerms(vocabulary=self.vocabulary, segments=_spanned(segments), lengths=lengths)

    def to_bytes(self) -> bytes:
        """These terms as one Arrow file (the serving index's artifact keeps it beside the graph)."""
        pairs = self.pairs
        columns = {"vocabulary": self.vocabulary.terms(), "slot_of": pairs.slot_of, "term_of": pairs.term_of,
                   "frequency": pairs.frequency, "lengths": self.lengths}  # fmt: skip
        table = pa.table({name: pa.array([values], pa.large_list(_ARTIFACT_TYPES[name])) for name, values in columns.items()})
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema) as out:
            out.write_table(table)
        return sink.getvalue().to_pybytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> ResidentTerms:
        """Terms ``to_bytes`` wrote. Raises ``InvalidValueError`` for anything else."""
        table = ipc.open_file(pa.BufferReader(data)).read_all()
        if table.num_rows != 1 or set(table.column_names) != set(_ARTIFACT_TYPES):
            raise InvalidValueError("not a terms artifact")
        column = {name: table.column(name).combine_chunks()[0].values for name in _ARTIFACT_TYPES}
        arrays = {name: np.asarray(column[name].to_numpy(zero_copy_only=False), dtype=np.int32)
                  for name in ("slot_of", "term_of", "frequency", "lengths")}  # fmt: skip
        if not len(arrays["slot_of"]) == len(arrays["term_of"]) == len(arrays["frequency"]):
            raise InvalidValueError("a terms artifact whose pairs differ in length")
        lengths = arrays.pop("lengths")
        return cls(vocabulary=TermVocabulary.of(column["vocabulary"].to_pylist()), segments=_spanned((_Pairs(**arrays),)),
                   lengths=lengths)  # fmt: skip

    @property
    def nbytes(self) -> int:
        return int(sum(p.nbytes for p in self.segments) + self.lengths.nbytes + self.vocabulary.nbytes)

    def scores(self, visible: np.ndarray, terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """BM25 over the ``visible`` slots (a mask) for the query ``terms`` (``query_terms``'s, a
        repeated term counted as often as it occurs): the slots holding an asked term, and their
        scores. N, document frequencies and average length count the visible slots alone."""
        asked = Counter(terms)
        ids = {term: self.vocabulary.get(term) for term in asked}
        wanted = np.zeros(len(self.vocabulary) + 1, dtype=np.int32)  # term id -> place among asked + 1
        times: list[int] = []
        for term, count in asked.items():
            if ids[term] is not None:
                times.append(count)
                wanted[ids[term]] = len(times)
        documents = int(np.count_nonzero(visible[: len(self.lengths)]))
        if not times or documents == 0 or not self.segments:
            return np.empty(0, np.int64), np.empty(0)
        average = float(self.lengths[visible[: len(self.lengths)]].sum()) / documents
        if average == 0:
            return np.empty(0, np.int64), np.empty(0)
        places, slot_parts, frequencies = [], [], []
        for pairs in self.segments:  # the visible slots' pairs only, then the asked terms among them
            mine = pairs.of_slots(visible)
            place = wanted[pairs.term_of[mine]]
            taken = mine[place > 0]
            places.append(place[place > 0].astype(np.int64) - 1)
            slot_parts.append(pairs.slot_of[taken])
            frequencies.append(pairs.frequency[taken])
        place, slots, held = np.concatenate(places), np.concatenate(slot_parts), np.concatenate(frequencies)
        work("postings_scored", len(place))
        scores = np.zeros(len(self.lengths))  # by slot: no sort of the matches, whatever their number
        for number, count in enumerate(times):  # term by term, in the query's order (so are sums' roundings)
            mine = place == number
            df = int(np.count_nonzero(mine))
            idf = math.log(1.0 + (documents - df + 0.5) / (df + 0.5))
            frequency = held[mine].astype(np.float64)
            at = slots[mine]  # one pair per (slot, term): no slot twice
            norm = K1 * (1.0 - B + B * self.lengths[at] / average)
            scores[at] += count * idf * frequency * (K1 + 1.0) / (frequency + norm)
        holding = np.zeros(len(self.lengths), dtype=bool)
        holding[slots] = True
        found = np.flatnonzero(holding)
        return found.astype(np.int64), scores[found]


def _spanned(segments: tuple[_Pairs, ...]) -> tuple[_Pairs, ...]:
    """``segments`` with where each slot's pairs start found now, while the state is moved, so no
    search pays for it."""
    for pairs in segments:
        _ = pairs.span
    return segments
