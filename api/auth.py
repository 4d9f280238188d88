"""Who is calling: identity from a verified credential, and from nothing else.

Two kinds of credential, both sent as ``Authorization: Bearer <credential>``:

- a JWT from the identity provider: HS256 with a shared secret, or RS256/ES256 with a key from
  a JWKS (file or URL), its algorithm fixed by the kind of key (no ``none``, no confusion between
  the two); ``exp``, ``nbf``, ``iss`` and ``aud`` are checked; ``sub`` is the subject and a
  configured claim the tenant; an ``act`` claim (OAuth token exchange) names an agent acting for
  the subject, which gets the subject's visibility and no more: ``act.sub`` is ``agent:NAME`` or
  ``service:NAME`` (a bare name is an agent), and a person or group there is refused;
- an API key (``rwk_...``) for a service account, checked against the hashes in the warehouse.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jwt

from ..config import AuthSettings
from ..errors import AuthenticationError
from ..governance.tags import actor_problem, principal_problem, tenant_problem
from .keys import PREFIX, ApiKeys

if TYPE_CHECKING:
    from ..warehouse import Warehouse

ASYMMETRIC = ("RS256", "ES256")
JWKS_REFRESH_SECONDS = 300


@dataclass(frozen=True, kw_only=True)
class Identity:
    """A verified caller: the subject whose rights apply, its tenant, and the agent acting for it."""

    subject: str
    tenant: str
    actor: str | None = None
    method: str = "jwt"  # "jwt" or "api-key"

    def as_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "tenant": self.tenant, "actor": self.actor, "method": self.method}


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

            with urlopen(self.location, timeout=5) as response:  # noqa: S310 - a configured URL
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


class Authenticator:
    """Turns a bearer credential into an ``Identity``, or refuses with ``AuthenticationError``."""

    def __init__(self, settings: AuthSettings, keys: ApiKeys) -> None:
        self.settings = settings
        self.keys = keys
        self._jwks = _Jwks(settings.jwt_jwks) if settings.jwt_jwks else None

    def from_header(self, authorization: str | None) -> Identity:
        """The identity of an ``Authorization`` header value."""
        if not authorization:
            raise AuthenticationError("missing credential: send Authorization: Bearer <token or API key>")
        scheme, _, credential = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            raise AuthenticationError("the Authorization header must read 'Bearer <token or API key>'")
        return self.verify(credential.strip())

    def verify(self, credential: str) -> Identity:
        if credential.startswith(PREFIX):
            record = self.keys.verify(credential)
            return Identity(subject=record.subject, tenant=record.tenant, method="api-key")
        return self._verify_jwt(credential)

    def _signing_key(self, token: str) -> tuple[Any, str]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AuthenticationError("credential is neither an API key nor a well-formed JWT") from None
        algorithm = header.get("alg")
        if algorithm == "HS256" and self.settings.jwt_secret:
            return self.settings.jwt_secret, algorithm
        if algorithm in ASYMMETRIC and self._jwks is not None:
            key = self._jwks.key(header.get("kid"))
            if key.algorithm_name != algorithm:
                raise AuthenticationError(f"token algorithm {algorithm} does not match its key")
            return key.key, algorithm
        raise AuthenticationError(f"token algorithm {algorithm!r} is not accepted here")

    def _verify_jwt(self, token: str) -> Identity:
        if not self.settings.jwt_enabled:
            raise AuthenticationError("this service accepts API keys only (no JWT key is configured)")
        key, algorithm = self._signing_key(token)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=self.settings.audience,
                issuer=self.settings.issuer,
                leeway=self.settings.leeway_seconds,
                options={"require": ["exp", "iss", "aud", "sub"], "verify_nbf": True},
            )
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
        sub = claims["sub"]
        if not isinstance(sub, str) or not sub:
            raise AuthenticationError("token sub must be text")
        subject = sub if sub.startswith("user:") else f"user:{sub}"
        tenant = claims.get(self.settings.tenant_claim)
        problem = principal_problem(subject)
        if problem:
            raise AuthenticationError(f"token sub refused: {problem}")
        if tenant is None:
            raise AuthenticationError(f"token lacks the tenant claim {self.settings.tenant_claim!r}")
        problem = tenant_problem(tenant)
        if problem:
            raise AuthenticationError(f"token tenant refused: {problem}")
        actor = None
        if "act" in claims:
            act = claims["act"]
            named = act.get("sub") if isinstance(act, dict) else None
            if not isinstance(named, str) or not named:
                raise AuthenticationError("token act claim must be an object with a sub naming the agent")
            actor = named if ":" in named else f"agent:{named}"  # a bare name is an agent, as a bare sub is a user
            problem = actor_problem(actor)
            if problem:
                raise AuthenticationError(f"token act.sub refused: {problem}")
        return Identity(subject=subject, tenant=tenant, actor=actor)


def authenticator_for(warehouse: Warehouse, auth: AuthSettings | None = None) -> Authenticator:
    """The authenticator of a warehouse's services: ``auth`` (by default the warehouse's own auth
    settings) and the API keys stored in the warehouse."""
    return Authenticator(auth or warehouse.settings.auth, ApiKeys(warehouse.store.db))
