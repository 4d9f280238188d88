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

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..governance.compiler import SubjectView
from ..stages import work
from ..state import ChunkReads
from .hits import CONTENT_COLUMNS
from .resident import ResidentIndex
from .resident_lexical import ResidentTerms
from .resident_tags import NO_SET, TAG_READ_COLUMNS, ResidentTags, SetCatalog, by_fragment, split_addresses
from .visible_rows import unit_vectors

FRESH_COLUMNS = [*CONTENT_COLUMNS, "vector", *[c for c in TAG_READ_COLUMNS if c not in CONTENT_COLUMNS]]


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

    def visible(self, view: SubjectView, satisfied: frozenset[str]) -> np.ndarray:
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
        slots = np.asarray(slots, dtype=np.int64)
        held = slots < self.index.rows
        content: list[dict[str, Any]] = [{}] * len(slots)
        if held.any():
            for at, row in zip(np.flatnonzero(held), self.index.content.take(pa.array(slots[held])).to_pylist(), strict=True):
                content[at] = row
        if (~held).any():
            fresh = self.fresh.take(pa.array(slots[~held] - self.index.rows)).to_pylist()
            for at, row in zip(np.flatnonzero(~held), fresh, strict=True):
                content[at] = row
        return [{**said, **tags} for said, tags in zip(content, self.tags.current(slots), strict=True)]

    def chunk_ids_of(self, slots: np.ndarray) -> list[str]:
        held = slots < self.index.rows
        ids = np.empty(len(slots), dtype=object)
        ids[held] = self.index.chunk_ids.take(pa.array(slots[held])).to_pylist()
        ids[~held] = self.fresh.column("chunk_id").take(pa.array(slots[~held] - self.index.rows)).to_pylist()
        return list(ids)

    def lexical(self, allowed: np.ndarray, terms: list[str], k: int) -> list[tuple[dict[str, Any], float]]:
        """The ``k`` best of the ``allowed`` slots holding a query term, by BM25 over the allowed
        slots alone, best first, equal scores by chunk id."""
        if k < 1:
            return []
        slots, scores = self.terms.scores(allowed, terms)
        if len(slots) > k:  # the k best and every score tied with the last of them
            floor = np.partition(scores, len(scores) - k)[len(scores) - k]
            kept = scores >= floor
            slots, scores = slots[kept], scores[kept]
        order = sorted(zip((-scores).tolist(), self.chunk_ids_of(slots), range(len(slots))))[:k]
        chosen = np.asarray([at for _, _, at in order], dtype=np.int64)
        return list(zip(self.rows_of(slots[chosen]), scores[chosen].tolist(), strict=True))

    def nearest(self, query: np.ndarray, allowed: np.ndarray, k: int, *, exact: bool) -> list[tuple[dict[str, Any], float]]:
        """The ``k`` nearest of the ``allowed`` slots (a mask) with their cosine, best first, equal
        scores by chunk id: content from the index or the fresh rows, tags from this version."""
        rows = self.index.rows
        held = allowed[:rows] & self.index.usable
        visible = int(np.count_nonzero(held))
        positions, scores = self.index.search(query, np.packbits(held, bitorder="little"), visible, k, exact=exact)
        ranked = list(zip(self.rows_of(positions), scores.tolist(), strict=True))
        fresh = np.flatnonzero(allowed[rows:] & self.fresh_usable)
        if len(fresh):
            work("rows_scored", len(fresh))
            fresh_scores = self.fresh_vectors[fresh] @ query
            best = np.argsort(-fresh_scores, kind="stable")[:k]
            ranked += list(zip(self.rows_of(fresh[best] + rows), fresh_scores[best].tolist(), strict=True))
        return sorted(ranked, key=lambda item: (-item[1], item[0]["chunk_id"]))[:k]


