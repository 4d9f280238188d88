"""A stdlib HTTP server on 127.0.0.1, serving from a thread until stopped: the stand-in for what
lies outside the product (a lineage backend, an object store, an identity provider's keys)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackHTTPServer:
    def __init__(self, handler: type[BaseHTTPRequestHandler], port: int = 0) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def fixed_answer(status: int, body: bytes, *, path: str | None = None,
                 content_type: str = "application/json") -> type[BaseHTTPRequestHandler]:  # fmt: skip
    """A handler answering every GET and POST with ``status`` and ``body`` (at ``path`` only, if
    given; 404 elsewhere), having read any request body first."""

    class FixedAnswer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            length = int(self.headers.get("content-length") or 0)
            if length:
                self.rfile.read(length)
            if path is not None and self.path != path:
                self.send_error(404)
                return
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET  # noqa: N815 - the stdlib's name

        def log_message(self, *_: object) -> None:
            pass

    return FixedAnswer

