"""Rows become a table the same way whether their vectors are lists or numpy arrays (as records
that bring their own vectors hold them), and a vector of the wrong length is still refused."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pytest

from ragwarden.state.schema import chunks_schema
from ragwarden.state.snapshot import rows_table

DIMENSION = 4


def _rows(vectors: list[object]) -> list[dict[str, object]]:
    now = datetime(2026, 12, 7, tzinfo=timezone.utc)
    return [{"chunk_id": f"c{i}", "doc_id": f"d{i}", "text": f"row {i}", "vector": vector, "tenant": "acme",
             "acl_allow": ["group:eng"], "acl_deny": [], "acl_clauses": ["c1"], "labels": [], "classification": 0,
             "created_at": now} for i, vector in enumerate(vectors)]  # fmt: skip


def test_array_vectors_make_the_same_table_as_lists():
    schema = chunks_schema(DIMENSION)
    vectors = np.random.default_rng(1).standard_normal((5, DIMENSION)).astype(np.float32)
    from_arrays = rows_table(_rows(list(vectors)), schema)
    from_lists = rows_table(_rows([v.tolist() for v in vectors]), schema)
    assert from_arrays.schema == schema and from_arrays.equals(from_lists)


def test_an_array_vector_of_the_wrong_length_is_refused():
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, ValueError)):
        rows_table(_rows([np.ones(DIMENSION, np.float32), np.ones(DIMENSION + 1, np.float32)]), chunks_schema(DIMENSION))
