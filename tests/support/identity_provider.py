"""The test identity provider's settings: the HS256 secret, issuer and audience its tokens carry."""

from __future__ import annotations

JWT_SECRET = b"ragwarden-tests-shared-secret-0123456789"
ISSUER = "https://idp.test.invalid"
AUDIENCE = "ragwarden-tests"
