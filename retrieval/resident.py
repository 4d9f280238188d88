"""The resident serving index: one table's vectors and an HNSW graph (faiss) in this process's
memory, derived from the warehouse at one table version.

Why: through Lance's vector index a broad search pays a per-query overhead whatever it finds; a
graph in memory answers in a fraction of it (figures: ``docs/performance.md``, the constants table). The warehouse stays the only state:
the index is built from the ``chunks`` table (or loaded from an artifact ``optimize`` wrote) at a
known version, can be dropped and rebuilt at any time, and never decides what a caller may read.
The visible set comes from the current version through the caller's compiled filter, as a bitmap
over the index's positions; rows written after the index's version are scored exactly and merged.
A row's vector never changes under one ``chunk_id`` (ids name the text they were embedded from),
so the index's vectors stay right for every id it holds.

faiss rather than hnswlib or usearch: its HNSW takes a bitmap of allowed ids (``IDSelectorBitmap``)
evaluated in C++ inside the graph walk, where the others call a Python predicate per candidate.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidValueError
from ..stages import work
from ..state import TAG_COLUMNS
from .hits import CONTENT_COLUMNS
from .resident_codes import CodedQuery, ScanCodes, aligned_pieces
from .visible_rows import best_with_ties, unit_vectors

HNSW_M = 32
"""Neighbours per node (faiss's HNSW32; the FAISS peer of ``make bench`` uses the same)."""
EF_CONSTRUCTION = 160
"""Candidates kept while linking a row into the graph: fewer left rows that no filtered walk reached,
whatever its ``efSearch``, at a selective share of a large table; this many reached them all, at
twice the build time."""
EF_SEARCH = 256
"""Candidates a search keeps at least; more for a caller who sees a smaller share (``ef_search``):
the least that gives exact recall@10 to a broad caller of the synthetic world. Below
``GRAPH_MIN_SHARE`` no setting does, which is why such callers are scored exactly."""
VISIBLE_CANDIDATES = 128
"""Visible candidates a walk keeps (``ef_search``): enough to hold recall@10 >= 0.99 for a caller
whose rows lie in a few small clusters, where half as many did not."""
GRAPH_MIN_SHARE = 0.1
"""Below this share of the index visible, the visible rows are all scored (in faiss, through the
same mask): a filtered graph walk then visits mostly rows it may not return, and misses some it
should."""
ROW_OVERHEAD_BYTES = 96
SCAN_RUN_MIN = 64
"""A run of consecutive allowed positions at least this long is handed to faiss whole; the rows of
shorter runs by position."""
SCAN_PIECE_ROWS = 1 << 16
"""Rows of a run scored in one call; a scan of several such pieces is spread across the cores."""
CODED_BEST = 512
"""Coded scores a piece returns at first: enough that, for a caller of half of 500k synthetic
rows, no piece is searched again (at 256, two queries in five searched one again); a search for
512 costs little more than one for 50."""
_SCAN_POOL = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="resident-scan",
                                initializer=faiss.omp_set_num_threads, initargs=(1,))  # one core per piece: the pool spreads them  # fmt: skip


def resident_bytes(rows: int, dimension: int) -> int:
    """What an index of ``rows`` vectors occupies: the vectors and their 8-bit codes (with two
    float32 of each row's bound), the graph's links, the ids."""
    return rows * (5 * dimension + 8 + 2 * HNSW_M * 4 + ROW_OVERHEAD_BYTES)


ADD_ROWS = 50_000
"""Rows added to the graph at once while building: a stop is heeded between two additions."""


class Stopped(Exception):
    """A build stopped because its process is closing the warehouse (never reaches a caller)."""


