"""The rows and callers every peer vector store is given, and the oracle that says which rows a caller may see.

The benchmark hands the same `BenchRows` to ragwarden and to each peer, so the visibility rule lives here once,
as plain numpy, independent of any engine's filter language.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

CLASSIFICATIONS = ("public", "internal", "confidential", "restricted")


@dataclass(frozen=True, kw_only=True)
class BenchRows:
    """Rows with their governance metadata; vectors are unit length so cosine similarity is the dot product."""

    ids: list[str]
    vectors: np.ndarray
    tenant: list[str]
    acl_allow: list[list[str]]
    acl_deny: list[list[str]]
    labels: list[list[str]]
    classification: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, kw_only=True)
class Caller:
    """Who asks: principals are already expanded (subject, "everyone", every group), so no engine needs a group graph."""

    tenant: str
    principals: frozenset[str]
    cleared_labels: frozenset[str]
    clearance: int


def all_labels(rows: BenchRows) -> frozenset[str]:
    """Every sensitivity label present in the data; engines without "subset of" need the complement of a clearance."""
    return frozenset(label for row in rows.labels for label in row)


def uncleared_labels(rows: BenchRows | RowIndex, caller: Caller) -> list[str]:
    """Labels in the data the caller is not cleared for, sorted so a filter built from them is deterministic."""
    labels = rows.labels_vocab if isinstance(rows, RowIndex) else all_labels(rows)
    return sorted(set(labels) - caller.cleared_labels)


@dataclass(frozen=True)
class _Csr:
    """A list-of-lists column as integer codes: the entries, and the row each entry belongs to."""

    codes: np.ndarray
    row_of: np.ndarray

    @classmethod
    def build(cls, column: Sequence[Sequence[str]], vocab: dict[str, int]) -> _Csr:
        lengths = np.fromiter((len(v) for v in column), dtype=np.int64, count=len(column))
        codes = np.fromiter((vocab.setdefault(s, len(vocab)) for v in column for s in v), dtype=np.int32,
                            count=int(lengths.sum()))
        return cls(codes, np.repeat(np.arange(len(column), dtype=np.int64), lengths))

    def any_in(self, wanted: np.ndarray, n_rows: int, *, negate: bool = False) -> np.ndarray:
        """Per row: does any entry fall in `wanted` (or, negated, outside it)?"""
        hit = np.isin(self.codes, wanted, invert=negate)
        return np.bincount(self.row_of[hit], minlength=n_rows) > 0


@dataclass(frozen=True)
class RowIndex:
    """The metadata of `BenchRows` as integer codes, built once, so the oracle is a handful of vector ops per caller."""

    n: int
    tenant_codes: np.ndarray
    tenant_vocab: dict[str, int]
    principal_vocab: dict[str, int]
    labels_vocab: dict[str, int]
    allow: _Csr
    deny: _Csr
    labels: _Csr
    classification: np.ndarray = field(repr=False)

    @classmethod
    def build(cls, rows: BenchRows) -> RowIndex:
        tenant_vocab: dict[str, int] = {}
        tenant_codes = np.fromiter((tenant_vocab.setdefault(t, len(tenant_vocab)) for t in rows.tenant),
                                   dtype=np.int32, count=len(rows.tenant))
        principals: dict[str, int] = {}
        labels: dict[str, int] = {}
        return cls(
            n=len(rows.ids),
            tenant_codes=tenant_codes,
            tenant_vocab=tenant_vocab,
            principal_vocab=principals,
            labels_vocab=labels,
            allow=_Csr.build(rows.acl_allow, principals),
            deny=_Csr.build(rows.acl_deny, principals),
            labels=_Csr.build(rows.labels, labels),
            classification=np.asarray(rows.classification),
        )

    @staticmethod
    def _codes(vocab: dict[str, int], names: Iterable[str]) -> np.ndarray:
        return np.array([vocab[name] for name in names if name in vocab], dtype=np.int32)

    def visible(self, caller: Caller) -> np.ndarray:
        """The oracle: tenant matches, some principal allowed, none denied, every label cleared, class <= clearance."""
        tenant = self.tenant_vocab.get(caller.tenant, -1)
        mask = (self.tenant_codes == tenant) & (self.classification <= caller.clearance)
        principals = self._codes(self.principal_vocab, caller.principals)
        mask &= self.allow.any_in(principals, self.n)
        mask &= ~self.deny.any_in(principals, self.n)
        mask &= ~self.labels.any_in(self._codes(self.labels_vocab, caller.cleared_labels), self.n, negate=True)
        return mask


_INDEXES: dict[int, tuple[weakref.ref[BenchRows], RowIndex]] = {}


def row_index(rows: BenchRows) -> RowIndex:
    """The `RowIndex` of `rows`, cached per object (rows are frozen) so repeated oracle calls don't re-encode them."""
    key = id(rows)
    cached = _INDEXES.get(key)
    if cached is not None and cached[0]() is rows:
        return cached[1]
    index = RowIndex.build(rows)
    _INDEXES[key] = (weakref.ref(rows, lambda _ref, key=key: _INDEXES.pop(key, None)), index)
    return index


def visible_mask(rows: BenchRows | RowIndex, caller: Caller) -> np.ndarray:
    """Boolean mask of the rows `caller` may see (the ground truth every engine's filter is checked against)."""
    index = rows if isinstance(rows, RowIndex) else row_index(rows)
    return index.visible(caller)
