"""Every row's terms held in this process, grouped by tag set, for BM25 over any caller's visible
rows without reading or analysing them again.

Why: analysing a caller's visible texts at its first search of each table version cost seconds
(2.5 s at 1M rows for a broad caller). Here the texts are analysed once, when the serving index
is built, and the rows each commit adds when the state moves; a search then takes N, the
document frequencies and the average length over the caller's visible slots (the resident mask),
so scores equal BM25 over exactly those rows (``lexical``'s analyser and formula).

The shape of the work, and why it is not a postings walk over the table: a term's postings list
holds every row with the term, readable or not, so walking it costs what hidden rows contain, and
a caller choosing its query words could time that (the class of DESIGN §4's rule). Here the
postings are kept per (tag set, term): a search looks up only the sets its caller may read (the
verdicts the resident tags give), and takes, within them, the postings of its query's terms. The
work is the caller's own rows holding its query's terms, one lookup per (visible set, term), and
passes over the mask (the table's size in rows); a row of a set the caller cannot read is never
touched.

A commit's rows come as a segment of their own (a generation); a row whose tag set changed (a
re-tag) is analysed again and placed in the commit's segment under its new set, and ``owner`` says
which generation holds each slot's current postings, so the pairs it left behind are passed over.
Such left-behind pairs stay until the later segments are merged (past ``SEGMENTS_KEPT``) or the
serving index is built again: a search of a set a row left still looks at them (the rows that set
held), never at a row of a set it cannot read.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
from pyarrow import ipc

from ..errors import InvalidValueError
from ..stages import work
from .lexical import K1, VOCABULARY_ENTRY_BYTES, B, analyse
from .patched import Patched
from .resident import range_positions

_ARTIFACT_TYPES = {"vocabulary": pa.string(), "slot_of": pa.int32(), "term_of": pa.int32(), "frequency": pa.int32(),
                   "lengths": pa.int32()}  # fmt: skip

SEGMENTS_KEPT = 8
"""Segments past the first before the later ones are merged (each commit that adds or re-tags
rows adds one)."""

_TERM_BITS = 32


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


@dataclass(frozen=True, kw_only=True)
class TermPairs:
    """The (slot, term, frequency) of every distinct term of some slots' texts, and each of those
    slots' length in terms: what analysis gives, and what the serving index's artifact stores (for
    the slots ``0..len(lengths)``)."""

    vocabulary: TermVocabulary
    slots: np.ndarray  # (analysed slots,) int64
    lengths: np.ndarray  # (analysed slots,) int32
    slot_of: np.ndarray  # (pairs,) int32
    term_of: np.ndarray  # (pairs,) int32
    frequency: np.ndarray  # (pairs,) int32

    @classmethod
    def of_texts(cls, texts: pa.Array | pa.ChunkedArray, slots: np.ndarray, vocabulary: TermVocabulary) -> TermPairs:
        """The terms of ``texts``, one per slot of ``slots`` (ids from ``vocabulary``, new terms added)."""
        slots = np.asarray(slots, dtype=np.int64)
        analysed = analyse(texts)
        global_ids = vocabulary.ids(list(analysed.vocabulary))
        lengths = np.bincount(analysed.text_of, minlength=len(slots)).astype(np.int32)
        keys, counts = np.unique(slots[analysed.text_of] * (1 << 31) + global_ids[analysed.term_of], return_counts=True)
        return cls(vocabulary=vocabulary, slots=slots, lengths=lengths, slot_of=(keys >> 31).astype(np.int32),
                   term_of=(keys & ((1 << 31) - 1)).astype(np.int32), frequency=counts.astype(np.int32))  # fmt: skip

    def to_bytes(self) -> bytes:
        """These terms as one Arrow file (the serving index's artifact keeps it beside the graph);
        for the slots ``0..len(lengths)``."""
        columns = {"vocabulary": self.vocabulary.terms(), "slot_of": self.slot_of, "term_of": self.term_of,
                   "frequency": self.frequency, "lengths": self.lengths}  # fmt: skip
        table = pa.table({name: pa.array([values], pa.large_list(_ARTIFACT_TYPES[name])) for name, values in columns.items()})
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema) as out:
            out.write_table(table)
        return sink.getvalue().to_pybytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> TermPairs:
        """Terms ``to_bytes`` wrote. Raises ``InvalidValueError`` for anything else."""
        table = ipc.open_file(pa.BufferReader(data)).read_all()
        if table.num_rows != 1 or set(table.column_names) != set(_ARTIFACT_TYPES):
            raise InvalidValueError("not a terms artifact")
        column = {name: table.column(name).combine_chunks()[0].values for name in _ARTIFACT_TYPES}
        arrays = {name: np.asarray(column[name].to_numpy(zero_copy_only=False), dtype=np.int32)
                  for name in ("slot_of", "term_of", "frequency", "lengths")}  # fmt: skip
        if not len(arrays["slot_of"]) == len(arrays["term_of"]) == len(arrays["frequency"]):
            raise InvalidValueError("a terms artifact whose pairs differ in length")
        if len(arrays["slot_of"]) and not 0 <= int(arrays["slot_of"].min()) <= int(arrays["slot_of"].max()) < len(arrays["lengths"]):
            raise InvalidValueError("a terms artifact naming a slot it holds no length for")
        return cls(vocabulary=TermVocabulary.of(column["vocabulary"].to_pylist()),
                   slots=np.arange(len(arrays["lengths"]), dtype=np.int64), **arrays)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class _Postings:
    """One generation's pairs, grouped by (tag set, term): the pairs of key ``keys[i]`` are
    ``[starts[i], starts[i + 1])``."""

    generation: int
    keys: np.ndarray  # (distinct keys,) int64, ascending: (set + 1) << 32 | term
    starts: np.ndarray  # (distinct keys + 1,) int64
    slot_of: np.ndarray  # (pairs,) int32
    frequency: np.ndarray  # (pairs,) int32

    @classmethod
    def of(cls, generation: int, sets: np.ndarray, term_of: np.ndarray, slot_of: np.ndarray, frequency: np.ndarray) -> _Postings:
        """The pairs (``sets``: each pair's slot's tag set) grouped by key."""
        key = _keys(sets, term_of)
        order = np.argsort(key)  # order within a key is of no account: one pair per (slot, term)
        key = key[order]
        cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
        firsts = np.concatenate([[0], cuts]).astype(np.int64) if len(key) else np.empty(0, np.int64)
        return cls(generation=generation, keys=key[firsts], starts=np.append(firsts, len(key)).astype(np.int64),
                   slot_of=slot_of[order], frequency=frequency[order])  # fmt: skip

    def matching(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The positions of the pairs of the ``wanted`` keys, and which of them each one's is: work
        of those pairs and a lookup per key, none over other keys' pairs."""
        if not len(self.keys) or not len(wanted):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        at = np.minimum(np.searchsorted(self.keys, wanted), len(self.keys) - 1)
        found = np.flatnonzero(self.keys[at] == wanted)
        firsts, lasts = self.starts[at[found]], self.starts[at[found] + 1]
        return range_positions(firsts, lasts), np.repeat(found, lasts - firsts)

    def terms(self) -> np.ndarray:
        """Each pair's term id."""
        return np.repeat(self.keys & ((1 << _TERM_BITS) - 1), np.diff(self.starts)).astype(np.int32)

    @property
    def pairs(self) -> int:
        return len(self.slot_of)

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.starts.nbytes + self.slot_of.nbytes + self.frequency.nbytes)


