"""The compliance console: a browser UI at ``/console`` over the same API and the same credentials.

The pages are static files shipped in the package (``console_static/``), with no CDN and no
build step. The browser signs in with a bearer token (kept in the tab's ``sessionStorage``) and
calls the ``/v1`` routes like any other client, so the console shows exactly what the API would
show the signed-in person, and nothing else.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

CONSOLE_PATH = "/console"
ASSETS = Path(__file__).with_name("console_static")

# Only this origin's own scripts, styles and API: an injected script or a third-party asset is refused.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class _ConsoleFiles(StaticFiles):
    """The console's assets, each answer with the security headers above."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response


def mount_console(app: FastAPI) -> None:
    """Serve the console at ``/console/`` on ``app``."""
    app.mount(CONSOLE_PATH, _ConsoleFiles(directory=ASSETS, html=True), name="console")
