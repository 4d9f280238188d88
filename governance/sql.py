"""SQL literals for LanceDB filters: every principal, label and tenant reaches SQL only as data."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone

from ..errors import InvalidRequestError, InvalidValueError


def sql_string(value: str) -> str:
    """A single-quoted SQL string literal; refuses characters a literal cannot carry safely."""
    if not isinstance(value, str):
        raise TypeError(f"SQL string literal needs str, got {type(value).__name__}")
    if "\x00" in value:
        raise InvalidValueError("a NUL character cannot appear in a filter value")
    return "'" + value.replace("'", "''") + "'"


def sql_list(values: Iterable[str]) -> str:
    """A non-empty SQL array literal of strings, sorted for a stable cache key."""
    items = sorted(set(values))
    if not items:
        raise InvalidValueError("an SQL array literal needs at least one element")
    return "[" + ", ".join(sql_string(v) for v in items) + "]"


def sql_in_list(values: Iterable[str]) -> str:
    """A parenthesised list for ``col IN (...)``."""
    return "(" + sql_list(values)[1:-1] + ")"


def sql_documents(keys: Iterable[tuple[str, str]]) -> str:
    """A filter matching the documents ``keys``, (tenant, doc id) pairs: a document id names a
    document only within its tenant."""
    by_tenant: dict[str, set[str]] = {}
    for tenant, doc_id in keys:
        by_tenant.setdefault(tenant, set()).add(doc_id)
    if not by_tenant:
        raise InvalidValueError("a documents filter needs at least one (tenant, doc id) pair")
    return " OR ".join(
        f"(tenant = {sql_string(tenant)} AND doc_id IN {sql_in_list(ids)})" for tenant, ids in sorted(by_tenant.items())
    )


def sql_timestamp(moment: object, what: str) -> str:
    """An SQL timestamp literal for a timezone-aware datetime (built here, never from caller text)."""
    if not isinstance(moment, datetime):
        raise InvalidRequestError(f"{what} must be a datetime, got {type(moment).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidRequestError(f"{what} {moment.isoformat()} has no timezone; pass an aware datetime")
    try:
        utc = moment.astimezone(timezone.utc)
    except OverflowError:
        raise InvalidRequestError(f"{what} {moment.isoformat()} is out of range in UTC") from None
    # the year zero-padded: strftime writes year 86 as "86", which the SQL parser refuses
    return f"TIMESTAMP '{utc.year:04d}-{utc.strftime('%m-%dT%H:%M:%S.%f')}Z'"
