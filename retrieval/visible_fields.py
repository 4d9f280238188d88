"""The fields a narrowing filter reads, of exactly the rows one compiled filter admits at one table
version: the text columns, ``created_at``, and each metadata field parsed once into columns.

Why: a filter is evaluated over the caller's visible rows alone (``narrowing``), so its work and
its time are a function of those rows and of the filter, never of rows the caller cannot read. The
fields are read through the governance filter (its scalar indexes find the rows; no other row's
fields are read) and held, like a scan's rows, under (filter, version): one read serves every
filter a caller with that visibility sends until the next commit. Nothing here is keyed by a
filter's content.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidValueError

FIELD_COLUMNS = ["chunk_id", "doc_id", "source_uri", "kind", "created_at", "metadata"]
"""What a filter can name, besides the id that names the row."""
TEXT_COLUMNS = ("doc_id", "source_uri", "kind")
"""The text columns a filter can name."""
FIELD_OVERHEAD_BYTES = 96  # a metadata key's dict entry and arrays' headers
NOT_BOOLEAN = -1


@dataclass(frozen=True, kw_only=True)
class VisibleIds:
    """The ids of the rows one compiled filter admits at one version (what ``get`` looks in)."""

    chunk_ids: pa.Array

    @property
    def nbytes(self) -> int:
        return int(self.chunk_ids.nbytes)


@dataclass(frozen=True, kw_only=True)
class MetadataField:
    """One metadata key over the rows that hold it: where they are, and its value as each type
    it can be compared as (NaN, NULL or ``NOT_BOOLEAN`` where the value is of another type)."""

    positions: np.ndarray  # int64, into the rows of its ``VisibleFields``
    numbers: np.ndarray  # float64
    texts: pa.Array  # string
    booleans: np.ndarray  # int8: 1, 0, or NOT_BOOLEAN

    @property
    def nbytes(self) -> int:
        return int(self.positions.nbytes + self.numbers.nbytes + self.texts.nbytes + self.booleans.nbytes)


@dataclass(frozen=True, kw_only=True)
class VisibleFields:
    """The filterable fields of one set of rows, in the order read."""

    chunk_ids: pa.Array
    texts: dict[str, pa.Array]  # TEXT_COLUMNS
    times: tuple[np.ndarray, np.ndarray]  # created_at in microseconds since the epoch (int64), and present
    metadata: dict[str, MetadataField]

    @property
    def rows(self) -> int:
        return len(self.chunk_ids)

    @property
    def nbytes(self) -> int:
        columns = self.chunk_ids.nbytes + sum(array.nbytes for array in self.texts.values())
        fields = sum(field.nbytes + len(key) + FIELD_OVERHEAD_BYTES for key, field in self.metadata.items())
        return int(columns + self.times[0].nbytes + self.times[1].nbytes + fields)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> VisibleFields:
        """From rows with ``FIELD_COLUMNS``. A row whose metadata is not a JSON object (or is not
        strict JSON) has no metadata fields, as ``json_extract`` reads it."""
        combined = table.combine_chunks()
        times = pc.cast(combined.column("created_at"), pa.timestamp("us", tz="UTC")).combine_chunks()
        present = np.asarray(times.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        micros = np.asarray(pc.fill_null(pc.cast(times, pa.int64()), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        return cls(
            chunk_ids=combined.column("chunk_id").combine_chunks(),
            texts={name: pc.cast(combined.column(name), pa.string()).combine_chunks() for name in TEXT_COLUMNS},
            times=(micros, present),
            metadata=_parsed(combined.column("metadata").to_pylist()),
        )


def _parsed(documents: list[str | None]) -> dict[str, MetadataField]:
    """Each key of the rows' metadata objects as a ``MetadataField``."""
    held: dict[str, tuple[list[int], list[Any]]] = {}
    for position, document in enumerate(documents):
        found = _object(document)
        for key, value in found.items():
            entry = held.get(key)
            if entry is None:
                entry = held[key] = ([], [])
            entry[0].append(position)
            entry[1].append(value)
    return {key: _field(positions, values) for key, (positions, values) in held.items()}


def _object(document: str | None) -> dict[str, Any]:
    """A metadata document's top-level object; empty for none, for anything else, and for text that
    is not JSON. (The warehouse gives metadata back as JSON it wrote itself, a non-finite number
    already turned to null; the second parser is for integers past 64 bits, which orjson refuses.)"""
    if not document:
        return {}
    try:
        found = orjson.loads(document)
    except orjson.JSONDecodeError:
        try:  # integers past 64 bits, which orjson refuses and JSON allows
            found = json.loads(document, parse_constant=_refuse_constant)
        except ValueError:
            return {}
    return found if isinstance(found, dict) else {}


def _refuse_constant(name: str) -> Any:
    raise InvalidValueError(f"{name} is not JSON")


def _field(positions: list[int], values: list[Any]) -> MetadataField:
    numbers = np.full(len(values), math.nan)
    booleans = np.full(len(values), NOT_BOOLEAN, dtype=np.int8)
    texts: list[str | None] = [None] * len(values)
    for index, value in enumerate(values):
        if isinstance(value, bool):
            booleans[index] = int(value)
        elif isinstance(value, (int, float)):
            numbers[index] = as_float(value)
        elif isinstance(value, str):
            texts[index] = value
    return MetadataField(positions=np.asarray(positions, dtype=np.int64), numbers=numbers,
                         texts=_strings(texts), booleans=booleans)  # fmt: skip


def _strings(texts: list[str | None]) -> pa.Array:
    """``texts`` as Arrow strings; one that UTF-8 cannot hold (a lone surrogate, which JSON's
    escapes can spell) as NULL: no filter value can equal it."""
    try:
        return pa.array(texts, pa.string())
    except (pa.ArrowException, UnicodeEncodeError):
        return pa.array([text if text is None or _encodable(text) else None for text in texts], pa.string())


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def as_float(value: int | float) -> float:
    """A JSON number as a 64-bit float, as the warehouse's SQL compares it (an integer past the
    float range is infinite, of its sign)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf
