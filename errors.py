"""The one exception hierarchy of ragwarden.

Every error a caller can meet is a ``RagwardenError``; each message says what was wrong
with which input and what to do about it. The HTTP layer maps each class to one status.

    RagwardenError
    ├── ConfigurationError        a setting is missing or malformed
    ├── InvalidSourceError        a source record or file was refused at ingest
    ├── PolicyError               the policy cannot be loaded
    │   └── InvalidPolicyError    a policy file has a bad line (named, with its number)
    ├── InvalidRequestError       a search or operation was asked for with bad arguments
    │   └── PayloadTooLargeError  a request body is over the size limit
    ├── AuthenticationError       no credential, or one that does not verify
    ├── NotFoundError             no such item visible to the caller (missing and forbidden look alike)
    ├── PermissionDeniedError     the policy does not grant the caller this operation
    └── WarehouseError            the warehouse is missing, damaged or inconsistent
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "ConfigurationError",
    "InvalidPolicyError",
    "InvalidRequestError",
    "InvalidSourceError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "PolicyError",
    "RagwardenError",
    "WarehouseError",
]


class RagwardenError(Exception):
    """Base class of every error ragwarden raises on purpose."""


class ConfigurationError(RagwardenError):
    """A setting is missing or malformed."""


class InvalidSourceError(RagwardenError):
    """A source (JSONL record or file) was refused; nothing was written for it."""

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


class PolicyError(RagwardenError):
    """The policy cannot be loaded or used."""


class InvalidPolicyError(PolicyError):
    """A policy file has a line that is not a valid rule."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{line}: {reason}")


class InvalidRequestError(RagwardenError):
    """A request carried an argument out of range or of the wrong form."""


class PayloadTooLargeError(InvalidRequestError):
    """A request body is larger than the limit the service was started with."""


class AuthenticationError(RagwardenError):
    """The request carried no credential, or one that does not verify (signature, expiry, issuer,
    audience, or an unknown or revoked API key). The message says which, never whose."""


class NotFoundError(RagwardenError):
    """No such item is visible to the caller; deliberately the same whether it is missing or forbidden."""


class PermissionDeniedError(RagwardenError):
    """The policy does not grant the caller the operation it asked for."""


class WarehouseError(RagwardenError):
    """The warehouse is missing, damaged or inconsistent."""
