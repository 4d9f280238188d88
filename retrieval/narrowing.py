"""Narrowing filters: a caller's condition on metadata and a few columns, as LangChain and Chroma
write it (``{"year": {"$gte": 2020}, "$or": [...]}``), compiled once into a tree of conditions.

The tree is evaluated in memory over the fields of the rows the caller may read
(``visible_fields.VisibleFields``), never over the table: a filter only ever sees rows its caller
could be shown, so neither its answer nor the work it does (and so its time) depends on rows the
caller cannot read. The same tree also writes itself as SQL in which every value is a quoted
literal, for the one route that asks Lance (a table version gone mid-search): there it is ANDed
after the governance filter, and its columns are written so that no scalar index serves them, so
Lance too evaluates it over the rows the governance filter admits, never over the whole table.

Semantics, the same on every surface:

- a bare name is a field of the row's metadata; ``doc_id``, ``source_uri``, ``kind`` and
  ``created_at`` name those columns; ``metadata.NAME`` names a metadata field whatever it is called;
- a comparison with a field the row does not have is false (``$ne`` and ``$nin`` included);
- equality is typed: the string ``"2020"`` is not the number ``2020``, nor ``true`` the number 1;
- ``$gt``, ``$gte``, ``$lt`` and ``$lte`` take numbers on metadata (compared as 64-bit floats),
  strings on the text columns and ISO 8601 times on ``created_at``;
- the columns that govern who may read a row are refused: a filter narrows, it never decides access.

Its cost is bounded: compiling is one pass over the filter (its SQL is joined again at each level
of nesting, so the time is its size times its depth, at most 16), and ``FilterLimits`` (settings)
bound its bytes, conditions, nesting and values; a refusal names the limit and its setting.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator as op
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..config import FilterLimits
from ..deadline import check_deadline
from ..errors import InvalidRequestError
from ..governance.sql import sql_string
from ..stages import work
from ..state import TAG_COLUMNS
from .visible_fields import TEXT_COLUMNS, MetadataField, VisibleFields, as_float

COMPARISONS = {"$eq": "=", "$ne": "<>", "$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
MEMBERSHIP = ("$in", "$nin")
LOGICAL = ("$and", "$or")
RANGES = ("$gt", "$gte", "$lt", "$lte")
TIME_COLUMN = "created_at"
METADATA_PREFIX = "metadata."
GOVERNANCE_NAMES = frozenset({*TAG_COLUMNS, "acl", "parents"})
"""Names a filter may not use: they say who may read a row (``parents`` carries the lineage its
tags derive from), and a filter only narrows what the governance filter admits."""
UNFILTERABLE_NAMES = frozenset(
    {"chunk_id", "text", "vector", "position", "doc_version", "ingest_run_id", "embedding_model", "metadata"}
)
FILTER_DESCRIPTION = (
    'Only chunks matching this, e.g. {"year": {"$gte": 2020}}: $eq $ne $in $nin $gt $gte $lt $lte $and $or '
    "over metadata fields, doc_id, source_uri, kind and created_at. It narrows what you may read, never widens it."
)
"""How every surface describes the ``filter`` argument."""
MAX_NAME_CHARS = 256
_ORDER: dict[str, Callable[[Any, Any], Any]] = {"$gt": op.gt, "$gte": op.ge, "$lt": op.lt, "$lte": op.le}
_ARROW_ORDER = {"$gt": pc.greater, "$gte": pc.greater_equal, "$lt": pc.less, "$lte": pc.less_equal}

Scalar = str | int | float | bool


@dataclass(frozen=True)
class _Literal:
    """A value as SQL and as the value compared in memory (a float for a number, microseconds
    since the epoch for a time), and what it is compared as (``text``, ``number``, ``bool``, ``time``)."""

    kind: str
    sql: str
    value: Any


class _Node:
    """One condition of a compiled filter: its SQL, and the rows of a ``VisibleFields`` it matches."""

    sql: str

    def mask(self, fields: VisibleFields) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class _Joined(_Node):
    """Every part holds (``every``: ``$and``, or several fields and operators side by side), or
    some part does (``$or``)."""

    parts: tuple[_Node, ...]
    sql: str
    every: bool

    def mask(self, fields: VisibleFields) -> np.ndarray:
        found = self.parts[0].mask(fields)
        for part in self.parts[1:]:
            found = found & part.mask(fields) if self.every else found | part.mask(fields)
        return found


@dataclass(frozen=True, eq=False)
class _Term(_Node):
    """One field compared with one value, or with a list of them (``$in``, ``$nin``)."""

    target: _Target
    operator: str
    literals: tuple[_Literal, ...]
    sql: str

    def mask(self, fields: VisibleFields) -> np.ndarray:
        check_deadline()
        return self.target.mask(fields, self.operator, self.literals)


@dataclass(frozen=True, kw_only=True)
class Narrowing:
    """A validated filter: the expression as given (for the receipt), its SQL, and its conditions."""

    expression: Mapping[str, Any]
    sql: str
    condition: _Node

    def within(self, tenant: str) -> Narrowing:
        """This filter over one tenant's rows (the SQL route's form: another tenant's rows never
        weigh in how it runs)."""
        sql = f"(tenant = {sql_string(tenant)}) AND ({self.sql})"
        return Narrowing(expression=self.expression, sql=sql, condition=self.condition)

    @cached_property
    def digest(self) -> str:
        """A short name for the filter's conditions (a hash of its SQL): what a cache of what was made
        of its matches is keyed by, so a key costs the same whatever the filter's size."""
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()

    def describe(self) -> str:
        """The filter as the receipt records it: canonical JSON."""
        return json.dumps(self.expression, sort_keys=True, ensure_ascii=False)

    def mask(self, fields: VisibleFields) -> np.ndarray:
        """Which of ``fields``' rows (rows the caller may read) this filter matches. The work is
        counted: ``filter_rows`` evaluated, ``filter_matched`` matched."""
        found = self.condition.mask(fields) if fields.rows else np.zeros(0, dtype=bool)
        work("filter_rows", fields.rows)
        work("filter_matched", int(np.count_nonzero(found)))
        return found


