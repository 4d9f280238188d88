"""Every row's governance tags, held in this process as integer codes beside the serving index,
moved from one table version to the next by each commit's delta and evaluated for a caller in one
vectorised pass into the mask a search walks.

Why: reading a caller's visible ids and tags through Lance cost 850-893 ms at 1M rows, once per
caller and table version, and in a shared deployment most searches are the first of their caller
at their version. Here a new caller costs work proportional to its policy (its principals, the
clauses it satisfies, its cleared labels) and a few passes over integer arrays, and a commit costs
the rows it wrote and the fragments it removed rows from.

Rows are grouped by what governs them (tenant, allow, deny, clauses, labels, classification): the
rows of one document share it, and so do most documents of one team, so the distinct tag sets are
far fewer than the rows. A caller's rule is evaluated over the sets, then one gather
gives every row its set's verdict; the rule is the one ``compile_filter`` writes in SQL (DESIGN §4),
evaluated over codes: the same tenant, an allowed principal, no denied one, at least one clause and
every clause satisfied, every label cleared, the classification within clearance. Its work is a
function of the table's shape (rows, sets, tag entries) and of the caller's own policy, the same
operations for every row whatever its tags hold.

Nothing here can widen an answer: a row's codes are its tags at the state's version (a delta is
applied whole or the state is dropped), the tags a hit carries are decoded from the same codes,
and the search still post-checks every hit with the enforcer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..governance.compiler import SubjectView
from ..governance.tags import Classification
from .patched import Patched

LIST_COLUMNS = ("acl_allow", "acl_deny", "acl_clauses", "labels")
SET_COLUMNS = ("tenant", *LIST_COLUMNS, "classification")
"""What a tag set holds: who may read a row."""
CITE_COLUMNS = ("source_uri", "metadata")
"""What a hit cites besides its content, coded per row (a re-ingest can change them under one id)."""
TAG_READ_COLUMNS = ["chunk_id", *SET_COLUMNS, *CITE_COLUMNS]
NO_SET = -1
NO_ADDRESS = -1


class Vocabulary:
    """Strings to dense integer codes, append-only (codes never change)."""

    def __init__(self) -> None:
        self.codes: dict[Any, int] = {}
        self.values: list[Any] = []

    def code(self, value: Any) -> int:
        code = self.codes.get(value)
        if code is None:
            code = self.codes[value] = len(self.values)
            self.values.append(value)
        return code

    def known(self, values: Iterable[str]) -> np.ndarray:
        """The codes of those ``values`` the vocabulary holds (a value it never saw is on no row)."""
        return np.fromiter((c for v in values if (c := self.codes.get(v)) is not None), np.int64)

    def lookup(self, values: Iterable[str]) -> np.ndarray:
        """A mask over codes: True for ``values``' codes (one slot beyond, for no value)."""
        mask = np.zeros(len(self.codes) + 1, dtype=bool)
        mask[self.known(values)] = True
        return mask

    def __len__(self) -> int:
        return len(self.codes)


@dataclass(frozen=True, kw_only=True)
class _Lists:
    """One list column of the tag sets: set ``s`` holds ``values[starts[s]:starts[s + 1]]``."""

    starts: np.ndarray  # (sets + 1,) int64
    values: np.ndarray  # int64 codes
    owner: np.ndarray  # (len(values),) the set each value belongs to

    def any_of(self, wanted: np.ndarray, sets: int) -> np.ndarray:
        """Per set: whether any of its values is ``wanted`` (a mask over codes)."""
        hit = self.owner[wanted[self.values]]
        return np.bincount(hit, minlength=sets)[:sets] > 0

    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)

    @classmethod
    def of(cls, lists: Sequence[Sequence[int]]) -> _Lists:
        lengths = np.fromiter(map(len, lists), np.int64, len(lists))
        starts = np.zeros(len(lists) + 1, np.int64)
        np.cumsum(lengths, out=starts[1:])
        values = np.fromiter((v for values in lists for v in values), np.int64, int(starts[-1]))
        return cls(starts=starts, values=values, owner=np.repeat(np.arange(len(lists), dtype=np.int64), lengths))


