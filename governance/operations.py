"""The operations ragwarden performs, by one name each: what the policy grants and receipts record."""

from __future__ import annotations

from enum import StrEnum


class Operation(StrEnum):
    """Every operation a receipt can record. ``search`` and ``get`` are reads decided row by row
    (visibility), never granted as such; the others are granted by the policy per tenant."""

    SEARCH = "search"
    GET = "get"
    INGEST = "ingest"
    DERIVE = "derive"
    SYNC = "sync"
    FORGET = "forget"
    EXPLAIN = "explain"
    AUDIT = "audit"
    ADMIN = "admin"
    PROVISION = "provision"  # users and groups from the identity provider (SCIM)

    @property
    def granted(self) -> bool:
        """Whether the policy grants this operation (``p`` rules name it as their object)."""
        return self not in (Operation.SEARCH, Operation.GET)


GRANTED_OPERATIONS = frozenset(op.value for op in Operation if op.granted)
"""The operation names a policy rule may grant."""
ALL_OPERATIONS = frozenset(op.value for op in Operation)
"""Every operation name a receipt may record."""
