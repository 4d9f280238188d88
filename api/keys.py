"""API keys for service accounts, kept in the warehouse as hashes so every replica knows them.

A key reads ``rwk_<key id>.<secret>``: the id finds the row, the secret is compared by its
SHA-256 (a 256-bit random secret needs no slow hash). The secret is shown once, when created.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from ..errors import AuthenticationError, InvalidRequestError, NotFoundError
from ..governance.sql import sql_string
from ..governance.tags import principal_problem, tenant_problem
from ..store import open_table

PREFIX = "rwk_"
TABLE = "api_keys"
SCHEMA = pa.schema(
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
class ApiKey:
    """A stored key, without its secret."""

    key_id: str
    subject: str
    tenant: str
    created_at: datetime
    revoked: bool


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class ApiKeys:
    """Create, verify, list and revoke API keys in one warehouse."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self._table: Any = None

    def _open(self) -> Any:
        if self._table is None:
            self._table = open_table(self._db, TABLE, SCHEMA)
        return self._table

    def create(self, *, subject: str, tenant: str) -> str:
        """A new key for ``subject`` in ``tenant``; returns the full key, which is not stored."""
        problem = principal_problem(subject) or tenant_problem(tenant)
        if problem:
            raise InvalidRequestError(problem)
        if not subject.startswith(("service:", "user:")):
            raise InvalidRequestError(f"an API key's subject must be service:NAME or user:NAME, not {subject!r}")
        key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        row = {
            "key_id": key_id,
            "key_hash": _digest(secret),
            "subject": subject,
            "tenant": tenant,
            "created_at": datetime.now(timezone.utc),
            "revoked": False,
        }
        self._open().add(pa.Table.from_pylist([row], schema=SCHEMA))
        return f"{PREFIX}{key_id}.{secret}"

    def _row(self, key_id: str) -> dict[str, Any] | None:
        rows = self._open().search().where(f"key_id = {sql_string(key_id)}").limit(2).to_list()
        return rows[0] if len(rows) == 1 else None

    def verify(self, key: str) -> ApiKey:
        """The key's record, if ``key`` is a live key; ``AuthenticationError`` otherwise."""
        key_id, _, secret = key.removeprefix(PREFIX).partition(".")
        if not key.startswith(PREFIX) or len(key_id) != 16 or not secret or not key_id.isalnum():
            raise AuthenticationError("malformed API key; expected rwk_<id>.<secret>")
        row = self._row(key_id)
        if row is None or not hmac.compare_digest(row["key_hash"], _digest(secret)):
            raise AuthenticationError("unknown API key")
        if row["revoked"]:
            raise AuthenticationError("API key has been revoked")
        return _record(row)

    def revoke(self, key_id: str) -> None:
        if self._row(key_id) is None:
            raise NotFoundError(f"API key {key_id!r} not found")
        self._open().update(where=f"key_id = {sql_string(key_id)}", values={"revoked": True})

    def list(self) -> list[ApiKey]:
        return [_record(row) for row in self._open().to_arrow().sort_by("created_at").to_pylist()]


def _record(row: dict[str, Any]) -> ApiKey:
    return ApiKey(
        key_id=row["key_id"],
        subject=row["subject"],
        tenant=row["tenant"],
        created_at=row["created_at"],
        revoked=row["revoked"],
    )
