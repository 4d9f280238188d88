"""Who is calling: an ``Identity`` from a verified credential, and from nothing else.

Two kinds of credential, both sent as ``Authorization: Bearer <credential>``:

- a JWT from the identity provider: HS256 with a shared secret, or RS256/ES256 with a key from
  a JWKS (file or URL), its algorithm fixed by the kind of key (no ``none``, no confusion between
  the two); ``exp``, ``nbf``, ``iss`` and ``aud`` are checked; ``sub`` is the subject and a
  configured claim the tenant; an ``act`` claim (OAuth token exchange) names an agent acting for
  the subject, which gets the subject's visibility and no more: ``act.sub`` is ``agent:NAME`` or
  ``service:NAME`` (a bare name is an agent), and a person or group there is refused;
- an API key for a service account, kept in the warehouse as a hash so every replica knows it. A
  key reads ``rwk_<key id>.<secret>``: the id finds the row, the secret is compared by its SHA-256
  (a 256-bit random secret needs no slow hash). The secret is shown once, when created.

This is the domain side of authentication: the HTTP service, the MCP server and the framework
integrations all verify through ``authenticator_for``; the rows live in ``state.api_keys``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import jwt

from .config import AuthSettings
from .errors import AuthenticationError, InvalidValueError
from .governance.caller import Identity
from .governance.tags import group_named, user_named

__all__ = ["PREFIX", "ApiKey", "Authenticator", "KeyVerifier"]

PREFIX = "rwk_"
ASYMMETRIC = ("RS256", "ES256")
JWKS_REFRESH_SECONDS = 300


# -- API keys -------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ApiKey:
    """A stored key, without its secret."""

    key_id: str
    subject: str
    tenant: str
    created_at: datetime
    revoked: bool


class KeyVerifier(Protocol):
    """What an ``Authenticator`` asks of the warehouse's API keys (``api_keys.ApiKeys``): the live
    key's record, or ``AuthenticationError``."""

    def verify(self, key: str) -> ApiKey: ...


# -- credentials ----------------------------------------------------------------------------------


