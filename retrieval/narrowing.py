"""Narrowing filters: a caller's condition on metadata and a few columns, as LangChain and Chroma
write it (``{"year": {"$gte": 2020}, "$or": [...]}``), compiled to SQL in which every value is a
quoted literal. The search ANDs it with the governance filter inside the prefilter, so it can only
narrow what the caller may read, and the top-k stay exact among rows both visible and matching.

Semantics, the same on every surface:

- a bare name is a field of the row's metadata; ``doc_id``, ``source_uri``, ``kind`` and
  ``created_at`` name those columns; ``metadata.NAME`` names a metadata field whatever it is called;
- a comparison with a field the row does not have is false (``$ne`` and ``$nin`` included);
- equality is typed: the string ``"2020"`` is not the number ``2020``, nor ``true`` the number 1;
- ``$gt``, ``$gte``, ``$lt`` and ``$lte`` take numbers on metadata (compared as 64-bit floats),
  strings on the text columns and ISO 8601 times on ``created_at``;
- the columns that govern who may read a row are refused: a filter narrows, it never decides access.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..errors import InvalidRequestError
from ..governance.sql import sql_string
from ..state.schema import TAG_COLUMNS

COMPARISONS = {"$eq": "=", "$ne": "<>", "$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
MEMBERSHIP = ("$in", "$nin")
LOGICAL = ("$and", "$or")
RANGES = ("$gt", "$gte", "$lt", "$lte")
TEXT_COLUMNS = ("doc_id", "source_uri", "kind")
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
MAX_TERMS = 256
MAX_DEPTH = 16
MAX_VALUES = 1024
MAX_NAME_CHARS = 256

Scalar = str | int | float | bool


@dataclass(frozen=True, kw_only=True)
class Narrowing:
    """A validated filter: the expression as given (for the receipt) and its SQL."""

    expression: Mapping[str, Any]
    sql: str

    def within(self, tenant: str) -> Narrowing:
        """This filter over one tenant's rows: what a search finds its matches among (another
        tenant's rows never weigh in how it runs)."""
        return Narrowing(expression=self.expression, sql=f"(tenant = {sql_string(tenant)}) AND ({self.sql})")

    def describe(self) -> str:
        """The filter as the receipt records it: canonical JSON."""
        return json.dumps(self.expression, sort_keys=True, ensure_ascii=False)


def narrowing(expression: Mapping[str, Any] | None) -> Narrowing | None:
    """The filter ``expression`` validated and compiled (None and ``{}``: no filter); an
    ``InvalidRequestError`` naming the part at fault otherwise."""
    if expression is None:
        return None
    if not isinstance(expression, Mapping):
        raise InvalidRequestError(f"filter must be an object such as {{\"year\": {{\"$gte\": 2020}}}}, not {type(expression).__name__}")
    if not expression:
        return None
    compiler = _Compiler()
    sql = compiler.expression(expression, "filter", 1)
    return Narrowing(expression=dict(expression), sql=sql)


def narrowed(where: str, narrowing: Narrowing | None) -> str:
    """The governance filter ``where`` ANDed with a narrowing filter: a row must pass both."""
    return where if narrowing is None else f"({where}) AND ({narrowing.sql})"


class _Compiler:
    """One filter's compilation; counts its terms so a filter cannot grow without bound."""

    def __init__(self) -> None:
        self.terms = 0

    def expression(self, expression: object, at: str, depth: int) -> str:
        if not isinstance(expression, Mapping) or not expression:
            raise InvalidRequestError(f"{at} must be a non-empty object of fields and conditions")
        if depth > MAX_DEPTH:
            raise InvalidRequestError(f"{at} nests deeper than {MAX_DEPTH} levels")
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
        return _joined(parts, "AND")

    def logical(self, operator: str, operands: object, at: str, depth: int) -> str:
        if isinstance(operands, (str, bytes, Mapping)) or not isinstance(operands, Sequence) or not operands:
            raise InvalidRequestError(f"{at} must be a non-empty list of conditions")
        parts = [self.expression(item, f"{at}[{index}]", depth + 1) for index, item in enumerate(operands)]
        return _joined(parts, "AND" if operator == "$and" else "OR")

    def field(self, name: str, condition: object, at: str) -> str:
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
        return _joined(parts, "AND")

    def term(self, target: _Target, operator: str, value: object, at: str) -> str:
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise InvalidRequestError(f"filter has more than {MAX_TERMS} conditions")
        if operator in MEMBERSHIP:
            if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or not value:
                raise InvalidRequestError(f"{at} must be a non-empty list of values")
            if len(value) > MAX_VALUES:
                raise InvalidRequestError(f"{at} lists {len(value)} values; the limit is {MAX_VALUES}")
            values = [target.literal(item, f"{at}[{index}]") for index, item in enumerate(value)]
            matched = target.member(list(dict.fromkeys(values)))
            return matched if operator == "$in" else target.differs(matched)
        literal = target.literal(value, at, ranged=operator in RANGES)
        if operator == "$ne":
            return target.differs(target.compare("=", literal))
        return target.compare(COMPARISONS[operator], literal)


