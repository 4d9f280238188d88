"""The serving index and every row's governance tags at one table version, moved to the next
version by what each commit changed.

Row slots: slot ``p < index.rows`` is the index's position ``p`` (the row of that chunk id, whose
content and vector the index holds); the rows written since the index was built whose chunk ids
it does not hold follow, with their content and vectors held here ("fresh"). A re-tag rewrites a
row under its chunk id, so it only changes the slot's tag set.

A commit's delta is read from Lance's fragments (``ChunkReads.fragments_at``): the fragments new
at the next version hold every row the commit wrote (read whole: tags, content, vector), and a
fragment whose deletion mark changed is re-read for its live row addresses, so the rows the commit
removed lose their slots. The work is the rows written plus the addresses of the fragments a
commit removed rows from, never the table. A state is immutable; ``advanced`` returns the next.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..governance.compiler import SubjectView
from ..stages import work
from ..state import IN_LIST_MAX_IDS, ChunkReads
from .hits import CONTENT_COLUMNS
from .patched import Patched
from .resident import ResidentIndex, inner_products
from .resident_lexical import ResidentTerms, TermPairs, TermVocabulary
from .resident_tags import NO_ADDRESS, NO_SET, TAG_READ_COLUMNS, Readable, ResidentTags, SetCatalog, split_addresses
from .visible_rows import best_with_ties, unit_vectors

WHOLE_READ_ROWS = 20_000
"""Fragments a delta added or rewrote holding at most so many rows (as written) are read once, tags
with content and vectors (a commit's own fragments); larger ones (a compaction) for their tags,
then the new rows' content by id."""


@dataclass(frozen=True, kw_only=True)
class ResidentState:
    """The index and the tags of every row at ``tags.version``."""

    index: ResidentIndex
    tags: ResidentTags
    fresh: pa.Table  # CONTENT_COLUMNS of the slots past the index's, in slot order
    fresh_vectors: np.ndarray  # (fresh rows, d) float32 of norm 1 (0 where unusable)
    fresh_usable: np.ndarray  # (fresh rows,) bool
    fresh_slots: Mapping[str, int]  # chunk id -> slot, for the fresh rows
    terms: ResidentTerms  # every slot's terms, for BM25 over a caller's slots

    @property
    def version(self) -> int:
        return self.tags.version

    @property
    def nbytes(self) -> int:
        """What this state holds beyond the index (tags, fresh rows)."""
        held = self.tags.nbytes + self.terms.nbytes + self.fresh.nbytes + self.fresh_vectors.nbytes
        return int(held + 100 * len(self.fresh_slots))

    @property
    def fresh_rows(self) -> int:
        return self.fresh.num_rows

    def visible(self, view: SubjectView, satisfied: frozenset[str]) -> Readable:
        """The slots ``view`` may read (``satisfied``: the clause tokens it satisfies)."""
        return self.tags.visible(view, satisfied)

    def slots_of(self, chunk_ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The slots holding ``chunk_ids`` (those that are none's are left out)."""
        positions = self.index.positions(chunk_ids)
        slots = positions[positions >= 0]
        if self.fresh_slots:
            more = [self.fresh_slots[c] for c in pc.filter(chunk_ids, pa.array(positions < 0)).to_pylist() if c in self.fresh_slots]
            slots = np.concatenate([slots, np.asarray(more, dtype=np.int64)])
        return slots

    def rows_of(self, slots: np.ndarray) -> list[dict[str, Any]]:
        """What ``slots`` say (content from the index or the fresh rows) with their tags at this version."""
        content = _content(self.index, self.fresh, slots, CONTENT_COLUMNS).to_pylist()
        return [{**said, **tags} for said, tags in zip(content, self.tags.current(slots), strict=True)]

    def chunk_ids_of(self, slots: np.ndarray) -> list[str]:
        return _content(self.index, self.fresh, slots, ["chunk_id"]).column("chunk_id").to_pylist()

    def lexical(self, allowed: Readable, terms: list[str], k: int) -> list[tuple[dict[str, Any], float]]:
        """The ``k`` best of the ``allowed`` slots holding a query term, by BM25 over the allowed
        slots alone, best first, equal scores by chunk id."""
        return self.materialised(self.ranked_lexical(allowed, terms, k))

    def nearest(self, query: np.ndarray, allowed: np.ndarray, k: int, *, exact: bool) -> list[tuple[dict[str, Any], float]]:
        """The ``k`` nearest of the ``allowed`` slots (a mask) with their cosine, best first, equal
        scores by chunk id: content from the index or the fresh rows, tags from this version."""
        return self.materialised(self.ranked_nearest(query, allowed, k, exact=exact))

    def ranked_lexical(self, allowed: Readable, terms: list[str], k: int) -> list[Ranked]:
        """``lexical``'s ranking, as slots and chunk ids (no row read yet)."""
        if k < 1:
            return []
        slots, scores = self.terms.scores(allowed.sets, allowed.mask, terms)
        return self._ordered(*best_with_ties(slots, scores, k), k)

    def ranked_nearest(self, query: np.ndarray, allowed: np.ndarray, k: int, *, exact: bool) -> list[Ranked]:
        """``nearest``'s ranking, as slots and chunk ids (no row read yet). A fresh row's score,
        as an indexed row's, is computed from the row and the query alone (faiss's kernel row by
        row): never rounded differently because of the other rows scored beside it."""
        rows = self.index.rows
        held = allowed[:rows] & self.index.usable
        positions, scores = self.index.search(query, held, k, exact=exact)
        fresh = np.flatnonzero(allowed[rows:] & self.fresh_usable)
        if len(fresh):
            work("rows_scored", len(fresh))
            fresh_scores = inner_products(np.ascontiguousarray(self.fresh_vectors[fresh]), query)
            best = np.argsort(-fresh_scores, kind="stable")[:k]
            positions, scores = np.concatenate([positions, fresh[best] + rows]), np.concatenate([scores, fresh_scores[best]])
        return self._ordered(positions, scores, k)

    def _ordered(self, slots: np.ndarray, scores: np.ndarray, k: int) -> list[Ranked]:
        """The ``k`` best of ``slots`` by ``scores``, equal scores by chunk id."""
        ranked = [Ranked(slot=int(slot), chunk_id=chunk_id, score=float(score))
                  for slot, chunk_id, score in zip(slots.tolist(), self.chunk_ids_of(slots), scores.tolist(), strict=True)]  # fmt: skip
        return sorted(ranked, key=lambda r: (-r.score, r.chunk_id))[:k]

    def materialised(self, ranked: Sequence[Ranked]) -> list[tuple[dict[str, Any], float]]:
        """What the ``ranked`` slots say, with their tags at this version, and their scores."""
        rows = self.rows_of(np.asarray([r.slot for r in ranked], dtype=np.int64))
        return list(zip(rows, [r.score for r in ranked], strict=True))


@dataclass(frozen=True, kw_only=True)
class Ranked:
    """One slot of a ranking: where it is, the chunk id it holds, its score."""

    slot: int
    chunk_id: str
    score: float


def index_terms(index: ResidentIndex) -> TermPairs:
    """The terms of every row the index holds, by position (stored beside its artifact)."""
    return TermPairs.of_texts(index.content.column("text"), np.arange(index.rows), TermVocabulary())


def build_state(chunks: ChunkReads, index: ResidentIndex, terms: TermPairs | None = None) -> ResidentState | None:
    """The tags of every row at the index's version, its slots the index's positions, with the
    rows' ``terms`` (analysed here when not given); None when that version is gone (the index is
    then built again from the table)."""
    fragments = chunks.fragments_at(index.version)
    if fragments is None:
        return None
    table = chunks.fragment_rows(index.version, sorted(fragments), TAG_READ_COLUMNS)
    if table is None:
        return None
    catalog = SetCatalog()
    codes = catalog.codes(table)
    slots = index.positions(table.column("chunk_id"))
    if (slots < 0).any():  # a row the index does not hold at its own version: not this index's table
        return None
    row_sets = np.full(index.rows, NO_SET, dtype=np.int32)
    row_sets[slots] = codes
    citations = np.zeros((index.rows, 2), dtype=np.int32)
    citations[slots] = catalog.citation_codes(table)
    addresses = np.full(index.rows, NO_ADDRESS, dtype=np.int64)
    addresses[slots] = table.column("_rowaddr").to_numpy().astype(np.int64)
    tags = ResidentTags(version=index.version, catalog=catalog, row_sets=Patched.of(row_sets, fill=NO_SET),
                        citations=Patched.of(citations, fill=0), fragments=fragments,
                        addresses=Patched.of(addresses, fill=NO_ADDRESS))  # fmt: skip
    empty = pa.schema([index.content.schema.field(name) for name in CONTENT_COLUMNS]).empty_table()
    placed = ResidentTerms.placed_in(terms if terms is not None else index_terms(index), row_sets)
    return ResidentState(index=index, tags=tags, fresh=empty, fresh_vectors=np.empty((0, index.graph.d), np.float32),
                         fresh_usable=np.empty(0, bool), fresh_slots={}, terms=placed)  # fmt: skip


def advanced(state: ResidentState, chunks: ChunkReads, version: int) -> ResidentState | None:
    """``state`` moved to ``version`` by the commits between (their fragments); None when a
    version it needs is gone (the caller then builds again). Rows removed first, then the rows
    the commits wrote added, so a re-tagged row is never held under both its old and new tags."""
    if version == state.version:
        return state
    fragments = chunks.fragments_at(version)
    if fragments is None:
        return None
    tags = state.tags
    kept = fragments.keys() & tags.fragments.keys()
    rewritten = {f for f in kept if fragments[f][0] != tags.fragments[f][0]}  # columns updated in place: read again
    added = sorted((fragments.keys() - tags.fragments.keys()) | rewritten)
    size = chunks.physical_rows(version, added) if added else 0
    if size is None:
        return None
    whole = size <= WHOLE_READ_ROWS  # a commit's few rows: content and vectors read with the tags, in one pass
    columns = [*TAG_READ_COLUMNS, *(c for c in CONTENT_COLUMNS if c not in TAG_READ_COLUMNS), "vector"] if whole else TAG_READ_COLUMNS
    written = chunks.fragment_rows(version, added, columns) if added else None
    if added and written is None:
        return None
    fresh_slots = dict(state.fresh_slots)
    slots, new_ids = _slots_of(state, written, fresh_slots) if written is not None else (np.empty(0, np.int64), [])
    total = len(tags.row_sets) + len(new_ids)
    gone = _held_in(tags.addresses, (tags.fragments.keys() - fragments.keys()) | rewritten)  # a pass, when any
    changed = sorted(f for f in kept - rewritten if fragments[f][1] != tags.fragments[f][1])
    if changed:
        removed = _removed(state, chunks, version, fragments, changed, slots)
        if removed is None:
            return None
        gone = np.concatenate([gone, removed])
    fresh, vectors, usable, terms = state.fresh, state.fresh_vectors, state.fresh_usable, state.terms
    row_sets, citations = tags.row_sets.with_values(gone, np.full(len(gone), NO_SET), length=total), tags.citations
    addresses = tags.addresses.with_values(gone, np.full(len(gone), NO_ADDRESS), length=total)
    if written is not None:
        new_texts = None
        if new_ids:
            taken = _in_order(written, new_ids) if whole else _content_of(chunks, version, added, new_ids)
            if taken is None:
                return None
            more, more_usable = unit_vectors(taken.column("vector"), state.index.graph.d)
            new_texts = taken.column("text")
            fresh = pa.concat_tables([fresh, taken.select(CONTENT_COLUMNS).cast(fresh.schema)]).combine_chunks()
            vectors, usable = np.concatenate([vectors, more]), np.concatenate([usable, more_usable])
        row_sets = row_sets.with_values(slots, tags.catalog.codes(written))  # after the removals: a rewritten row stays
        citations = citations.with_values(slots, tags.catalog.citation_codes(written), length=total)
        addresses = addresses.with_values(slots, written.column("_rowaddr").to_numpy().astype(np.int64))
        terms = _terms_placed(terms, state.index, fresh, row_sets, slots, new_texts)
    next_tags = replace(tags, version=version, row_sets=row_sets, citations=citations, fragments=fragments,
                        addresses=addresses)  # fmt: skip
    return replace(state, tags=next_tags, fresh=fresh, fresh_vectors=vectors, fresh_usable=usable, fresh_slots=fresh_slots,
                   terms=terms)  # fmt: skip


def _terms_placed(
    terms: ResidentTerms, index: ResidentIndex, fresh: pa.Table, row_sets: Patched, written: np.ndarray,
    new_texts: pa.ChunkedArray | None,
) -> ResidentTerms:
    """``terms`` with the new slots' (past those ``terms`` holds; their texts ``new_texts``) and
    those of the ``written`` slots whose tag set changed, analysed again from the text this state
    holds (a chunk id's text never changes), filed under their sets in ``row_sets``."""
    held = len(terms.lengths)
    rewritten = np.unique(written[written < held])
    moved = rewritten[row_sets.take(rewritten) != terms.placed.take(rewritten)]
    texts = [_content(index, fresh, moved, ["text"]).column("text")]
    if new_texts is not None:
        texts.append(new_texts)
    slots = np.concatenate([moved, np.arange(held, len(row_sets))])
    joined = pa.chunked_array([chunk.cast(pa.large_string()) for text in texts for chunk in pa.chunked_array(text).chunks],
                              pa.large_string())  # fmt: skip
    pairs = TermPairs.of_texts(joined, slots, terms.vocabulary)
    return terms.with_rows(pairs, row_sets.take(slots), len(row_sets))


def _content(index: ResidentIndex, fresh: pa.Table, slots: np.ndarray, columns: Sequence[str]) -> pa.Table:
    """``columns`` of ``slots``, in their order: from the index for a position it holds, else from
    the fresh rows (which follow the index's positions)."""
    slots = np.asarray(slots, dtype=np.int64)
    held = slots < index.rows
    parts = pa.concat_tables([index.content.select(columns).take(pa.array(slots[held])),
                              fresh.select(columns).take(pa.array(slots[~held] - index.rows))])  # fmt: skip
    back = np.argsort(np.concatenate([np.flatnonzero(held), np.flatnonzero(~held)]), kind="stable")  # to the slots' order
    return parts.take(pa.array(back))


def _slots_of(state: ResidentState, written: pa.Table, fresh_slots: dict[str, int]) -> tuple[np.ndarray, list[str]]:
    """The slot of each written row (the index's position of its chunk id, else its fresh slot,
    a new one for an id never held: added to ``fresh_slots``), and the ids given new slots."""
    slots = state.index.positions(written.column("chunk_id"))
    unheld = np.flatnonzero(slots < 0)
    new_ids: list[str] = []
    for at, chunk_id in zip(unheld.tolist(), written.column("chunk_id").take(pa.array(unheld, pa.int64())).to_pylist(), strict=True):
        slot = fresh_slots.get(chunk_id)
        if slot is None:
            slot = fresh_slots[chunk_id] = state.index.rows + state.fresh.num_rows + len(new_ids)
            new_ids.append(chunk_id)
        slots[at] = slot
    return slots, new_ids


def _removed(
    state: ResidentState, chunks: ChunkReads, version: int, fragments: Mapping[int, tuple[str, str, int]],
    changed: list[int], written_slots: np.ndarray,
) -> np.ndarray | None:
    """The slots of the rows the commits removed from ``changed`` fragments; None when a version
    it needs is gone.

    Where every commit since was a merge by chunk id (Lance's ``Update`` in ``rewrite_rows`` mode,
    which removes the old row of every id it writes) and a fragment lost exactly as many rows as it
    held of the ids written (their addresses before say where they were), those are the rows it
    lost, and each is written again under its slot: nothing to remove, nothing read, no pass over
    the rows. Any other fragment is read for its live row addresses, and the rows held there
    found by a pass over the addresses (a delete's cost)."""
    kinds = chunks.commit_kinds(state.version, version)
    merges_only = kinds is not None and all(kind == "Update:rewrite_rows" for kind in kinds)
    addresses = state.tags.addresses
    before = addresses.take(np.unique(written_slots[written_slots < len(addresses)]))  # where each written row was
    held_in = split_addresses(before[before >= 0])[0]
    unresolved: list[int] = []
    removed: list[np.ndarray] = []
    for fragment in changed:
        lost = fragments[fragment][2] - state.tags.fragments[fragment][2]
        if not merges_only or int(np.count_nonzero(held_in == fragment)) != lost:
            unresolved.append(fragment)
    if unresolved:
        live = chunks.fragment_rows(version, unresolved, [])
        if live is None:
            return None
        live_fragments, live_offsets = split_addresses(live.column("_rowaddr").to_numpy())
        held = _held_in(addresses, set(unresolved))
        held_fragments, held_offsets = split_addresses(addresses.take(held))
        for fragment in unresolved:
            mine, alive = held_fragments == fragment, live_offsets[live_fragments == fragment]
            marks = np.zeros(int(max(held_offsets[mine].max(initial=-1), alive.max(initial=-1))) + 1, dtype=bool)
            marks[alive] = True
            removed.append(held[mine][~marks[held_offsets[mine]]])  # a mask by offset: linear
    return np.concatenate(removed) if removed else np.empty(0, np.int64)


def _held_in(addresses: Patched, fragments: set[int]) -> np.ndarray:
    """The slots whose rows are held in ``fragments``: a pass over every slot's address (when a
    fragment went or was rewritten, or lost rows a merge does not explain)."""
    if not fragments:
        return np.empty(0, np.int64)
    every = addresses.dense()
    return np.flatnonzero((every >= 0) & np.isin(split_addresses(np.maximum(every, 0))[0], sorted(fragments))).astype(np.int64)


def _content_of(chunks: ChunkReads, version: int, fragments: list[int], chunk_ids: list[str]) -> pa.Table | None:
    """The content and vectors of ``chunk_ids`` (rows of large ``fragments`` at ``version``: a
    compaction's, whose rows the index mostly holds), in that order: read by id when they are few
    (no vector of a row the index holds is read), else the fragments whole (a bulk write)."""
    columns = [*CONTENT_COLUMNS, "vector"]
    if len(chunk_ids) <= IN_LIST_MAX_IDS:
        found = chunks.read_rows_at(version, "TRUE", chunk_ids, columns)
    else:
        found = chunks.fragment_rows(version, fragments, columns)
    return None if found is None else _in_order(found, chunk_ids)


def _in_order(found: pa.Table, chunk_ids: list[str]) -> pa.Table:
    """The rows of ``found`` holding ``chunk_ids``, in that order."""
    return found.take(pc.index_in(pa.array(chunk_ids), value_set=found.column("chunk_id")))
