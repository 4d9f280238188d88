"""The one exception hierarchy of ragwarden.

Every error a caller can meet is a ``RagwardenError``; each message says what was wrong
with which input and what to do about it. Each class carries the HTTP ``status`` and the stable
error ``code`` a service answers it with (a subclass inherits both unless it names its own), and
``error_of`` / ``error_of_status`` turn an answer back into the error a client raises.

    RagwardenError                500 internal
    ├── ConfigurationError        500 misconfigured          a setting is missing or malformed
    ├── InvalidSourceError        422 invalid_source         a source record or file was refused at ingest
    ├── PolicyError               503 policy_unavailable     the policy cannot be loaded
    │   └── InvalidPolicyError    503 policy_unavailable     a policy file has a bad line (named, with its number)
    ├── InvalidRequestError       422 invalid_request        a search or operation was asked for with bad arguments
    │   ├── InvalidValueError     422 invalid_request        a value (tag, principal, record field) is malformed; also a ValueError
    │   └── PayloadTooLargeError  413 payload_too_large      a request body is over the size limit
    ├── AuthenticationError       401 unauthenticated        no credential, or one that does not verify
    ├── NotFoundError             404 not_found              no such item visible to the caller (missing and forbidden look alike)
    ├── PermissionDeniedError     403 forbidden              the policy does not grant the caller this operation
    ├── OverloadedError           503 overloaded             the service is at capacity: retry shortly or elsewhere
    ├── DeadlineExceededError     503 deadline_exceeded      a search worked past its deadline and was stopped
    └── WarehouseError            503 warehouse_unavailable  the warehouse is missing, damaged or inconsistent
        ├── StorageUnreachableError
        │                         503 storage_unreachable    its object store did not answer; nothing was changed
        └── WarehouseFormatError  503 warehouse_format       its format is not one this release serves (migrate, or a newer release)
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AuthenticationError",
    "ConfigurationError",
    "DeadlineExceededError",
    "InvalidPolicyError",
    "InvalidRequestError",
    "InvalidSourceError",
    "InvalidValueError",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "PolicyError",
    "RagwardenError",
    "StorageUnreachableError",
    "WarehouseError",
    "WarehouseFormatError",
    "error_of",
    "error_of_status",
]


class RagwardenError(Exception):
    """Base class of every error ragwarden raises on purpose."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"


class ConfigurationError(RagwardenError):
    """A setting is missing or malformed."""

    status = 500
    code = "misconfigured"


class InvalidSourceError(RagwardenError):
    """A source (JSONL record or file) was refused; nothing was written for it."""

    status = 422
    code = "invalid_source"

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


class PolicyError(RagwardenError):
    """The policy cannot be loaded or used."""

    status = 503
    code = "policy_unavailable"


class InvalidPolicyError(PolicyError):
    """A policy file has lines that are not valid rules: each named with its number and reason,
    one per line of the message (``line`` and ``reason`` are the first's; ``problems`` all)."""

    def __init__(self, path: str, line: int, reason: str, *, more: tuple[tuple[int, str], ...] = ()) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        self.problems = ((line, reason), *more)
        super().__init__("\n".join(f"{path}:{number}: {why}" for number, why in self.problems))


class InvalidRequestError(RagwardenError):
    """A request carried an argument out of range or of the wrong form."""

    status = 422
    code = "invalid_request"


class InvalidValueError(InvalidRequestError, ValueError):
    """A value is malformed: a tag, a principal, a classification, a field of a record or a
    manifest. The rules that check values raise it; it is also a ``ValueError``, so code that
    checks a value the way Python's own parsers do (``except ValueError``) treats it alike.
    ``field`` names the field at fault where one does (``subject``, ``tenant``, ...), so an edge
    can say where the value came from (a token's claim, say) without checking it again."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class PayloadTooLargeError(InvalidRequestError):
    """A request body is larger than the limit the service was started with."""

    status = 413
    code = "payload_too_large"


class AuthenticationError(RagwardenError):
    """The request carried no credential, or one that does not verify (signature, expiry, issuer,
    audience, or an unknown or revoked API key). The message says which, never whose."""

    status = 401
    code = "unauthenticated"


class NotFoundError(RagwardenError):
    """No such item is visible to the caller; deliberately the same whether it is missing or forbidden."""

    status = 404
    code = "not_found"


class PermissionDeniedError(RagwardenError):
    """The policy does not grant the caller the operation it asked for."""

    status = 403
    code = "forbidden"


class OverloadedError(RagwardenError):
    """The service has as many requests at work and waiting as it was started to take; nothing
    was done: retry after the ``Retry-After`` seconds, or on another replica."""

    status = 503
    code = "overloaded"


class DeadlineExceededError(RagwardenError):
    """A search worked past its deadline (``search_deadline_seconds``), or its client went away,
    and its work was stopped; nothing was returned. Narrow the request, or retry later."""

    status = 503
    code = "deadline_exceeded"


class WarehouseError(RagwardenError):
    """The warehouse is missing, damaged or inconsistent."""

    status = 503
    code = "warehouse_unavailable"


class StorageUnreachableError(WarehouseError):
    """The warehouse's object store did not answer (refused, unresolvable, timed out); the
    operation that met it changed nothing. Nothing is damaged: check that the endpoint answers
    and that this host reaches it, then retry."""

    status = 503
    code = "storage_unreachable"


class WarehouseFormatError(WarehouseError):
    """The warehouse is of a format this release does not serve: an earlier one (run
    ``ragwarden migrate``) or a newer release's (serve it with that release). Nothing was served
    from it and nothing written to it."""

    status = 503
    code = "warehouse_format"


def _naming_classes() -> list[type[RagwardenError]]:
    """The classes of this module that name their own code, parents before children and siblings
    in the order they are defined (a subclass that only inherits its code, such as
    ``InvalidPolicyError``, is left out: its parent answers for the code)."""
    found: list[type[RagwardenError]] = []
    pending: list[type[RagwardenError]] = [RagwardenError]
    while pending:
        cls = pending.pop(0)
        if cls.__module__ == __name__ and "code" in vars(cls):
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


_BY_CODE: dict[str, type[RagwardenError]] = {cls.code: cls for cls in _naming_classes()}


def error_of(code: str, message: str) -> RagwardenError:
    """The error a client raises for an answer's error ``code``: the class that answers with it (a
    refused source record reads as an invalid request, since its source is not the client's to
    name; an unknown code as a plain ``RagwardenError``)."""
    if code == InvalidSourceError.code:
        return InvalidRequestError(message)
    return _BY_CODE.get(code, RagwardenError)(message)


def error_of_status(status: int, message: str) -> RagwardenError:
    """The error a client raises for an answer that carries no error code (from a proxy, say): the
    class that answers with that client-error status (``InvalidRequestError`` for 422), and for any
    other status ``WarehouseError`` (the service is not answering as itself)."""
    if status >= 500:
        return WarehouseError(message)
    cls = next((cls for cls in _BY_CODE.values() if cls.status == status), None)
    return error_of(cls.code, message) if cls is not None else WarehouseError(message)