@dataclass(frozen=True, kw_only=True)
class Narrow:
    """A narrowing filter's matches among the rows one caller may read at one table version, whose
    they are (the reader's key; None: no one's, so nothing made of them is held), and, when it was
    evaluated in memory, the fields it was evaluated over and which of them it matched."""

    narrowing: Narrowing
    matching: pa.Array
    owner: tuple[str, ...] | None
    fields: VisibleFields | None = None
    mask: np.ndarray | None = None

    @property
    def count(self) -> int:
        return len(self.matching)


def narrowing(expression: Mapping[str, Any] | None, limits: FilterLimits | None = None) -> Narrowing | None:
    """The filter ``expression`` validated and compiled (None and ``{}``: no filter) within
    ``limits`` (the defaults when not given); an ``InvalidRequestError`` naming the part at fault,
    or the limit it is over, otherwise."""
    if expression is None:
        return None
    if not isinstance(expression, Mapping):
        raise InvalidRequestError(f"filter must be an object such as {{\"year\": {{\"$gte\": 2020}}}}, not {type(expression).__name__}")
    if not expression:
        return None
    limits = limits or FilterLimits()
    size = _size(expression)
    if size > limits.bytes:
        raise InvalidRequestError(
            f"filter is {size} bytes as JSON; the limit is {limits.bytes} (setting filter_max_bytes)"
        )
    condition = _Compiler(limits).expression(expression, "filter", 1)
    return Narrowing(expression=dict(expression), sql=condition.sql, condition=condition)


def narrowed(where: str, narrowing: Narrowing | None) -> str:
    """The governance filter ``where`` ANDed with a narrowing filter: a row must pass both."""
    return where if narrowing is None else f"({where}) AND ({narrowing.sql})"