@dataclass(frozen=True, kw_only=True)
class ResidentIndex:
    """The rows of one table version by position: what each says (``CONTENT_COLUMNS``, never its
    tags, which change), its vector, and the graph over the vectors."""

    version: int
    content: pa.Table  # CONTENT_COLUMNS, one row per position
    usable: np.ndarray  # bool per position: a vector that can be ranked
    graph: faiss.IndexHNSWFlat = field(repr=False)
    codes: ScanCodes = field(default_factory=ScanCodes, repr=False, compare=False)  # filled by ``warm``

    @classmethod
    def build(cls, rows: pa.Table, *, version: int, dimension: int, stop: threading.Event | None = None) -> ResidentIndex:
        """From rows with a ``vector`` column and ``CONTENT_COLUMNS``, read at ``version``. The
        graph is built ``ADD_ROWS`` at a time, and ``Stopped`` is raised between two of them once
        ``stop`` is set (a closing process waits for one block, not for the whole build)."""
        vectors, usable = unit_vectors(rows.column("vector"), dimension)
        graph = faiss.IndexHNSWFlat(dimension, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = EF_CONSTRUCTION
        for start in range(0, len(vectors), ADD_ROWS):
            if stop is not None and stop.is_set():
                raise Stopped("the resident index build was stopped")
            graph.add(vectors[start : start + ADD_ROWS])
        return cls(version=version, content=rows.select(CONTENT_COLUMNS).combine_chunks(), usable=usable, graph=graph)

    @property
    def chunk_ids(self) -> pa.ChunkedArray:
        return self.content.column("chunk_id")

    @property
    def rows(self) -> int:
        return self.content.num_rows

    @property
    def nbytes(self) -> int:
        return resident_bytes(self.rows, self.graph.d) + int(self.content.nbytes)  # the codes counted before they are filled

    def positions(self, chunk_ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Each id's position in the index, -1 for an id it does not hold: a binary search of the
        index's ids, sorted once, so the lookup's work grows with the ids asked about (a caller's
        rows, a filter's matches), not with every row the index holds."""
        sorted_ids, order = self._sorted_ids
        asked = _fixed_width(chunk_ids, sorted_ids.dtype.itemsize)
        if not len(sorted_ids) or not len(asked):
            return np.full(len(asked), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(sorted_ids, asked), len(sorted_ids) - 1)
        found = (sorted_ids[at] == asked) & _fits(chunk_ids, sorted_ids.dtype.itemsize)
        return np.where(found, order[at], -1).astype(np.int64)

    @cached_property
    def _sorted_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """The index's ids as fixed-width bytes, sorted, and the position each came from."""
        width = max(1, int(pc.max(pc.binary_length(self.chunk_ids)).as_py() or 1)) if self.rows else 1
        ids = _fixed_width(self.chunk_ids, width)
        order = np.argsort(ids, kind="stable")
        return ids[order], order.astype(np.int64)

    def allowed(self, positions: np.ndarray) -> np.ndarray:
        """The mask of ``positions`` over the index; rows whose vectors cannot be ranked are left out."""
        allowed = np.zeros(self.rows, dtype=bool)
        allowed[positions] = True
        allowed &= self.usable
        return allowed

    def search(self, query: np.ndarray, allowed: np.ndarray, k: int, *, exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest of the positions ``allowed`` (a mask) holds: (positions, cosine), best
        first. The graph for a broad set, every allowed row scored for a narrow one (and for any
        when ``exact``: a ranking that depends on the allowed rows alone, every row tied with the
        ``k``-th kept)."""
        visible = int(np.count_nonzero(allowed))
        if visible < 1 or k < 1 or self.rows == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        take = min(k, visible)
        with _one_thread():
            return self._searched(query, allowed, take, visible, exact=exact)

    def _searched(self, query: np.ndarray, allowed: np.ndarray, take: int, visible: int, *, exact: bool) -> tuple[np.ndarray, np.ndarray]:
        share = visible / self.rows
        if share >= GRAPH_MIN_SHARE and not exact:
            bitmap = np.packbits(allowed, bitorder="little")  # bit i of byte i // 8, least significant first
            selector = faiss.IDSelectorBitmap(self.rows, faiss.swig_ptr(bitmap))
            params = faiss.SearchParametersHNSW(sel=selector, efSearch=ef_search(take, share))
            scores, found = self.graph.search(query.reshape(1, -1), take, params=params)
            kept = found[0] >= 0
            return found[0][kept].astype(np.int64), scores[0][kept]
        work("rows_scored", visible)
        return self._scanned(np.ascontiguousarray(query, dtype=np.float32), allowed, take)

    def _scanned(self, query: np.ndarray, allowed: np.ndarray, take: int) -> tuple[np.ndarray, np.ndarray]:
        """Every allowed row scored, the best ``take`` and every row tied with the last kept, best first.

        Each score is faiss's inner product of the row and the query, computed row by row, so it is
        a function of the two alone (``tests/retrieval/test_resident.py`` checks it bit for bit).
        Rows are laid out by tag set (``by_tags``), so a caller's rows are mostly a few long runs:
        once the index is warm, their 8-bit codes are read and only the rows that could be among
        the best are scored exactly (``_coded``); before, each run is handed to faiss whole (its
        kernel over consecutive rows, several times faster than a product through numpy's BLAS on
        faiss's storage). Long runs are split across the cores; the rows between runs go to faiss
        by position."""
        changes = np.flatnonzero(allowed[1:] != allowed[:-1]) + 1
        edges = np.concatenate([[0] if allowed[0] else [], changes, [len(allowed)] if allowed[-1] else []]).astype(np.int64)
        starts, ends = edges[0::2], edges[1::2]
        long = (ends - starts) >= SCAN_RUN_MIN
        scattered = range_positions(starts[~long], ends[~long])
        found = [best_with_ties(scattered, self._exact(query, scattered), take)]
        if self.codes.ready:
            found.append(self._coded(query, starts[long], ends[long], take, found[0][1]))
        else:
            found.extend(_spread(self._run_best, query, aligned_pieces(starts[long], ends[long], SCAN_PIECE_ROWS), take))
        positions, scores = best_with_ties(np.concatenate([p for p, _ in found]), np.concatenate([s for _, s in found]), take)
        order = np.argsort(-scores, kind="stable")
        return positions[order], scores[order]

    def _run_best(self, query: np.ndarray, lo: int, hi: int, take: int) -> tuple[np.ndarray, np.ndarray]:
        """The best ``take`` of rows ``[lo, hi)`` and their ties, by faiss's kernel over the run."""
        return best_with_ties(np.arange(lo, hi, dtype=np.int64), inner_products(self._vectors[lo:hi], query), take)

    def _coded(self, query: np.ndarray, starts: np.ndarray, ends: np.ndarray, take: int, exact: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The best ``take`` of the runs ``[starts[i], ends[i])`` and their ties, exactly scored:
        the codes' best of each piece give a floor under the ``take``-th exact score (with
        ``exact``, scores of other allowed rows); every row whose code could reach it is scored
        exactly. A piece whose list may stop above the floor is searched again for more."""
        pieces = self.codes.pieces(starts, ends)
        coded = CodedQuery.of(query)
        count = max(CODED_BEST, 4 * take)
        bests = _spread(self.codes.best, coded, pieces, count)
        lower = np.concatenate([exact.astype(np.float64), *[best.scores - best.bounds for best in bests]])
        floor = float(np.partition(lower, len(lower) - take)[len(lower) - take]) if len(lower) >= take else -np.inf
        chosen = []
        for (lo, hi), best in zip(pieces, bests, strict=True):
            more = count
            while len(best.positions) == more < hi - lo and best.scores[-1] >= floor - best.widest:  # more may reach it
                more *= 8
                best = self.codes.best(coded, lo, hi, more)
            chosen.append(best.positions[best.scores >= floor - best.bounds])
        candidates = np.concatenate(chosen) if chosen else np.empty(0, dtype=np.int64)
        return best_with_ties(candidates, self._exact(query, candidates), take)

    def _exact(self, query: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """faiss's inner product of ``query`` with each row at ``positions``, one row at a time."""
        scores = np.empty(len(positions), dtype=np.float32)
        if len(positions):
            positions = np.ascontiguousarray(positions, dtype=np.int64)
            self._storage.compute_distance_subset(1, faiss.swig_ptr(query), len(positions), faiss.swig_ptr(scores),
                                                  faiss.swig_ptr(positions))  # fmt: skip
        return scores

    @cached_property
    def _storage(self) -> faiss.IndexFlat:
        return faiss.downcast_index(self.graph.storage)

    @cached_property
    def _vectors(self) -> np.ndarray:
        """The stored vectors, (rows, d) float32, in place (a view of faiss's storage)."""
        flat = faiss.rev_swig_ptr(self._storage.get_xb(), self.graph.ntotal * self.graph.d)
        return np.asarray(flat).reshape(self.graph.ntotal, self.graph.d)

    def to_bytes(self) -> bytes:
        """The graph with its vectors, as faiss serialises it (the rows travel beside it)."""
        return bytes(faiss.serialize_index(self.graph))

    @classmethod
    def loaded(cls, graph: faiss.Index, content: pa.Table, *, version: int) -> ResidentIndex:
        """From a stored graph and its rows (``CONTENT_COLUMNS`` and ``usable``, as ``stored_rows`` wrote them)."""
        if graph.ntotal != content.num_rows:
            raise InvalidValueError(f"the index holds {graph.ntotal} vectors for {content.num_rows} rows")
        usable = np.asarray(content.column("usable").to_numpy(zero_copy_only=False), dtype=bool)
        return cls(version=version, content=content.select(CONTENT_COLUMNS).combine_chunks(), usable=usable, graph=graph)

    def warm(self, stop: threading.Event | None = None) -> None:
        """Read every stored vector once (a graph whose vectors are mapped from its artifact then
        has them in memory before searches fault them in one page at a time) and code them for
        the exact scan (``resident_codes``); left undone once ``stop`` is set."""
        self.codes.fill(self._vectors, stop=stop)

    def stored_rows(self) -> pa.Table:
        """What an artifact keeps beside the graph: each row's content and whether it can be ranked."""
        return self.content.append_column("usable", pa.array(self.usable))


def inner_products(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Each row of ``vectors`` (contiguous float32) times ``query``, by faiss's kernel row by row: a
    row's score is a function of the row and the query alone, whatever rows are scored beside it."""
    scores = np.empty(len(vectors), dtype=np.float32)
    if len(vectors):
        query = np.ascontiguousarray(query, dtype=np.float32)
        faiss.fvec_inner_products_ny(faiss.swig_ptr(scores), faiss.swig_ptr(query), faiss.swig_ptr(vectors), vectors.shape[1], len(vectors))
    return scores


@contextmanager
def _one_thread() -> Iterator[None]:
    """faiss on this thread without an OpenMP team: one query has nothing to share among one, and
    the team's threads spun beside the scan pool's (scoring 2,000 rows by position took 3 ms, not
    0.2). OpenMP's setting is per thread; it is put back after."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _spread(score: Callable[..., Any], query: Any, pieces: list[tuple[int, int]], count: int) -> list[Any]:
    """``score(query, lo, hi, count)`` of each piece, across the scan pool's threads when several."""
    if len(pieces) == 1:
        return [score(query, *pieces[0], count)]
    return list(_SCAN_POOL.map(lambda piece: score(query, *piece, count), pieces))


def range_positions(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Every position of the ranges ``[starts[i], ends[i])``."""
    lengths = ends - starts
    total = int(lengths.sum())
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total, dtype=np.int64)


def by_tags(rows: pa.Table) -> pa.Table:
    """``rows`` ordered by their tags, so the rows one caller may read lie in a few long runs of
    positions (``_scanned``); ``TAG_COLUMNS`` dropped."""
    keys = {}
    for name in TAG_COLUMNS:
        column = rows.column(name)
        keys[name] = pc.binary_join(column.cast(pa.list_(pa.string())), "\x1f") if pa.types.is_list(column.type) else column
    order = pc.sort_indices(pa.table(keys), sort_keys=[(name, "ascending") for name in TAG_COLUMNS])
    return rows.drop_columns(list(TAG_COLUMNS)).take(order)


def _fixed_width(chunk_ids: pa.Array | pa.ChunkedArray, width: int) -> np.ndarray:
    """Ids as numpy bytes of ``width`` (longer ones cut: ``_fits`` tells them apart)."""
    return np.asarray(pc.cast(chunk_ids, pa.binary()).to_numpy(zero_copy_only=False), dtype=f"S{width}")


def _fits(chunk_ids: pa.Array | pa.ChunkedArray, width: int) -> np.ndarray:
    """Which ids are no longer than ``width`` bytes (a longer one is none of an index's)."""
    lengths = pc.fill_null(pc.binary_length(chunk_ids), width + 1)
    return np.asarray(pc.less_equal(lengths, width).to_numpy(zero_copy_only=False), dtype=bool)


def ef_search(k: int, share: float) -> int:
    """Candidates a filtered graph walk keeps: about ``VISIBLE_CANDIDATES`` visible ones, ``EF_SEARCH``
    at least."""
    return max(EF_SEARCH, k, min(4096, math.ceil(VISIBLE_CANDIDATES / max(share, 1e-6))))