@dataclass(frozen=True, kw_only=True)
class TagSets:
    """The distinct tag sets of a table, coded: what one caller's rule is evaluated over."""

    rows: tuple[dict[str, Any], ...]  # each set's columns as a hit carries them
    tenant: np.ndarray  # (sets,) code
    classification: np.ndarray  # (sets,) int16, -1 for none
    lists: Mapping[str, _Lists]

    def visible(self, view: SubjectView, satisfied: Iterable[str], vocabulary: Vocabularies) -> np.ndarray:
        """Per set, whether ``view`` may read its rows (``satisfied``: the clause tokens the
        subject satisfies, from the registry the search reads)."""
        sets = len(self.rows)
        tenant = vocabulary.tenants.codes.get(view.tenant)
        if tenant is None or view.clearance is None or sets == 0:
            return np.zeros(sets, dtype=bool)
        principals = vocabulary.principals.lookup(view.principals)
        clauses = vocabulary.clauses.lookup(satisfied)
        labels = vocabulary.labels.lookup(view.cleared_labels)
        clause_lists, label_lists = self.lists["acl_clauses"], self.lists["labels"]
        unsatisfied = clause_lists.any_of(~clauses, sets)
        uncleared = label_lists.any_of(~labels, sets)
        return (
            (self.tenant == tenant)
            & self.lists["acl_allow"].any_of(principals, sets)
            & ~self.lists["acl_deny"].any_of(principals, sets)
            & (clause_lists.lengths() > 0)
            & ~unsatisfied
            & ~uncleared
            & (self.classification >= int(Classification.PUBLIC))
            & (self.classification <= int(view.clearance))
        )


@dataclass(kw_only=True)
class Vocabularies:
    """The codes of one process's resident tags, shared by every version of them."""

    tenants: Vocabulary = field(default_factory=Vocabulary)
    principals: Vocabulary = field(default_factory=Vocabulary)  # allow and deny
    clauses: Vocabulary = field(default_factory=Vocabulary)
    labels: Vocabulary = field(default_factory=Vocabulary)
    citations: Vocabulary = field(default_factory=Vocabulary)  # source uris and metadata texts

    def of(self, column: str) -> Vocabulary:
        return {"tenant": self.tenants, "acl_allow": self.principals, "acl_deny": self.principals,
                "acl_clauses": self.clauses, "labels": self.labels}[column]  # fmt: skip


class SetCatalog:
    """Tag sets by content, append-only: one code per distinct set, for the life of the process's
    resident tags (a rebuild starts a new catalog)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.vocabulary = Vocabularies()
        self._codes: dict[tuple[Any, ...], int] = {}
        self._rows: list[dict[str, Any]] = []
        self._coded: list[tuple[int, int, tuple[tuple[int, ...], ...]]] = []
        self._sets: TagSets | None = None

    def codes(self, table: pa.Table) -> np.ndarray:
        """Each row's set code (``table`` holds ``SET_COLUMNS``), new sets added. Distinct rows
        are found by Arrow first, so the Python work is per distinct set, not per row."""
        if table.num_rows == 0:
            return np.empty(0, dtype=np.int32)
        keys = [_column_codes(table.column(name)) for name in SET_COLUMNS]
        stacked = np.stack(keys, axis=1)
        distinct, first, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
        firsts = table.take(pa.array(first)).select(list(SET_COLUMNS)).to_pylist()
        with self._lock:
            codes = np.fromiter((self._code(row) for row in firsts), np.int32, len(distinct))
        return codes[inverse.reshape(-1)]

    def citation_codes(self, table: pa.Table) -> np.ndarray:
        """Each row's (source uri, metadata) codes, (rows, 2) int32: Python work per distinct value."""
        coded = np.empty((table.num_rows, len(CITE_COLUMNS)), dtype=np.int32)
        for at, name in enumerate(CITE_COLUMNS):
            encoded = pc.dictionary_encode(_plain(table.column(name)))
            with self._lock:  # the distinct values, then None (a null row's) last
                codes = np.fromiter(map(self.vocabulary.citations.code, [*encoded.dictionary.to_pylist(), None]), np.int32)
            indices = pc.fill_null(encoded.indices, len(codes) - 1).to_numpy(zero_copy_only=False)
            coded[:, at] = codes[indices.astype(np.int64)]
        return coded

    def citation(self, code: int) -> Any:
        return self.vocabulary.citations.values[code]

    def _code(self, row: dict[str, Any]) -> int:
        key = tuple(tuple(row[name]) if name in LIST_COLUMNS else row[name] for name in SET_COLUMNS)
        code = self._codes.get(key)
        if code is None:
            code = self._codes[key] = len(self._rows)
            self._rows.append(row)
            lists = tuple(tuple(self.vocabulary.of(name).code(v) for v in row[name]) for name in LIST_COLUMNS)
            level = row["classification"]
            self._coded.append((self.vocabulary.tenants.code(row["tenant"]), -1 if level is None else int(level), lists))
            self._sets = None
        return code

    def sets(self) -> TagSets:
        """The sets so far, coded (made again only after a new set was added)."""
        with self._lock:
            return self._made()

    def _made(self) -> TagSets:
        if self._sets is None or len(self._sets.rows) != len(self._rows):
            coded = self._coded
            self._sets = TagSets(
                rows=tuple(self._rows),
                tenant=np.fromiter((c[0] for c in coded), np.int64, len(coded)),
                classification=np.fromiter((c[1] for c in coded), np.int16, len(coded)),
                lists={name: _Lists.of([c[2][i] for c in coded]) for i, name in enumerate(LIST_COLUMNS)},
            )
        return self._sets


