"""The 8-bit codes' promise, which the exact scan's answer rests on: a row's coded score is within
its stated bound of faiss's float32 score, for every row of every block (a clipped value's row
included), for unit and longer queries; a row's code and bound are its own, whatever rows share
its block; and a scan's runs are cut at block boundaries, so each piece is searched in one block."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from ragwarden.retrieval.resident_codes import CodedQuery, ScanCodes

ROWS, DIMENSION, BLOCK = 2_500, 384, 1_000


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((ROWS, DIMENSION)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)  # as the index holds them
    rows[1_200:1_300] *= 0.01  # a block whose rows differ in length
    rows[2_100:2_110] = 0.0  # rows that cannot be ranked are held as zeros
    rows[7] = 0.0
    rows[7, :2] = [0.96, 0.28]  # a value past what the codes hold: clipped
    return rows


@pytest.fixture(scope="module")
def codes(vectors: np.ndarray) -> ScanCodes:
    coded = ScanCodes(block_rows=BLOCK)
    coded.fill(vectors)
    return coded


@pytest.mark.parametrize("length", [1.0, 0.003, 40.0])
def test_every_coded_score_lies_within_its_bound_of_faisss_float32_score(vectors: np.ndarray, codes: ScanCodes, length: float):
    flat = faiss.IndexFlatIP(DIMENSION)
    flat.add(vectors)
    rng = np.random.default_rng(int(length * 1000))
    for _ in range(5):
        query = rng.standard_normal(DIMENSION).astype(np.float32)
        query *= length / np.linalg.norm(query)
        exact, order = flat.search(query.reshape(1, -1), ROWS)
        exact_of = dict(zip(order[0].tolist(), exact[0].tolist(), strict=True))
        coded = CodedQuery.of(query)
        for lo in range(0, ROWS, BLOCK):
            hi = min(ROWS, lo + BLOCK)
            best = codes.best(coded, lo, hi, hi - lo)
            assert sorted(best.positions.tolist()) == list(range(lo, hi))
            gaps = np.abs(best.scores - np.array([exact_of[p] for p in best.positions.tolist()]))
            assert (gaps <= best.bounds).all() and best.bounds.max() <= best.widest
            tight = best.bounds[best.positions != 7]
            assert tight.max() < 0.05 * length  # tight enough to leave few rows to score again


def test_a_rows_code_and_bound_are_its_own_whatever_rows_share_its_block(vectors: np.ndarray, codes: ScanCodes):
    """The rows around a caller's are hidden from it: changing them moves none of its coded scores."""
    changed = vectors.copy()
    changed[300:1_000] = np.random.default_rng(8).standard_normal((700, DIMENSION)).astype(np.float32) * 3
    other = ScanCodes(block_rows=BLOCK)
    other.fill(changed)
    query = CodedQuery.of(vectors[42])
    mine, theirs = codes.best(query, 0, 300, 300), other.best(query, 0, 300, 300)
    assert mine.positions.tolist() == theirs.positions.tolist()
    assert mine.scores.tolist() == theirs.scores.tolist() and mine.bounds.tolist() == theirs.bounds.tolist()


def test_a_scans_runs_are_cut_where_blocks_end(codes: ScanCodes):
    assert codes.pieces(np.array([5, 990, 2_400]), np.array([20, 2_010, 2_500])) == [
        (5, 20), (990, 1_000), (1_000, 2_000), (2_000, 2_010), (2_400, 2_500)]  # fmt: skip


def test_codes_held_are_a_byte_per_dimension_and_a_rows_bound(codes: ScanCodes):
    assert codes.ready and codes.nbytes == ROWS * (DIMENSION + 8)  # and two float32 per row: error, length
    assert not ScanCodes().ready
