"""The API keys of a warehouse: made, checked, listed and revoked; stored as hashes in its
``api_keys`` table (``state``), so every replica knows every key. What a key proves is
``credentials``'s: an ``Authenticator`` is handed these keys (``Warehouse.authenticator``)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from .credentials import PREFIX, ApiKey
from .errors import AuthenticationError, InvalidRequestError, NotFoundError
from .governance.tags import principal_problem, tenant_problem
from .state import ApiKeyRow, ApiKeysTable

__all__ = ["ApiKeys", "api_keys_at"]


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class ApiKeys:
    """Create, verify, list and revoke the API keys of one warehouse.

    ``table`` is the warehouse's keys table, or a function that opens it: then it is opened at the
    first use, so a service that never meets a key never creates the table."""

    def __init__(self, table: ApiKeysTable | Callable[[], ApiKeysTable]) -> None:
        self._table: ApiKeysTable | None = None
        self._open: Callable[[], ApiKeysTable] | None = None
        if isinstance(table, ApiKeysTable):
            self._table = table
        else:
            self._open = table

    @property
    def table(self) -> ApiKeysTable:
        """The keys' table, opened now if it was given as a function."""
        if self._table is None:
            assert self._open is not None
            self._table = self._open()
        return self._table

    def create(self, *, subject: str, tenant: str) -> str:
        """A new key for ``subject`` in ``tenant``; returns the full key, which is not stored."""
        problem = principal_problem(subject) or tenant_problem(tenant)
        if problem:
            raise InvalidRequestError(problem)
        if not subject.startswith(("service:", "user:")):
            raise InvalidRequestError(f"an API key's subject must be service:NAME or user:NAME, not {subject!r}")
        key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        row = ApiKeyRow(
            key_id=key_id,
            key_hash=_digest(secret),
            subject=subject,
            tenant=tenant,
            created_at=datetime.now(UTC),
            revoked=False,
        )
        self.table.insert(row)
        return f"{PREFIX}{key_id}.{secret}"

    def verify(self, key: str) -> ApiKey:
        """The key's record, if ``key`` is a live key; ``AuthenticationError`` otherwise."""
        key_id, _, secret = key.removeprefix(PREFIX).partition(".")
        if not key.startswith(PREFIX) or len(key_id) != 16 or not secret or not key_id.isalnum():
            raise AuthenticationError("malformed API key; expected rwk_<id>.<secret>")
        row = self.table.get(key_id)
        if row is None or not hmac.compare_digest(row.key_hash, _digest(secret)):
            raise AuthenticationError("unknown API key")
        if row.revoked:
            raise AuthenticationError("API key has been revoked")
        return _record(row)

    def revoke(self, key_id: str) -> None:
        """Revoke a key for good: it stops verifying at once, on every replica."""
        if self.table.get(key_id) is None:
            raise NotFoundError(f"API key {key_id!r} not found; `ragwarden apikey list` shows the keys")
        self.table.set_revoked(key_id)

    def list(self) -> list[ApiKey]:
        """Every key, revoked ones too, oldest first."""
        return [_record(row) for row in self.table.rows()]


def api_keys_at(warehouse: str, storage_options: Mapping[str, str] | None = None, *, create: bool = True) -> ApiKeys:
    """The API keys of the warehouse at ``warehouse`` (a folder or an object-store URI), without
    opening the warehouse itself (no embedding model is loaded): for the ``apikey`` commands, and
    for a stdio server checking its token before it starts. The table is opened at the first use;
    without ``create`` a missing warehouse is refused then, naming the path."""
    return ApiKeys(lambda: ApiKeysTable.at(warehouse, storage_options, create=create))


def _record(row: ApiKeyRow) -> ApiKey:
    return ApiKey(
        key_id=row.key_id, subject=row.subject, tenant=row.tenant, created_at=row.created_at, revoked=row.revoked
    )
