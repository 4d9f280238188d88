"""A real uvicorn server on 127.0.0.1 in a background thread, for tests that speak HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from ragwarden.api.balance import WorkerLoads
from ragwarden.api.http import create_app
from ragwarden.config import AuthSettings, Settings
from ragwarden.warehouse import Warehouse


@contextmanager
def serving(app: Any, *, timeout: float = 30.0) -> Iterator[str]:
    """Serve ``app`` on an ephemeral loopback port; yields its base URL and stops it on exit."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="live-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)


def api_app(warehouse: Warehouse, auth: AuthSettings, *, peers: WorkerLoads | None = None, **settings: Any) -> Any:
    """The HTTP API (no MCP) of ``warehouse``, as ``ragwarden serve`` would run it with ``settings``."""
    return create_app(Settings(warehouse=warehouse.uri, auth=auth, **settings), warehouse=warehouse, with_mcp=False, peers=peers)
