"""The example deployment's lineage backend: an OpenLineage HTTP endpoint that logs what it receives.

ragwarden sends each run's events (``ragwarden.ingest``, ``derive``, ``sync``, ``forget``: START,
then COMPLETE or FAIL) to ``OPENLINEAGE_URL`` + ``/api/v1/lineage``, and keeps them in the
warehouse's spool until a backend takes them. Any endpoint that accepts the POST will do, so this
one stands in for Marquez, DataHub or a data catalog, which need a database and services of their
own: it prints each event as one JSON line (``docker compose logs lineage``) and answers 201.
Point ``OPENLINEAGE_URL`` at the real backend and this service goes. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LINEAGE_PATH = "/api/v1/lineage"
MAX_EVENT_BYTES = 16 * 1024 * 1024


class LineageHandler(BaseHTTPRequestHandler):
    """POST an event to ``/api/v1/lineage``; GET ``/healthz`` says the receiver answers."""

    def do_POST(self) -> None:
        if self.path.rstrip("/") != LINEAGE_PATH:
            return self._answer(404)
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_EVENT_BYTES:
            return self._answer(413 if length else 400)
        try:
            event = json.loads(self.rfile.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._answer(400)
        if not isinstance(event, dict) or "eventType" not in event:
            return self._answer(400)
        print(json.dumps(event, separators=(",", ":"), sort_keys=True), flush=True)
        self._answer(201)

    def do_GET(self) -> None:
        self._answer(200 if self.path == "/healthz" else 404)

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # stdout carries the events alone
        print(f"{self.address_string()} {format % args}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="Interface to listen on.")
    parser.add_argument("--port", type=int, default=5000, help="Port to listen on.")
    options = parser.parse_args()
    with ThreadingHTTPServer((options.host, options.port), LineageHandler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