class _Jwks:
    """Public keys by ``kid`` from a JWKS file or URL: re-read every few minutes, and when a token
    names an unknown kid (key rotation), at most every five seconds."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._keys: dict[str, jwt.PyJWK] = {}
        self._loaded_at: float | None = None
        self._lock = threading.Lock()

    def _fetch(self) -> str:
        if self.location.startswith(("http://", "https://")):
            from urllib.request import urlopen

            with urlopen(self.location, timeout=5) as response:  # a configured URL
                return response.read().decode("utf-8")
        return Path(self.location).read_text(encoding="utf-8")

    def _load(self) -> None:
        try:
            keys = jwt.PyJWKSet.from_json(self._fetch()).keys
        except (OSError, ValueError, jwt.PyJWKSetError) as exc:
            raise AuthenticationError(f"cannot read the identity provider's keys: {exc}") from None
        self._keys = {key.key_id: key for key in keys if key.key_id}
        self._loaded_at = time.monotonic()

    def key(self, kid: object) -> jwt.PyJWK:
        if not isinstance(kid, str) or not kid:
            raise AuthenticationError("token header names no key (kid)")
        with self._lock:
            age = None if self._loaded_at is None else time.monotonic() - self._loaded_at
            if age is None or age > JWKS_REFRESH_SECONDS or (kid not in self._keys and age > 5):
                self._load()
            if kid not in self._keys:
                raise AuthenticationError("token is signed with a key the identity provider does not publish")
            return self._keys[kid]


def _bearer_credential(authorization: str | None) -> str:
    """The credential of an ``Authorization: Bearer ...`` header value; refused when there is none."""
    if not authorization:
        raise AuthenticationError("missing credential: send Authorization: Bearer <token or API key>")
    scheme, _, credential = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        raise AuthenticationError("the Authorization header must read 'Bearer <token or API key>'")
    return credential.strip()


def _unverified_header(token: str) -> dict[str, Any]:
    """A JWT's header, read before its signature is checked (to find its key); refused when the
    credential is no JWT at all."""
    try:
        return jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise AuthenticationError("credential is neither an API key nor a well-formed JWT") from None


class Authenticator:
    """Turns a bearer credential into an ``Identity``, or refuses with ``AuthenticationError``."""

    def __init__(self, settings: AuthSettings, keys: KeyVerifier) -> None:
        self.settings = settings
        self.keys = keys
        self._jwks = _Jwks(settings.jwt_jwks) if settings.jwt_jwks else None

    def from_header(self, authorization: str | None) -> Identity:
        """The identity of an ``Authorization`` header value."""
        return self.verify(_bearer_credential(authorization))

    def at_hand(self, authorization: str | None) -> Identity | None:
        """``from_header``'s answer where it needs no I/O, for a caller on an event loop: a missing
        or malformed credential is refused and a token signed with the shared secret verified
        (tens of microseconds); None where the answer needs the warehouse (an API key) or the
        identity provider's published keys (an asymmetric token)."""
        credential = _bearer_credential(authorization)
        if credential.startswith(PREFIX) or not self.settings.jwt_enabled:
            return None
        return self._verify_jwt(credential) if self._shared_secret_signs(_unverified_header(credential)) else None

    def verify(self, credential: str) -> Identity:
        if credential.startswith(PREFIX):
            record = self.keys.verify(credential)
            return Identity(subject=record.subject, tenant=record.tenant, method="api-key")
        return self._verify_jwt(credential)

    def _shared_secret_signs(self, header: dict[str, Any]) -> bool:
        return header.get("alg") == "HS256" and bool(self.settings.jwt_secret)

    def _signing_keys(self, token: str) -> tuple[list[Any], str]:
        """The keys that may have signed ``token``, in the order to try them: the shared secret, then
        the previous one during a rotation; or the published key its ``kid`` names."""
        header = _unverified_header(token)
        algorithm = header.get("alg")
        if self._shared_secret_signs(header):
            return [key for key in (self.settings.jwt_secret, self.settings.jwt_previous_secret) if key], algorithm
        if algorithm in ASYMMETRIC and self._jwks is not None:
            key = self._jwks.key(header.get("kid"))
            if key.algorithm_name != algorithm:
                raise AuthenticationError(f"token algorithm {algorithm} does not match its key")
            return [key.key], algorithm
        raise AuthenticationError(f"token algorithm {algorithm!r} is not accepted here")

    def _decode(self, token: str, key: Any, algorithm: str) -> dict[str, Any]:
        return jwt.decode(
            token,
            key,
            algorithms=[algorithm],
            audience=self.settings.audience,
            issuer=self.settings.issuer,
            leeway=self.settings.leeway_seconds,
            options={"require": ["exp", "iss", "aud", "sub"], "verify_nbf": True},
        )

    def _claims(self, token: str, keys: list[Any], algorithm: str) -> dict[str, Any]:
        """The claims of ``token`` under the first of ``keys`` its signature verifies with."""
        for key in keys[:-1]:
            try:
                return self._decode(token, key, algorithm)
            except jwt.InvalidSignatureError:
                continue  # signed with the next key, or with none: the last one says which
        return self._decode(token, keys[-1], algorithm)

    def _verify_jwt(self, token: str) -> Identity:
        if not self.settings.jwt_enabled:
            raise AuthenticationError("this service accepts API keys only (no JWT key is configured)")
        keys, algorithm = self._signing_keys(token)
        try:
            claims = self._claims(token, keys, algorithm)
        except jwt.ExpiredSignatureError:
            raise AuthenticationError("token has expired") from None
        except jwt.ImmatureSignatureError:
            raise AuthenticationError("token is not valid yet (nbf)") from None
        except jwt.InvalidAudienceError:
            raise AuthenticationError("token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise AuthenticationError("token is from another issuer") from None
        except jwt.MissingRequiredClaimError as exc:
            raise AuthenticationError(f"token lacks the {exc.claim!r} claim") from None
        except jwt.InvalidSignatureError:
            raise AuthenticationError("token signature does not verify") from None
        except jwt.PyJWTError as exc:
            raise AuthenticationError(f"token refused: {exc}") from None
        return self._identity(claims)

    def _identity(self, claims: dict[str, Any]) -> Identity:
        """The identity the claims name, checked once, by ``Identity`` itself; a refused field is
        named by the claim it came from."""
        sub = claims["sub"]
        if not isinstance(sub, str) or not sub:
            raise AuthenticationError("token sub must be text")
        tenant = claims.get(self.settings.tenant_claim)
        if tenant is None:
            raise AuthenticationError(f"token lacks the tenant claim {self.settings.tenant_claim!r}")
        actor = None
        if "act" in claims:
            act = claims["act"]
            named = act.get("sub") if isinstance(act, dict) else None
            if not isinstance(named, str) or not named:
                raise AuthenticationError("token act claim must be an object with a sub naming the agent")
            actor = named if ":" in named else f"agent:{named}"  # a bare name is an agent, as a bare sub is a user
        try:
            return Identity(subject=user_named(sub), tenant=tenant, actor=actor, groups=self._groups(claims))
        except InvalidValueError as exc:
            claim = {"subject": "sub", "tenant": self.settings.tenant_claim, "actor": "act.sub"}.get(
                exc.field or "", f"claim {self.settings.groups_claim!r}"
            )
            raise AuthenticationError(f"token {claim} refused: {exc}") from None

    def _groups(self, claims: dict[str, Any]) -> frozenset[str]:
        """The groups the token's groups claim names (none unless ``groups_claim`` is set), as
        ``group:`` principals: a value already ``group:NAME`` as it is, else through
        ``groups_map`` (a value matching none of its prefixes is ignored, ``group:NAME`` too) or,
        with no map, ``group:`` + the value. A claim that is not a list of text is refused."""
        name = self.settings.groups_claim
        if name is None or name not in claims:
            return frozenset()
        values = claims[name]
        if isinstance(values, str) or not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise AuthenticationError(f"token claim {name!r} must be a list of group names")
        if len(values) > MAX_CLAIMED_GROUPS:
            raise AuthenticationError(f"token claim {name!r} names {len(values)} groups; the limit is {MAX_CLAIMED_GROUPS}")
        groups = set()
        for value in values:
            group = _claimed_group(value, self.settings.groups_map)
            if group is not None:  # checked with the rest of the identity, by ``Identity``
                groups.add(group)
        return frozenset(groups)


MAX_CLAIMED_GROUPS = 256


def _claimed_group(value: str, prefixes: Mapping[str, str]) -> str | None:
    """The principal a groups-claim value names (None: not one of ours). With a map, every value
    goes through it, ``group:NAME`` too: a map confines the provider's groups to what it names."""
    if not prefixes:
        return group_named(value)
    matched = max((prefix for prefix in prefixes if value.startswith(prefix)), key=len, default=None)
    return None if matched is None else prefixes[matched] + value[len(matched):]
