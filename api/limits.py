"""Request body size limit, enforced before anything parses the body.

A body over the limit answers 413 naming the limit, whether it declared its length or streamed
it in chunks; nothing of it is parsed or written. A request whose client hung up before its body
was read (while it waited in line, say) is not run at all: it would be answered, as a body-less
request, with a 422 no one reads. It is marked ``CLIENT_GONE`` in its scope's state, so that the
access log records it as 499, the status servers use for a request its client closed.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CLIENT_GONE = "ragwarden.client_gone"
CLIENT_CLOSED_STATUS = 499


class BodyLimit:
    """ASGI middleware: refuse HTTP request bodies larger than ``max_bytes``."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, exempt: tuple[str, ...] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.exempt):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await self._refuse(send, 400, "bad_request", "Content-Length is not a number")
                return
            if length > self.max_bytes:
                await self._too_large(send)
                return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":  # the client hung up (waiting in line, say): no one to answer
                scope.setdefault("state", {})[CLIENT_GONE] = True
                return
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        await self._refuse(
            send, 413, "payload_too_large", f"request body is over the limit of {self.max_bytes} bytes (max_body_bytes)"
        )

    @staticmethod
    async def _refuse(send: Send, status: int, code: str, message: str) -> None:
        payload: dict[str, Any] = {"error": {"code": code, "message": message}}
        body = json.dumps(payload).encode("utf-8")
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
