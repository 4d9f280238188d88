"""The ``api_keys`` table: one row per API key, holding its hash and never its secret.

What a key is, how it is made and checked, is ``credentials``; this module only stores rows. A key
is never deleted (a revoked one stays, so its id is never reused), which makes the table a log:
``Store`` compacts it and prunes its old versions as it does the audit table's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from ..governance.sql import sql_string
from .schema import API_KEYS
from .tables import compact_and_prune, connect, damaged_files, local_path, names_storage_failures, open_table

API_KEYS_SCHEMA = pa.schema(
    [
        pa.field("key_id", pa.string(), nullable=False),
        pa.field("key_hash", pa.string(), nullable=False),
        pa.field("subject", pa.string(), nullable=False),
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("revoked", pa.bool_(), nullable=False),
    ]
)


@dataclass(frozen=True, kw_only=True)
class ApiKeyRow:
    """One stored key: its id, the hash of its secret, who it acts as, and whether it is revoked."""

    key_id: str
    key_hash: str
    subject: str
    tenant: str
    created_at: datetime
    revoked: bool


@names_storage_failures
class ApiKeysTable:
    """The API keys' rows in one warehouse (``db``: its LanceDB connection); the table is created
    empty when this opens it and it is absent."""

    def __init__(self, db: Any) -> None:
        self.uri: str = db.uri
        self._table = open_table(db, API_KEYS, API_KEYS_SCHEMA)

    @classmethod
    def at(cls, uri: str, storage_options: Mapping[str, str] | None = None, *, create: bool = True) -> ApiKeysTable:
        """The keys' table of the warehouse at ``uri``, without opening the rest of it (a missing
        warehouse is created, or with ``create`` False refused)."""
        return cls(connect(uri, storage_options, create=create))

    def damaged_files(self) -> list[str]:
        return damaged_files(local_path(self.uri), {API_KEYS: self._table})

    def insert(self, row: ApiKeyRow) -> None:
        """Append ``row`` (its ``key_id`` is fresh: 64 random bits)."""
        self._table.add(pa.Table.from_pylist([asdict(row)], schema=API_KEYS_SCHEMA))

    def get(self, key_id: str) -> ApiKeyRow | None:
        """The row of ``key_id``; None when there is none (or, never expected, more than one)."""
        rows = self._table.search().where(f"key_id = {sql_string(key_id)}").limit(2).to_list()
        return _row(rows[0]) if len(rows) == 1 else None

    def rows(self) -> list[ApiKeyRow]:
        """Every key, oldest first."""
        return [_row(row) for row in self._table.to_arrow().sort_by("created_at").to_pylist()]

    def set_revoked(self, key_id: str) -> None:
        """Mark the row of ``key_id`` revoked (a missing id changes nothing)."""
        self._table.update(where=f"key_id = {sql_string(key_id)}", values={"revoked": True})

    def compact(self) -> int:
        """Merge the table's small data files (each commit leaves one) and drop its old versions
        (``tables.VERSIONS_KEPT``); rows are unchanged. Returns the versions dropped."""
        return compact_and_prune(self._table)


def _row(columns: dict[str, Any]) -> ApiKeyRow:
    return ApiKeyRow(**{name: columns[name] for name in API_KEYS_SCHEMA.names})