def _plain(column: pa.ChunkedArray) -> pa.Array:
    """One array of ``column``'s values; JSON metadata (an extension type) as its text."""
    array = column.combine_chunks()
    return array.storage if isinstance(array, pa.ExtensionArray) else array


def _column_codes(column: pa.ChunkedArray) -> np.ndarray:
    """Per row, a code equal for equal values and different for different ones (lists compared
    element by element: their values' codes, joined as bytes)."""
    array = _plain(column)
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        values = pc.dictionary_encode(array.flatten()).indices.to_numpy(zero_copy_only=False).astype("<i4")
        offsets = np.asarray(array.offsets.to_numpy(), dtype=np.int64)
        offsets = (offsets - offsets[0]) * 4
        nulls = None if array.null_count == 0 else array.is_null().to_numpy(zero_copy_only=False)
        joined = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), len(array), [None, pa.py_buffer(offsets.astype(np.int64)), pa.py_buffer(values.tobytes())]
        )
        codes = pc.dictionary_encode(joined).indices.to_numpy(zero_copy_only=False).astype(np.int64)
        return codes if nulls is None else np.where(nulls, -1, codes)
    encoded = pc.dictionary_encode(array)
    return pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class ResidentTags:
    """One table version's rows as this process holds them: each row's tag set (``NO_SET``: no
    row is there any more), immutable; ``advanced`` makes the next version's."""

    version: int
    catalog: SetCatalog = field(repr=False)
    row_sets: Patched  # (rows,) int32 set code per row slot
    citations: Patched  # (rows, 2) int32 codes of each slot's source uri and metadata
    fragments: Mapping[int, tuple[str, str, int]]  # fragment id -> (its data files, its deletion mark, rows marked)
    addresses: Patched  # (rows,) int64 each slot's row address in the table (fragment, offset), NO_ADDRESS for none

    @property
    def rows(self) -> int:
        return len(self.row_sets)

    @property
    def live(self) -> int:
        return int(np.count_nonzero(self.row_sets.dense() != NO_SET))

    def visible(self, view: SubjectView, satisfied: Iterable[str]) -> Readable:
        """The row slots ``view`` may read at this version, and the tag sets they are in."""
        sets = self.catalog.sets()
        verdicts = np.append(sets.visible(view, satisfied, self.catalog.vocabulary), False)  # NO_SET -> last
        return Readable(mask=self.row_sets.mapped(verdicts), sets=np.flatnonzero(verdicts[:-1]))

    def current(self, slots: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """The tags (and uri, metadata) of ``slots`` at this version, as hits carry them."""
        rows, at = self.catalog.sets().rows, np.asarray(slots, dtype=np.int64)
        cite = self.catalog.citation
        return [{**rows[int(code)], "source_uri": cite(int(uri)), "metadata": cite(int(meta))}
                for code, (uri, meta) in zip(self.row_sets.take(at), self.citations.take(at), strict=True)]  # fmt: skip

    @property
    def nbytes(self) -> int:
        held = self.row_sets.nbytes + self.citations.nbytes + self.addresses.nbytes
        sets = self.catalog.sets()
        lists = sum(x.starts.nbytes + x.values.nbytes + x.owner.nbytes for x in sets.lists.values())
        texts = sum(len(v) + 60 for v in self.catalog.vocabulary.citations.values if isinstance(v, str))
        return int(held + lists + sets.tenant.nbytes + sets.classification.nbytes + SET_ROW_BYTES * len(sets.rows) + texts)


@dataclass(frozen=True, kw_only=True)
class Readable:
    """What one caller may read of a resident state: a mask over its row slots, and the tag sets
    every one of those slots is in (a narrowing filter only clears slots of the mask)."""

    mask: np.ndarray  # (slots,) bool
    sets: np.ndarray  # tag set codes, ascending

    def narrowed(self, slots: np.ndarray) -> Readable:
        """Only ``slots`` of these."""
        matched = np.zeros(len(self.mask), dtype=bool)
        matched[slots] = True
        return Readable(mask=self.mask & matched, sets=self.sets)


SET_ROW_BYTES = 600
"""What a tag set's decoded row costs in Python objects (a dict of lists and strings), about."""


def split_addresses(addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row addresses as (fragment id, offset in it)."""
    addresses = np.asarray(addresses, dtype=np.uint64)
    return (addresses >> np.uint64(32)).astype(np.int64), (addresses & np.uint64(0xFFFFFFFF)).astype(np.int64)
