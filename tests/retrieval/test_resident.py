"""The resident index's exact scan: runs of a caller's rows handed to faiss whole, the rest by position.

Where a run starts and ends is decided by the rows a caller cannot read, so a row's score must not
depend on it (a BLAS product's rounding does). Checked here against faiss scoring every allowed row
one at a time, bit for bit, for masks whose runs are long, short, mixed and split across the cores,
and for one set of allowed rows laid among different hidden ones; each with the runs scored in
float32 (a cold index) and through the 8-bit codes (a warm one: ``resident_codes``), whose blocks
are made small here so that runs cross them and ties outnumber a block's first search."""

from __future__ import annotations

import dataclasses

import faiss
import numpy as np
import pyarrow as pa
import pytest

from ragwarden.retrieval import resident
from ragwarden.retrieval.hits import CONTENT_COLUMNS
from ragwarden.retrieval.resident import SCAN_RUN_MIN, ResidentIndex, by_tags
from ragwarden.retrieval.resident_codes import ScanCodes

ROWS, DIMENSION = 6_000, 384


@pytest.fixture(scope="module")
def cold_index() -> ResidentIndex:
    rng = np.random.default_rng(12)
    vectors = rng.standard_normal((ROWS, DIMENSION)).astype(np.float32)
    vectors[::7] = vectors[3]  # many exact ties, so a cut between equals shows
    content = {name: [f"c{i:05d}" for i in range(ROWS)] if name == "chunk_id" else [None] * ROWS for name in CONTENT_COLUMNS}
    rows = pa.table({**content, "vector": pa.array(list(vectors), pa.list_(pa.float32(), DIMENSION))})
    return ResidentIndex.build(rows, version=1, dimension=DIMENSION)


@pytest.fixture(scope="module")
def warm_index(cold_index: ResidentIndex) -> ResidentIndex:
    """The same index with its 8-bit codes, in blocks of 1,000 rows."""
    warm = dataclasses.replace(cold_index, codes=ScanCodes(block_rows=1_000))
    warm.warm()
    assert warm.codes.ready
    return warm


@pytest.fixture(params=["cold", "warm"])
def index(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ResidentIndex:
    monkeypatch.setattr(resident, "CODED_BEST", 8)  # a block's first search stops inside the ties
    return request.getfixturevalue(f"{request.param}_index")


def _one_by_one(index: ResidentIndex, query: np.ndarray, allowed: np.ndarray, k: int) -> dict[int, int]:
    """faiss's score of every allowed row, row by row: the k best and their ties, as raw bits."""
    positions = np.flatnonzero(allowed).astype(np.int64)
    scores = np.empty(len(positions), np.float32)
    storage = faiss.downcast_index(index.graph.storage)
    storage.compute_distance_subset(1, faiss.swig_ptr(query), len(positions), faiss.swig_ptr(scores), faiss.swig_ptr(positions))
    floor = np.sort(scores)[::-1][min(k, len(scores)) - 1]
    best = scores >= floor
    return dict(zip(positions[best].tolist(), scores[best].view(np.int32).tolist(), strict=True))


def _masks(rng: np.random.Generator) -> dict[str, np.ndarray]:
    long = np.zeros(ROWS, dtype=bool)
    long[100:2_100] = long[3_000:3_000 + 4 * SCAN_RUN_MIN] = True
    scattered = rng.random(ROWS) < 0.2
    return {"long runs": long, "scattered": scattered, "mixed": long | scattered, "one row": np.eye(1, ROWS, 4_321, dtype=bool)[0]}


@pytest.mark.parametrize("shape", ["long runs", "scattered", "mixed", "one row"])
@pytest.mark.parametrize("piece", [resident.SCAN_PIECE_ROWS, 100])
def test_the_exact_scan_returns_faiss_s_own_scores_of_the_best_allowed_rows_and_their_ties(
    index: ResidentIndex, shape: str, piece: int, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(resident, "SCAN_PIECE_ROWS", piece)  # 100: long runs cut into pieces scored on every core
    rng = np.random.default_rng(5)
    allowed = _masks(rng)[shape]
    for query in (index._vectors[3], rng.standard_normal(DIMENSION).astype(np.float32)):
        positions, scores = index.search(query, allowed, 10, exact=True)
        assert dict(zip(positions.tolist(), scores.view(np.int32).tolist(), strict=True)) == _one_by_one(index, query, allowed, 10)
        assert list(scores) == sorted(scores, reverse=True)


def test_the_rows_between_a_callers_rows_change_nothing_of_its_exact_answer(index: ResidentIndex):
    """The same allowed rows, once in long runs and once with hidden rows cut between them."""
    rng = np.random.default_rng(9)
    query = rng.standard_normal(DIMENSION).astype(np.float32)
    allowed = np.zeros(ROWS, dtype=bool)
    allowed[200:4_200] = True
    answers = set()
    for cut_every in (0, 3, SCAN_RUN_MIN - 1, SCAN_RUN_MIN + 1, 500):
        mask = allowed.copy()
        if cut_every:
            mask[200::cut_every] = False  # hidden rows among hers, then hers alone compared
        positions, scores = index.search(query, mask, 10, exact=True)
        expected = _one_by_one(index, query, mask, 10)
        assert dict(zip(positions.tolist(), scores.view(np.int32).tolist(), strict=True)) == expected
        answers.add(tuple(sorted(expected.items())) if not cut_every else None)
    assert len(answers) == 2


def test_rows_are_laid_out_by_their_tags_so_a_readers_rows_form_few_runs():
    tags = [("acme", ["group:b"]), ("acme", ["group:a"]), ("globex", ["group:a"])]
    rows = pa.table({"chunk_id": [f"c{i}" for i in range(9)], "tenant": [tags[i % 3][0] for i in range(9)],
                     "acl_allow": [tags[i % 3][1] for i in range(9)], "acl_deny": [[]] * 9, "acl_clauses": [["x"]] * 9,
                     "labels": [[]] * 9, "classification": [1] * 9})  # fmt: skip
    laid = by_tags(rows)
    assert laid.column_names == ["chunk_id"]
    assert laid.column("chunk_id").to_pylist() == ["c1", "c4", "c7", "c0", "c3", "c6", "c2", "c5", "c8"]
