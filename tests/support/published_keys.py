"""An identity provider's published signing keys, changed while services run: a JWKS served on
127.0.0.1 whose key set a test replaces, as a provider does when it rotates its signing key. The
provider is outside the product, so it is the one thing stood in for here."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from support.loopback_http import LoopbackHTTPServer

JWKS_PATH = "/.well-known/jwks.json"


@dataclass
class SigningKey:
    """One ES256 key of the provider, named by its ``kid``."""

    kid: str
    private: Any = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()), repr=False)

    def jwk(self) -> dict[str, Any]:
        public = jwt.algorithms.ECAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**public, "kid": self.kid, "alg": "ES256", "use": "sig"}

    def sign(self, payload: dict[str, Any]) -> str:
        return jwt.encode(payload, self.private, algorithm="ES256", headers={"kid": self.kid})


class PublishedKeys:
    """The JWKS at ``url``, answering with the keys last ``publish``ed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._body = b'{"keys": []}'
        self._server = LoopbackHTTPServer(self._handler())

    @property
    def url(self) -> str:
        return f"{self._server.url}{JWKS_PATH}"

    def publish(self, *keys: SigningKey) -> None:
        body = json.dumps({"keys": [key.jwk() for key in keys]}).encode()
        with self._lock:
            self._body = body

    def stop(self) -> None:
        self._server.stop()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        published = self

        class Jwks(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                if self.path != JWKS_PATH:
                    self.send_error(404)
                    return
                with published._lock:
                    body = published._body
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        return Jwks
