"""LanceDB databases other than the warehouse: a collection read to be imported (``ragwarden
import lancedb``), and a table written bare, the yardstick a bulk load is measured against."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import lancedb
import pyarrow as pa

from ..errors import InvalidValueError


@dataclass(frozen=True, kw_only=True)
class ForeignTable:
    """One table of another LanceDB database, at the version it was opened at."""

    name: str
    rows: int
    columns: tuple[str, ...]
    metadata: Mapping[bytes, bytes]  # its schema's (an embedding function's record, say)
    _dataset: Any

    def batches(self, rows: int) -> Iterator[pa.RecordBatch]:
        """Every row, ``rows`` at a time."""
        yield from self._dataset.to_batches(batch_size=rows)


def open_foreign(uri: str, table: str) -> ForeignTable:
    """Table ``table`` of the LanceDB database at ``uri``; InvalidValueError naming what is there when it is not."""
    database = lancedb.connect(uri)
    try:
        dataset = database.open_table(table).to_lance()
    except (ValueError, FileNotFoundError) as exc:
        held = ", ".join(database.list_tables().tables) or "none"
        raise InvalidValueError(f"no table {table!r} in the LanceDB database at {uri} (its tables: {held})") from exc
    return ForeignTable(name=table, rows=dataset.count_rows(), columns=tuple(dataset.schema.names),
                        metadata=dict(dataset.schema.metadata or {}), _dataset=dataset)  # fmt: skip


def add_bare(uri: str, name: str, rows: pa.Table) -> None:
    """``rows`` written as table ``name`` of the LanceDB database at ``uri``, nothing else done."""
    lancedb.connect(uri).create_table(name, rows)