def build_state(chunks: ChunkReads, index: ResidentIndex) -> ResidentState | None:
    """The tags of every row at the index's version, its slots the index's positions; None when
    that version is gone (the index is then built again from the table)."""
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
    addresses = table.column("_rowaddr").to_numpy()
    tags = ResidentTags(version=index.version, catalog=catalog, row_sets=row_sets, citations=citations,
                        fragments=fragments, addresses=by_fragment(addresses, slots))  # fmt: skip
    empty = pa.schema([index.content.schema.field(name) for name in CONTENT_COLUMNS]).empty_table()
    terms = ResidentTerms.empty().extended(index.content.column("text"), np.arange(index.rows), index.rows)
    return ResidentState(index=index, tags=tags, fresh=empty, fresh_vectors=np.empty((0, index.graph.d), np.float32),
                         fresh_usable=np.empty(0, bool), fresh_slots={}, terms=terms)  # fmt: skip


def advanced(state: ResidentState, chunks: ChunkReads, version: int) -> ResidentState | None:
    """``state`` moved to ``version`` by the commits between (their fragments); None when a
    version it needs is gone (the caller then builds again)."""
    if version == state.version:
        return state
    fragments = chunks.fragments_at(version)
    if fragments is None:
        return None
    tags = state.tags
    row_sets, citations = tags.row_sets.copy(), tags.citations
    addresses = dict(tags.addresses)
    kept = fragments.keys() & tags.fragments.keys()
    rewritten = {f for f in kept if fragments[f][0] != tags.fragments[f][0]}  # columns updated in place: read again
    for gone in (tags.fragments.keys() - fragments.keys()) | rewritten:
        _, slots = addresses.pop(gone, (None, np.empty(0, np.int64)))
        row_sets[slots] = NO_SET
    changed = sorted(f for f in kept - rewritten if fragments[f][1] != tags.fragments[f][1])
    if changed:
        live = chunks.fragment_rows(version, changed, [])
        if live is None:
            return None
        live_fragments, live_offsets = split_addresses(live.column("_rowaddr").to_numpy())
        for fragment in changed:
            offsets, slots = addresses.get(fragment, (np.empty(0, np.int64), np.empty(0, np.int64)))
            kept = np.isin(offsets, live_offsets[live_fragments == fragment], assume_unique=True)
            row_sets[slots[~kept]] = NO_SET
            addresses[fragment] = (offsets[kept], slots[kept])
    added = sorted((fragments.keys() - tags.fragments.keys()) | rewritten)
    fresh, vectors, usable, fresh_slots = state.fresh, state.fresh_vectors, state.fresh_usable, dict(state.fresh_slots)
    terms = state.terms
    if added:
        table = chunks.fragment_rows(version, added, FRESH_COLUMNS)
        if table is None:
            return None
        codes = state.tags.catalog.codes(table)
        slots = state.index.positions(table.column("chunk_id"))
        ids = table.column("chunk_id").to_pylist()
        unheld = np.flatnonzero(slots < 0)
        new_rows = []
        for at in unheld.tolist():
            slot = fresh_slots.get(ids[at])
            if slot is None:
                slot = fresh_slots[ids[at]] = state.index.rows + fresh.num_rows + len(new_rows)
                new_rows.append(at)
            slots[at] = slot
        if new_rows:
            taken = table.take(pa.array(new_rows, pa.int64()))
            more, more_usable = unit_vectors(taken.column("vector"), state.index.graph.d)
            first = state.index.rows + fresh.num_rows
            terms = terms.extended(taken.column("text"), np.arange(first, first + len(new_rows)), first + len(new_rows))
            fresh = pa.concat_tables([fresh, taken.select(CONTENT_COLUMNS).cast(fresh.schema)]).combine_chunks()
            vectors, usable = np.concatenate([vectors, more]), np.concatenate([usable, more_usable])
            row_sets = np.concatenate([row_sets, np.full(len(new_rows), NO_SET, dtype=np.int32)])
            citations = np.concatenate([citations, np.zeros((len(new_rows), 2), dtype=np.int32)])
        row_sets[slots] = codes
        citations = citations.copy() if citations is tags.citations else citations
        citations[slots] = state.tags.catalog.citation_codes(table)
        addresses.update(by_fragment(table.column("_rowaddr").to_numpy(), slots))
    next_tags = replace(tags, version=version, row_sets=row_sets, citations=citations, fragments=fragments,
                        addresses=addresses)  # fmt: skip
    return replace(state, tags=next_tags, fresh=fresh, fresh_vectors=vectors, fresh_usable=usable, fresh_slots=fresh_slots,
                   terms=terms)  # fmt: skip
