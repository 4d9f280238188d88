"""8-bit codes of the resident index's vectors, so an exact scan reads a quarter of the bytes.

Why: an exact scan of a broad caller's rows (``hybrid``'s vector half) is bound by memory: at
1M rows, half of them readable, it read 750 MB of float32 per query. The index's unit vectors are
also kept as whole numbers in [-127, 127] (each value times ``SCALE``, rounded), and so is the
query: faiss's ``QT_8bit_direct_signed`` kernel multiplies the two in integers (exactly, and four
times as fast as its float32 kernel here). Those coded scores are read first; every row whose
coded score could reach the caller's ``k``-th best is then scored exactly, by faiss's float32
kernel row by row, as every score this index returns. The answer is the same, bit for bit, as
scoring every row exactly:

- a row's coded score differs from its exact one by at most its bound: the query's length times
  the row's coding error (measured when it was coded: the distance between the row and its code,
  scaled back), plus the query's own coding error times the coded row's length, plus
  ``ROUNDING``;
- the ``k`` best coded scores, each less its bound, give a floor the exact ``k``-th best cannot
  be under; every row whose coded score is within its bound of that floor is scored exactly
  (a piece whose best coded scores all reach that far is searched again for more: faiss's range
  search over these codes was 40 times slower than a search for the best 4,096).

What a search reads and how long it takes depend on its caller's rows alone: the scale is a
constant (not learnt from the rows, which would let hidden rows move every row's code), each
row's bound is its own, each piece is a range of one block, searched through a range selector,
and the floor comes from the caller's rows.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import faiss
import numpy as np

BLOCK_ROWS = 1 << 16
"""Rows coded together (one faiss index each): a piece of a scan lies within one block, so a
search skips nothing it has to test beyond its block."""
SCALE = 400.0
"""A unit vector's values times this, rounded: exact to 1/800 up to 0.3175. all-MiniLM-L6-v2's
values stayed under 0.26 (2,000 SciFact abstracts), a random 384-d unit vector's are over 0.3 about
once per million rows; a larger value is clipped, and that row's own bound says so. At 254 (up to
0.5) the bounds were half as wide again, and a broad caller's pieces were searched twice."""
ROUNDING = 1e-4
"""Float32 rounding of the exact score (384 products summed: under 2.5e-5 for unit vectors), with
room to spare; the coded score is an exact integer."""


@dataclass(frozen=True, kw_only=True)
class Block:
    start: int
    codes: faiss.IndexScalarQuantizer
    error: np.ndarray  # (rows,) |row - code / SCALE| + ROUNDING, per row
    length: np.ndarray  # (rows,) |code / SCALE|, per row


class ScanCodes:
    """Every indexed vector's 8-bit code, in blocks of ``BLOCK_ROWS`` rows; empty until ``fill``."""

    def __init__(self, *, block_rows: int = BLOCK_ROWS) -> None:
        self._block_rows = block_rows
        self._blocks: tuple[Block, ...] = ()

    @property
    def ready(self) -> bool:
        return bool(self._blocks)

    @property
    def nbytes(self) -> int:
        return sum(block.codes.ntotal * block.codes.code_size + block.error.nbytes + block.length.nbytes for block in self._blocks)

    def fill(self, vectors: np.ndarray, stop: threading.Event | None = None) -> None:
        """Code ``vectors`` (rows, d) float32, unit or zero rows, each value times ``SCALE``; once
        ``stop`` is set, between two blocks, nothing is kept (the float32 kernel serves)."""
        blocks = []
        for start in range(0, len(vectors), self._block_rows):
            if stop is not None and stop.is_set():
                return
            rows = vectors[start : start + self._block_rows]
            whole = np.clip(np.rint(rows * np.float32(SCALE)), -127, 127).astype(np.float32)  # exact in the codes
            codes = faiss.IndexScalarQuantizer(rows.shape[1], faiss.ScalarQuantizer.QT_8bit_direct_signed, faiss.METRIC_INNER_PRODUCT)
            codes.train(whole)
            codes.add(whole)
            decoded = codes.sa_decode(faiss.vector_to_array(codes.codes).reshape(len(rows), -1)).astype(np.float64) / SCALE
            error = np.sqrt(np.sum((decoded - rows) ** 2, axis=1)) + ROUNDING
            length = np.sqrt(np.sum(decoded**2, axis=1))
            blocks.append(Block(start=start, codes=codes, error=error.astype(np.float32), length=length.astype(np.float32)))
        self._blocks = tuple(blocks)  # one assignment: a search sees no codes or all of them

    def pieces(self, starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
        """The ranges ``[starts[i], ends[i])`` cut at block boundaries, in order."""
        return aligned_pieces(starts, ends, self._block_rows)

    def best(self, query: CodedQuery, lo: int, hi: int, count: int) -> Coded:
        """The ``count`` best coded scores of rows ``[lo, hi)`` (one block's)."""
        block = self._blocks[lo // self._block_rows]
        params = faiss.SearchParameters(sel=faiss.IDSelectorRange(lo - block.start, hi - block.start))
        products, found = block.codes.search(query.whole, min(count, hi - lo), params=params)
        at = found[0][found[0] >= 0]
        within = slice(lo - block.start, hi - block.start)
        return Coded(positions=at.astype(np.int64) + block.start, scores=products[0][: len(at)] / (query.scale * SCALE),
                     bounds=query.bounds(block.error[at], block.length[at]),
                     widest=float(query.bounds(block.error[within].max(), block.length[within].max())))  # fmt: skip


def aligned_pieces(starts: np.ndarray, ends: np.ndarray, size: int) -> list[tuple[int, int]]:
    """The ranges ``[starts[i], ends[i])`` cut at every multiple of ``size``, in order: no piece
    longer than ``size``, none across a boundary."""
    return [(lo, min(hi, (lo // size + 1) * size)) for first, hi in zip(starts.tolist(), ends.tolist(), strict=True)
            for lo in [first, *range((first // size + 1) * size, hi, size)]]  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Coded:
    """A piece's best coded scores: their rows, best first, each one's bound, and a bound for
    every row of the piece (``widest``)."""

    positions: np.ndarray
    scores: np.ndarray
    bounds: np.ndarray
    widest: float


@dataclass(frozen=True, kw_only=True)
class CodedQuery:
    """A query as the codes take it: scaled to whole numbers in [-127, 127]."""

    whole: np.ndarray  # (1, d) float32 holding whole numbers
    scale: float
    length: float  # |query|
    error: float  # |query - whole / scale|

    @classmethod
    def of(cls, query: np.ndarray) -> CodedQuery:
        scale = 127.0 / max(float(np.abs(query).max()), 1e-30)  # the caller's own: as fine as its values allow
        whole = np.rint(query.astype(np.float64) * scale)
        error = float(np.linalg.norm(query.astype(np.float64) - whole / scale))
        return cls(whole=whole.astype(np.float32).reshape(1, -1), scale=scale, length=float(np.linalg.norm(query)), error=error)

    def bounds(self, error: np.ndarray | float, length: np.ndarray | float) -> np.ndarray:
        """How far a coded score of rows with these coding ``error`` and coded ``length`` may be
        from its exact score."""
        return self.length * np.asarray(error, dtype=np.float64) + self.error * np.asarray(length, dtype=np.float64)
