"""Exact scans from memory: the rows a compiled filter admits, held per table version.

A selective caller's rows lie scattered through the table, so reading them is random access: it
costs a hundred times more than scoring them, and reading the ten winners back takes longer than
scoring them all (figures: ``docs/performance.md``, the constants table). The flat plan keeps the rows it
scans (result columns and unit vectors) in memory under (filter text, table version). Any commit
(ingest, a tag update, an erasure) moves the version, so a held set only ever answers for the
exact state it was read from, and every row it returns is still post-checked by the enforcer.

Equal scores are ordered by chunk id (``best_first`` with ``id_ranks``): which rows a scan
returns, and in what order, depends on the visible rows alone, never on where they lie in the
table's files.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..deadline import check_deadline, remaining_seconds
from ..stages import work

ROW_OVERHEAD_BYTES = 64
SETS_KEPT = 65_536
"""At most so many sets held whatever their bytes: a caller sending a new filter at each search makes
a small set each time (its matches, read by id), and each held set costs its key and entry too."""


def id_ranks(chunk_ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each row's place in chunk-id order, for ``best_first`` to break ties by id."""
    order = pc.sort_indices(chunk_ids).to_numpy()
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = np.arange(len(order))
    return ranks


def unit_vectors(column: pa.ChunkedArray | pa.Array, dimension: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of norm 1 from a vector column, and which rows could be used (a missing, non-finite or
    zero vector cannot be ranked by cosine: it is never returned)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    vectors = np.zeros((len(array), dimension), dtype=np.float32)
    if valid.any():
        vectors[valid] = array.filter(pa.array(valid)).flatten().to_numpy().reshape(-1, dimension)
    norms = np.linalg.norm(vectors, axis=1)
    usable = valid & np.isfinite(norms) & (norms > 0)
    vectors[usable] /= norms[usable, None]
    vectors[~usable] = 0.0
    return np.ascontiguousarray(vectors), usable


def best_with_ties(positions: np.ndarray, scores: np.ndarray, take: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``take`` best of ``positions`` by ``scores``, and every one tied with the last of them."""
    if len(scores) <= take:
        return positions, scores
    floor = np.partition(scores, len(scores) - take)[len(scores) - take]
    kept = scores >= floor
    return positions[kept], scores[kept]


def best_first(
    scores: np.ndarray, k: int, eligible: np.ndarray | None = None, ties: np.ndarray | None = None
) -> np.ndarray:
    """Positions of the ``k`` highest ``scores`` (among the ``eligible`` ones: a boolean mask, None
    for all), best first, equal scores in order of ``ties`` (None: of position)."""
    positions = np.arange(len(scores)) if eligible is None else np.flatnonzero(eligible)
    take = min(k, len(positions))
    if take < 1:
        return positions[:0]
    positions, values = best_with_ties(positions, scores[positions], take)
    order = positions if ties is None else ties[positions]
    return positions[np.lexsort((order, -values))[:take]]


@dataclass(frozen=True, kw_only=True)
class VisibleRows:
    """The rows one filter admitted at one table version: their columns and unit vectors."""

    rows: pa.Table  # the result columns, one row per vector below
    vectors: np.ndarray  # (n, d) float32, rows of norm 1
    ranks: np.ndarray | None = None  # (n,) each row's place in chunk-id order; None: row order

    @classmethod
    def from_arrow(cls, table: pa.Table, dimension: int) -> VisibleRows:
        """From rows with a ``vector`` column. A row whose vector is missing, not finite or zero
        cannot be ranked by cosine, so it is left out (a scan never returns it)."""
        vectors, usable = unit_vectors(table.column("vector"), dimension)
        rows = table.drop_columns(["vector"]).filter(pa.array(usable)).combine_chunks()
        return cls(rows=rows, vectors=np.ascontiguousarray(vectors[usable]), ranks=id_ranks(rows.column("chunk_id")))

    def retagged(self, current: pa.Table, read: Callable[[list[str]], pa.Table | None]) -> VisibleRows | None:
        """The set a filter admits now, from ``current`` (the ``chunk_id`` and tag columns of the
        rows it admits now) and these rows, read at an earlier version: a row held here keeps its
        content and vector (fixed for a chunk id) and takes its current tags; a row not held here
        is read with ``read(chunk_ids)`` (rows with a ``vector`` column). None when ``read`` finds
        that version gone.

        Why: after an ingest or a sync the rows a broad caller may read are mostly the ones it held;
        reading their ids and tags costs a fraction of reading their texts and vectors again."""
        held_ids = self.rows.column("chunk_id").combine_chunks()
        current_ids = current.column("chunk_id").combine_chunks()
        if current_ids.slice(0, len(held_ids)).equals(held_ids):  # the usual case after an append: no lookup
            held = pa.array(np.arange(len(current_ids)) < len(held_ids))
            kept = np.arange(len(held_ids))
        else:
            positions = pc.index_in(current_ids, value_set=held_ids)
            held = positions.is_valid()
            kept = positions.filter(held).to_numpy(zero_copy_only=False).astype(np.int64)
        new_ids = current_ids.filter(pc.invert(held)).to_pylist()
        in_place = len(kept) == len(self.vectors) and bool((kept == np.arange(len(kept))).all())
        content = self.rows.select([name for name in self.rows.column_names if name not in current.column_names])
        content = content if in_place else content.take(kept)  # every row still here, in order: nothing to move
        rows = pa.Table.from_arrays([*content.columns, *current.filter(held).columns],
                                    names=[*content.column_names, *current.column_names])  # fmt: skip
        rows = rows.select(self.rows.column_names).cast(self.rows.schema)
        vectors = self.vectors if in_place else self.vectors[kept]
        if new_ids:
            added = read(new_ids)
            if added is None:
                return None
            more = VisibleRows.from_arrow(added, self.vectors.shape[1])
            rows = pa.concat_tables([rows, more.rows.select(self.rows.column_names).cast(self.rows.schema)])
            vectors = np.concatenate([vectors, more.vectors])
        rows = rows.combine_chunks()
        return VisibleRows(rows=rows, vectors=np.ascontiguousarray(vectors), ranks=id_ranks(rows.column("chunk_id")))

    def narrowed(self, chunk_ids: pa.Array) -> VisibleRows:
        """The rows of this set among ``chunk_ids`` (what a narrowing filter matches at its version)."""
        mask = pc.is_in(self.rows.column("chunk_id"), value_set=chunk_ids)
        rows = self.rows.filter(mask)
        vectors = np.ascontiguousarray(self.vectors[mask.to_numpy(zero_copy_only=False)])
        return VisibleRows(rows=rows, vectors=vectors, ranks=id_ranks(rows.column("chunk_id")))

    @property
    def nbytes(self) -> int:
        ranks = 0 if self.ranks is None else self.ranks.nbytes
        return int(self.vectors.nbytes + self.rows.nbytes + ranks + ROW_OVERHEAD_BYTES * self.rows.num_rows)

    def top(self, query: np.ndarray, k: int) -> list[tuple[dict[str, Any], float]]:
        """The ``k`` best rows with their cosine similarity, best first (ties: smaller chunk id)."""
        norm = float(np.linalg.norm(query))
        if k < 1 or not len(self.vectors) or not np.isfinite(norm) or norm == 0:
            return []
        work("rows_scored", len(self.vectors))
        scores = self.vectors @ (np.asarray(query, dtype=np.float32) / norm)
        best = best_first(scores, k, ties=self.ranks)
        return list(zip(self.rows.take(pa.array(best)).to_pylist(), scores[best].tolist(), strict=True))


class Held(Protocol):
    """What the cache holds: anything that says how many bytes it occupies."""

    @property
    def nbytes(self) -> int: ...


HeldT = TypeVar("HeldT", bound=Held)


class VisibleRowCache:
    """Sets of visible rows by key, least recently used evicted past ``max_bytes``: a scan's
    ``VisibleRows`` under (filter, table version), a caller's ``LexicalRows`` under (filter, table
    version, caller). Both kinds share the one budget, so it bounds what a process holds.

    A set larger than a quarter of the budget is not worth evicting the others for: ``fits`` says
    so before a scan's rows are read (from the row count), ``holds`` once a set's size is known,
    and such a set is returned for the search at hand but not kept.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, Held] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._loading: dict[Hashable, Future[Any]] = {}
        self.loads = 0  # sets read (for monitoring: a commit under load should cost one read, not one per request)

    def fits(self, rows: int, dimension: int) -> bool:
        return self.holds(rows * (4 * dimension + ROW_OVERHEAD_BYTES))

    def holds(self, nbytes: int) -> bool:
        """Whether a set of ``nbytes`` would be kept."""
        return nbytes <= self.max_bytes // 4

    def peek(self, key: Hashable) -> Held | None:
        """The set held for ``key``, if any, without loading one (nor counting it as used)."""
        with self._lock:
            return self._items.get(key)

    def get(self, key: Hashable, load: Callable[[], HeldT | None]) -> HeldT | None:
        """The held set for ``key``, else ``load()``'s (kept unless it is None or too large).
        Concurrent misses of one key share one load: after a commit, the searches that arrive
        together read the new version's rows once, not once each."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return cast(HeldT, self._items[key])
            pending = self._loading.get(key)
            leader = pending is None
            if leader:
                pending = self._loading[key] = Future()
        assert pending is not None
        if not leader:
            while True:
                try:
                    return cast("HeldT | None", pending.result(timeout=remaining_seconds()))
                except FutureTimeout:  # this search's deadline came while another's load went on
                    check_deadline()
                except BaseException:  # the other load's failure is not this search's: try itself
                    return self.get(key, load)
        try:
            self.loads += 1
            value = load()
        except BaseException as exc:
            with self._lock:
                del self._loading[key]
            pending.set_exception(exc)
            raise
        with self._lock:
            del self._loading[key]
            if value is not None and self.holds(value.nbytes) and key not in self._items:
                self._items[key] = value
                self._bytes += value.nbytes
            while (self._bytes > self.max_bytes or len(self._items) > SETS_KEPT) and self._items:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= evicted.nbytes
        pending.set_result(value)
        return value

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
