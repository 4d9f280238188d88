"""The one place that maps ragwarden's exceptions to HTTP statuses and stable error codes.

Every error answer is ``{"error": {"code": ..., "message": ...}}``: the message says what was
wrong and what to do, never a stack trace. A chunk the caller may not see is ``404`` exactly as a
missing one is, so a status never reveals that a forbidden row exists.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    AuthenticationError,
    ConfigurationError,
    InvalidRequestError,
    InvalidSourceError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    PolicyError,
    RagwardenError,
    WarehouseError,
)

log = logging.getLogger(__name__)

# Most specific first: the first class an error is an instance of decides.
STATUS: tuple[tuple[type[RagwardenError], int, str], ...] = (
    (AuthenticationError, 401, "unauthenticated"),
    (PermissionDeniedError, 403, "forbidden"),
    (NotFoundError, 404, "not_found"),
    (PayloadTooLargeError, 413, "payload_too_large"),
    (InvalidRequestError, 422, "invalid_request"),
    (InvalidSourceError, 422, "invalid_source"),
    (PolicyError, 503, "policy_unavailable"),
    (WarehouseError, 503, "warehouse_unavailable"),
    (ConfigurationError, 500, "misconfigured"),
    (RagwardenError, 500, "internal"),
)
_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 406: "not_acceptable", 415: "unsupported_media_type"}


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str
    message: str


class ErrorBody(BaseModel):
    """Every error answer."""

    model_config = ConfigDict(extra="forbid")
    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": code.replace("_", " ")}
    for status, code in ((400, "bad_request"), (401, "unauthenticated"), (403, "forbidden"), (404, "not_found"),
                         (413, "payload_too_large"), (422, "invalid_request"), (503, "unavailable"))
}  # fmt: skip


def status_of(exc: RagwardenError) -> tuple[int, str]:
    return next((status, code) for cls, status, code in STATUS if isinstance(exc, cls))


def error_of(code: str, message: str) -> RagwardenError:
    """The error a client raises for an answer's error ``code``: the class the service mapped to it
    (a refused source record reads as an invalid request; an unknown code as a plain ``RagwardenError``)."""
    if code == "invalid_source":
        return InvalidRequestError(message)
    return next((cls for cls, _, known in STATUS if known == code), RagwardenError)(message)


def error_of_status(status: int, message: str) -> RagwardenError:
    """The error a client raises for an answer that carries no error code (from a proxy, say): the
    class the service maps to that client-error status, and for any other status ``WarehouseError``
    (the service is not answering as itself)."""
    code = next((code for _, known, code in STATUS if known == status and status < 500), None)
    return error_of(code, message) if code is not None else WarehouseError(message)


def error_response(status: int, code: str, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="ragwarden"'} if status == 401 else None
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "request does not match the schema"


def install_error_handlers(app: FastAPI) -> None:
    """Make every error, ours or the framework's, answer in the one JSON shape."""

    @app.exception_handler(RagwardenError)
    async def ragwarden_error(_: Request, exc: RagwardenError) -> JSONResponse:
        status, code = status_of(exc)
        if status >= 500:
            log.error("request failed: %s", exc, exc_info=exc)
        return error_response(status, code, str(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_request", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, _HTTP_CODES.get(exc.status_code, "http_error"), str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error", exc_info=exc)
        return error_response(500, "internal", "internal error; the server log has the details")
