"""A replica whose warehouse is of a format this release does not serve: it answers, and serves nothing.

During a rolling upgrade the new release starts before ``ragwarden migrate`` has run (or an old
replica outlives a migration to a newer format). Such a process must not fail to start and be
restarted in a loop, and must never answer from tables it does not understand: it answers
``/healthz`` (alive), refuses ``/readyz`` and every other request with 503 ``warehouse_format``
and the reason, and opens the warehouse every ``RECHECK_S`` seconds; once its format is one this
release serves, the full service takes over in the same process, on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from ..errors import WarehouseFormatError
from .http_errors import ERROR_RESPONSES, error_response, install_error_handlers
from .http_models import Health

RECHECK_S = 5.0

Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]


class UntilServable:
    """The ASGI app of such a replica: ``open_app`` builds the full service (raising
    ``WarehouseFormatError`` while the warehouse is not servable), ``refused`` says why it was not."""

    def __init__(self, open_app: Callable[[], FastAPI], refused: WarehouseFormatError, *, recheck_s: float = RECHECK_S) -> None:
        self._open_app = open_app
        self._refused = refused
        self._recheck_s = recheck_s
        self._app: FastAPI | None = None
        self._stack = contextlib.AsyncExitStack()
        self._refusing = self._refusing_app()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        else:
            await (self._app or self._refusing)(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        opening: asyncio.Task[None] | None = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                opening = asyncio.create_task(self._open_when_servable())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if opening is not None:
                    opening.cancel()
                await self._stack.aclose()  # the full service's own shutdown, if it took over
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _open_when_servable(self) -> None:
        while self._app is None:
            await asyncio.sleep(self._recheck_s)
            try:
                app = await asyncio.to_thread(self._open_app)
            except WarehouseFormatError as exc:
                self._refused = exc
                continue
            await self._stack.enter_async_context(app.router.lifespan_context(app))
            self._app = app

    def _refusing_app(self) -> FastAPI:
        app = FastAPI(title="ragwarden (not serving)", responses=ERROR_RESPONSES, docs_url=None, redoc_url=None, openapi_url=None)
        install_error_handlers(app)

        @app.get("/healthz", response_model=Health)
        def healthz() -> Health:
            """Liveness: the process answers (it serves nothing until the warehouse's format is one it reads)."""
            return Health(status="ok")

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
        def refused(path: str) -> JSONResponse:
            """Not ready: ``/readyz`` and every request answer 503 with the reason (no traceback logged each time)."""
            return error_response(self._refused.status, self._refused.code, str(self._refused))

        return app