def _keys(sets: np.ndarray, terms: np.ndarray) -> np.ndarray:
    """The key of (tag set, term): sets start at ``NO_SET`` (-1), so the key is never negative."""
    return ((np.asarray(sets, dtype=np.int64) + 1) << _TERM_BITS) | np.asarray(terms, dtype=np.int64)


@dataclass(frozen=True, kw_only=True)
class ResidentTerms:
    """Every slot's terms, grouped by the tag set the slot had when its terms were placed, and each
    slot's length in terms. ``owner[s]``: the generation holding slot ``s``'s current pairs;
    ``placed[s]``: the tag set they are filed under."""

    vocabulary: TermVocabulary
    segments: tuple[_Postings, ...]
    lengths: Patched  # (slots,) int32
    owner: Patched  # (slots,) int32, -1 for a slot never analysed
    placed: Patched  # (slots,) int32 tag set code

    @classmethod
    def placed_in(cls, pairs: TermPairs, row_sets: np.ndarray) -> ResidentTerms:
        """``pairs`` (of the slots ``0..len(row_sets)``) filed under each slot's tag set."""
        lengths = np.zeros(len(row_sets), np.int32)
        lengths[pairs.slots] = pairs.lengths
        owner = np.full(len(row_sets), -1, np.int32)
        owner[pairs.slots] = 0
        base = _Postings.of(0, row_sets[pairs.slot_of], pairs.term_of, pairs.slot_of, pairs.frequency)
        return cls(vocabulary=pairs.vocabulary, segments=(base,), lengths=Patched.of(lengths, fill=0),
                   owner=Patched.of(owner, fill=-1), placed=Patched.of(np.asarray(row_sets, dtype=np.int32).copy(), fill=-1))  # fmt: skip

    def with_rows(self, pairs: TermPairs, sets: np.ndarray, total_slots: int) -> ResidentTerms:
        """These terms for a state of ``total_slots`` slots, with ``pairs`` (new slots, or slots
        whose tag set changed, analysed again) filed under ``sets`` (one per analysed slot)."""
        if not len(pairs.slots) and total_slots == len(self.lengths):
            return self
        new = pairs.slots >= len(self.lengths)  # a slot held before keeps its length: its text never changes
        lengths = self.lengths.with_values(pairs.slots[new], pairs.lengths[new], length=total_slots)
        if not len(pairs.slots):
            return replace(self, lengths=lengths, owner=self.owner.with_values([], [], length=total_slots),
                           placed=self.placed.with_values([], [], length=total_slots))  # fmt: skip
        generation = self.segments[-1].generation + 1 if self.segments else 0
        owner = self.owner.with_values(pairs.slots, np.full(len(pairs.slots), generation), length=total_slots)
        placed = self.placed.with_values(pairs.slots, sets, length=total_slots)
        added = _Postings.of(generation, placed.take(pairs.slot_of), pairs.term_of, pairs.slot_of, pairs.frequency)
        segments = (*self.segments, added)
        if len(segments) > SEGMENTS_KEPT + 1:  # the later ones merged: work of the rows placed since the first
            merged, owner = _merged(segments[1:], owner, placed, generation + 1)
            segments = (segments[0], merged)
        return replace(self, segments=segments, lengths=lengths, owner=owner, placed=placed)

    @property
    def nbytes(self) -> int:
        held = self.lengths.nbytes + self.owner.nbytes + self.placed.nbytes + self.vocabulary.nbytes
        return int(held + sum(p.nbytes for p in self.segments))

    def scores(self, sets: np.ndarray, allowed: np.ndarray, terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """BM25 over the ``allowed`` slots (a mask; every one of them in one of the tag ``sets``)
        for the query ``terms`` (``query_terms``'s, a repeated term counted as often as it occurs):
        the slots holding an asked term, and their scores. N, document frequencies and average
        length count the allowed slots alone."""
        asked = Counter(terms)
        known = [(self.vocabulary.get(term), count) for term, count in asked.items()]
        known = [(term, count) for term, count in known if term is not None]
        documents = int(np.count_nonzero(allowed[: len(self.lengths)]))
        if not known or documents == 0 or not self.segments:
            return np.empty(0, np.int64), np.empty(0)
        average = self.lengths.sum_where(allowed) / documents
        if average == 0:
            return np.empty(0, np.int64), np.empty(0)
        ids = np.asarray([term for term, _ in known], dtype=np.int64)
        wanted = _keys(np.repeat(np.asarray(sets, dtype=np.int64), len(ids)), np.tile(ids, len(sets)))
        places, slot_parts, frequencies = [], [], []
        scanned = 0
        for postings in self.segments:  # the visible sets' postings of the asked terms, current pairs only
            positions, which = postings.matching(wanted)
            scanned += len(positions)
            slots = postings.slot_of[positions]
            current = allowed[slots] & (self.owner.take(slots) == postings.generation)
            places.append(which[current] % len(ids))
            slot_parts.append(slots[current])
            frequencies.append(postings.frequency[positions[current]])
        work("postings_scored", scanned)
        place, slots, held = np.concatenate(places), np.concatenate(slot_parts), np.concatenate(frequencies)
        scores = np.zeros(len(self.lengths))  # by slot: no sort of the matches, whatever their number
        for number, (_, count) in enumerate(known):  # term by term, in the query's order (so are sums' roundings)
            mine = place == number
            df = int(np.count_nonzero(mine))
            idf = math.log(1.0 + (documents - df + 0.5) / (df + 0.5))
            frequency = held[mine].astype(np.float64)
            at = slots[mine]  # one pair per (slot, term): no slot twice
            norm = K1 * (1.0 - B + B * self.lengths.take(at) / average)
            scores[at] += count * idf * frequency * (K1 + 1.0) / (frequency + norm)
        holding = np.zeros(len(self.lengths), dtype=bool)  # a pass over the slots, no sort of the matches
        holding[slots] = True
        found = np.flatnonzero(holding)
        return found.astype(np.int64), scores[found]


def _merged(segments: Sequence[_Postings], owner: Patched, placed: Patched, generation: int) -> tuple[_Postings, Patched]:
    """``segments``' current pairs as one generation (and ``owner`` moved to it), those left behind dropped."""
    slot_parts, term_parts, frequencies = [], [], []
    for postings in segments:
        current = owner.take(postings.slot_of) == postings.generation
        slot_parts.append(postings.slot_of[current])
        term_parts.append(postings.terms()[current])
        frequencies.append(postings.frequency[current])
    slot_of, term_of = np.concatenate(slot_parts), np.concatenate(term_parts)
    owner = owner.with_values(slot_of, np.full(len(slot_of), generation))
    return _Postings.of(generation, placed.take(slot_of), term_of, slot_of, np.concatenate(frequencies)), owner
