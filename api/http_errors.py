"""How the HTTP service answers an error: each ragwarden error with the status and code its class
carries (``ragwarden.errors``), and the framework's own errors in the same shape.

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

from ..errors import RagwardenError

log = logging.getLogger(__name__)

_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    415: "unsupported_media_type",
}


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
        status, code = exc.status, exc.code
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