@dataclass(frozen=True)
class _Literal:
    """A value as SQL, and what it is compared as (``text``, ``number``, ``bool``, ``time``)."""

    kind: str
    sql: str


@dataclass(frozen=True)
class _Target:
    """What a filter names: a metadata field (by its JSON path) or a column."""

    column: str | None  # None: a metadata field
    path: str = ""

    def literal(self, value: object, at: str, *, ranged: bool = False) -> _Literal:
        if self.column == TIME_COLUMN:
            return _Literal("time", _timestamp(value, at))
        if self.column is not None:
            if not isinstance(value, str):
                raise InvalidRequestError(f"{at}: {self.column} is text; compare it with a string, not {value!r}")
            return _Literal("text", _quoted(value, at))
        if isinstance(value, bool):
            if ranged:
                raise InvalidRequestError(f"{at}: a range compares numbers, not {value!r}")
            return _Literal("bool", _quoted("true" if value else "false", at))
        if isinstance(value, (int, float)):
            try:
                number = float(value)
            except OverflowError:
                number = math.inf
            if not math.isfinite(number):
                raise InvalidRequestError(f"{at}: {value!r} is not a finite number")
            return _Literal("number", repr(number))
        if isinstance(value, str):
            if ranged:
                raise InvalidRequestError(
                    f"{at}: a range on metadata compares numbers, not {value!r}; store dates as numbers to range over them"
                )
            return _Literal("text", _quoted(json.dumps(value, ensure_ascii=False), at))
        hint = " (for any of several values, use $in)" if isinstance(value, list) else ""
        raise InvalidRequestError(f"{at}: {value!r} is not a string, number or boolean{hint}")

    @property
    def _extracted(self) -> str:
        return f"json_extract(metadata, {sql_string(self.path)})"

    def operand(self, kind: str) -> str:
        """The field as SQL, as a value of ``kind`` is compared with it."""
        if self.column is not None:
            return self.column
        if kind == "number":  # JSON text of any other type casts to NULL: typed equality
            return f"TRY_CAST({self._extracted} AS DOUBLE)"
        return self._extracted

    def compare(self, operator: str, literal: _Literal) -> str:
        return f"{self.operand(literal.kind)} {operator} {literal.sql}"

    def member(self, literals: list[_Literal]) -> str:
        """One of ``literals``: an ``IN`` list per kind of value, so each row's field is read
        once per kind (not once per value)."""
        kinds = {literal.kind: [item.sql for item in literals if item.kind == literal.kind] for literal in literals}
        parts = []
        for kind, sqls in kinds.items():
            listed = sqls[0] if len(sqls) == 1 else f"({', '.join(sqls)})"
            parts.append(f"{self.operand(kind)} {'=' if len(sqls) == 1 else 'IN'} {listed}")
        return _joined(parts, "OR")

    def differs(self, matched: str) -> str:
        """Present (a NULL column or absent field is never matched) and not ``matched``."""
        present = f"{self.column} IS NOT NULL" if self.column is not None else f"{self._extracted} IS NOT NULL"
        return f"({present} AND NOT COALESCE({matched}, FALSE))"


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
    return _Target(column=None, path=f'$["{key}"]')


def _quoted(value: str, at: str) -> str:
    try:
        return sql_string(value)
    except ValueError as exc:
        raise InvalidRequestError(f"{at}: {exc}") from None


def _timestamp(value: object, at: str) -> str:
    """An ISO 8601 time (UTC when it names no offset) as a timestamp literal."""
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
    return f"TIMESTAMP '{moment.isoformat(timespec='microseconds')}'"


def _joined(parts: list[str], operator: str) -> str:
    return parts[0] if len(parts) == 1 else f" {operator} ".join(f"({part})" for part in parts)