def _size(expression: Mapping[str, Any]) -> int:
    """The filter's size as compact JSON, in bytes (what the bytes limit counts)."""
    try:
        text = json.dumps(expression, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidRequestError(f"filter must be JSON (objects, lists, strings, numbers, booleans): {exc}") from None
    return len(text.encode("utf-8", "surrogatepass"))


class _Compiler:
    """One filter's compilation, in one pass over it: counts its conditions so a filter cannot grow
    past ``limits``."""

    def __init__(self, limits: FilterLimits) -> None:
        self.limits = limits
        self.terms = 0

    def expression(self, expression: object, at: str, depth: int) -> _Node:
        if not isinstance(expression, Mapping) or not expression:
            raise InvalidRequestError(f"{at} must be a non-empty object of fields and conditions")
        if depth > self.limits.depth:
            raise InvalidRequestError(f"{at} nests deeper than {self.limits.depth} levels (setting filter_max_depth)")
        parts = []
        for name, condition in expression.items():
            if not isinstance(name, str):
                raise InvalidRequestError(f"{at} has a key that is not text: {name!r}")
            if name in LOGICAL:
                parts.append(self.logical(name, condition, f"{at}.{name}", depth))
            elif name.startswith("$"):
                raise InvalidRequestError(f"{at}: {name!r} is not an operator here; use $and or $or, or a field name")
            else:
                parts.append(self.field(name, condition, f"{at}.{name}"))
        return _all(parts)

    def logical(self, operator: str, operands: object, at: str, depth: int) -> _Node:
        if isinstance(operands, (str, bytes, Mapping)) or not isinstance(operands, Sequence) or not operands:
            raise InvalidRequestError(f"{at} must be a non-empty list of conditions")
        parts = [self.expression(item, f"{at}[{index}]", depth + 1) for index, item in enumerate(operands)]
        return _all(parts) if operator == "$and" else _any(parts)

    def field(self, name: str, condition: object, at: str) -> _Node:
        target = _target(name, at)
        if not isinstance(condition, Mapping):
            return self.term(target, "$eq", condition, at)
        if not condition:
            raise InvalidRequestError(f"{at} is an empty condition; give an operator such as $eq")
        parts = []
        for operator, value in condition.items():
            if operator not in COMPARISONS and operator not in MEMBERSHIP:
                known = ", ".join([*COMPARISONS, *MEMBERSHIP])
                raise InvalidRequestError(f"{at}: operator {operator!r} is not one of {known}")
            parts.append(self.term(target, operator, value, f"{at}.{operator}"))
        return _all(parts)

    def term(self, target: _Target, operator: str, value: object, at: str) -> _Term:
        check_deadline()
        self.terms += 1
        if self.terms > self.limits.terms:
            raise InvalidRequestError(f"filter has more than {self.limits.terms} conditions (setting filter_max_terms)")
        if operator in MEMBERSHIP:
            if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or not value:
                raise InvalidRequestError(f"{at} must be a non-empty list of values")
            if len(value) > self.limits.values:
                raise InvalidRequestError(
                    f"{at} lists {len(value)} values; the limit is {self.limits.values} (setting filter_max_values)"
                )
            literals = tuple(dict.fromkeys(target.literal(item, f"{at}[{index}]") for index, item in enumerate(value)))
            matched = target.member_sql(literals)
            sql = matched if operator == "$in" else target.differs_sql(matched)
            return _Term(target=target, operator=operator, literals=literals, sql=sql)
        literal = target.literal(value, at, ranged=operator in RANGES)
        equal = target.compare_sql("=", literal)
        sql = target.differs_sql(equal) if operator == "$ne" else target.compare_sql(COMPARISONS[operator], literal)
        return _Term(target=target, operator=operator, literals=(literal,), sql=sql)


@dataclass(frozen=True)
class _Target:
    """What a filter names: a metadata field (by its key) or a column."""

    column: str | None  # None: a metadata field
    key: str = ""

    # -- values ----------------------------------------------------------------------------

    def literal(self, value: object, at: str, *, ranged: bool = False) -> _Literal:
        if self.column == TIME_COLUMN:
            return _timestamp(value, at)
        if self.column is not None:
            if not isinstance(value, str):
                raise InvalidRequestError(f"{at}: {self.column} is text; compare it with a string, not {value!r}")
            return _Literal("text", _quoted(value, at), value)
        if isinstance(value, bool):
            if ranged:
                raise InvalidRequestError(f"{at}: a range compares numbers, not {value!r}")
            return _Literal("bool", _quoted("true" if value else "false", at), value)
        if isinstance(value, (int, float)):
            number = as_float(value)
            if not math.isfinite(number):
                raise InvalidRequestError(f"{at}: {value!r} is not a finite number")
            return _Literal("number", repr(number), number)
        if isinstance(value, str):
            if ranged:
                raise InvalidRequestError(
                    f"{at}: a range on metadata compares numbers, not {value!r}; store dates as numbers to range over them"
                )
            return _Literal("text", _quoted(json.dumps(value, ensure_ascii=False), at), value)
        hint = " (for any of several values, use $in)" if isinstance(value, list) else ""
        raise InvalidRequestError(f"{at}: {value!r} is not a string, number or boolean{hint}")

    # -- as SQL ----------------------------------------------------------------------------

    @property
    def _extracted(self) -> str:
        return f"json_extract(metadata, {sql_string(self.path)})"

    @property
    def path(self) -> str:
        return f'$["{self.key}"]'

    def operand(self, kind: str) -> str:
        """The field as SQL, as a value of ``kind`` is compared with it. A text column is written
        ``(col || '')`` (the same value, NULL for NULL) so that no scalar index serves it: a probe of
        ``doc_id``'s index would read every tenant's and every reader's rows."""
        if self.column == TIME_COLUMN:
            return self.column
        if self.column is not None:
            return f"({self.column} || '')"
        if kind == "number":  # JSON text of any other type casts to NULL: typed equality
            return f"TRY_CAST({self._extracted} AS DOUBLE)"
        return self._extracted

    def compare_sql(self, operator: str, literal: _Literal) -> str:
        return f"{self.operand(literal.kind)} {operator} {literal.sql}"

    def member_sql(self, literals: Sequence[_Literal]) -> str:
        """One of ``literals``: an ``IN`` list per kind of value, so each row's field is read once
        per kind (not once per value); one pass over the values."""
        kinds: dict[str, list[str]] = {}
        for literal in literals:
            kinds.setdefault(literal.kind, []).append(literal.sql)
        parts = []
        for kind, sqls in kinds.items():
            listed = sqls[0] if len(sqls) == 1 else f"({', '.join(sqls)})"
            parts.append(f"{self.operand(kind)} {'=' if len(sqls) == 1 else 'IN'} {listed}")
        return _joined(parts, "OR")

    def differs_sql(self, matched: str) -> str:
        """Present (a NULL column or absent field is never matched) and not ``matched``."""
        present = f"{self.operand('text')} IS NOT NULL"
        return f"({present} AND NOT COALESCE({matched}, FALSE))"

    # -- in memory -------------------------------------------------------------------------

    def mask(self, fields: VisibleFields, operator: str, literals: tuple[_Literal, ...]) -> np.ndarray:
        """Which of ``fields``' rows the comparison holds for: the same answer as the SQL."""
        if self.column == TIME_COLUMN:
            times, present = fields.times
            return _compared(operator, literals, present, lambda lit: times == lit.value,
                             lambda lits: np.isin(times, [lit.value for lit in lits]),
                             lambda order, lit: _ORDER[order](times, lit.value))  # fmt: skip
        if self.column is not None:
            values = fields.texts[self.column]
            present = _bools(values.is_valid())

            def member(lits: Sequence[_Literal]) -> np.ndarray:
                return _bools(pc.is_in(values, value_set=pa.array([lit.value for lit in lits], pa.string())))

            return _compared(operator, literals, present, lambda lit: _bools(pc.equal(values, lit.value)), member,
                             lambda order, lit: _bools(_ARROW_ORDER[order](values, lit.value)))  # fmt: skip
        found = np.zeros(fields.rows, dtype=bool)
        field = fields.metadata.get(self.key)
        if field is not None:
            found[field.positions] = _metadata_mask(field, operator, literals)
        return found


def _metadata_mask(field: MetadataField, operator: str, literals: tuple[_Literal, ...]) -> np.ndarray:
    """The comparison over the rows that hold ``field`` (each present, of whatever type)."""

    def equal(literal: _Literal) -> np.ndarray:
        if literal.kind == "number":
            return field.numbers == literal.value
        if literal.kind == "bool":
            return field.booleans == int(literal.value)
        return _bools(pc.equal(field.texts, literal.value))

    def member(literals: Sequence[_Literal]) -> np.ndarray:
        found = np.zeros(len(field.positions), dtype=bool)
        by_kind: dict[str, list[Any]] = {}
        for literal in literals:
            by_kind.setdefault(literal.kind, []).append(literal.value)
        for kind, values in by_kind.items():
            if kind == "number":
                found |= np.isin(field.numbers, np.asarray(values, dtype=np.float64))
            elif kind == "bool":
                found |= np.isin(field.booleans, np.asarray([int(v) for v in values], dtype=np.int8))
            else:
                found |= _bools(pc.is_in(field.texts, value_set=pa.array(values, pa.string())))
        return found

    present = np.ones(len(field.positions), dtype=bool)
    return _compared(operator, literals, present, equal, member,
                     lambda order, lit: _ORDER[order](field.numbers, lit.value))  # fmt: skip


def _compared(
    operator: str,
    literals: tuple[_Literal, ...],
    present: np.ndarray,
    equal: Callable[[_Literal], np.ndarray],
    member: Callable[[Sequence[_Literal]], np.ndarray],
    ordered: Callable[[str, _Literal], np.ndarray],
) -> np.ndarray:
    """One operator's rows, from the field's own equality, membership and order (NaN, NULL and an
    absent field compare false; ``$ne`` and ``$nin`` hold only where the field is present)."""
    if operator == "$eq":
        return present & equal(literals[0])
    if operator == "$ne":
        return present & ~equal(literals[0])
    if operator == "$in":
        return present & member(literals)
    if operator == "$nin":
        return present & ~member(literals)
    with np.errstate(invalid="ignore"):
        return present & ordered(operator, literals[0])


def _bools(found: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow boolean result as a numpy mask, NULL read as false."""
    filled = pc.fill_null(found, False)
    if isinstance(filled, pa.ChunkedArray):
        filled = filled.combine_chunks()
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=bool)


def _all(parts: list[_Node]) -> _Node:
    return _together(parts, every=True)


def _any(parts: list[_Node]) -> _Node:
    return _together(parts, every=False)


def _together(parts: list[_Node], *, every: bool) -> _Node:
    if len(parts) == 1:
        return parts[0]
    return _Joined(parts=tuple(parts), sql=_joined([part.sql for part in parts], "AND" if every else "OR"), every=every)


def _target(name: str, at: str) -> _Target:
    if name.startswith(METADATA_PREFIX):
        return _metadata_field(name.removeprefix(METADATA_PREFIX), at)
    if name in GOVERNANCE_NAMES:
        raise InvalidRequestError(
            f"{at}: {name!r} governs who may read a row and cannot be filtered on; a filter only narrows "
            f"what the policy lets you read (for a metadata field called {name!r}, write {METADATA_PREFIX}{name})"
        )
    if name in UNFILTERABLE_NAMES:
        raise InvalidRequestError(
            f"{at}: {name!r} cannot be filtered on; filter on metadata fields, "
            f"{', '.join([*TEXT_COLUMNS, TIME_COLUMN])} (for a metadata field called {name!r}, write {METADATA_PREFIX}{name})"
        )
    if name in TEXT_COLUMNS or name == TIME_COLUMN:
        return _Target(column=name)
    return _metadata_field(name, at)


def _metadata_field(key: str, at: str) -> _Target:
    if not key or len(key) > MAX_NAME_CHARS:
        raise InvalidRequestError(f"{at}: a metadata field name has 1 to {MAX_NAME_CHARS} characters")
    if '"' in key or "\\" in key or not key.isprintable():
        raise InvalidRequestError(f"{at}: metadata field {key!r} holds a quote, a backslash or a control character")
    return _Target(column=None, key=key)


def _quoted(value: str, at: str) -> str:
    try:
        return sql_string(value)
    except ValueError as exc:
        raise InvalidRequestError(f"{at}: {exc}") from None


def _timestamp(value: object, at: str) -> _Literal:
    """An ISO 8601 time (UTC when it names no offset): a timestamp literal, and its microseconds."""
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        moment = None
    if moment is None:
        raise InvalidRequestError(f"{at}: created_at is compared with an ISO 8601 time such as 2026-01-31T12:00:00Z, not {value!r}")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        moment = moment.astimezone(UTC)
    except OverflowError:
        raise InvalidRequestError(f"{at}: {value!r} lies outside the years 1 to 9999 in UTC") from None
    micros = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // _MICROSECOND
    return _Literal("time", f"TIMESTAMP '{moment.isoformat(timespec='microseconds')}'", micros)


_MICROSECOND = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)


def _joined(parts: list[str], operator: str) -> str:
    return parts[0] if len(parts) == 1 else f" {operator} ".join(f"({part})" for part in parts)
