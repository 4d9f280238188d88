"""Who a request is admitted as (``admission.FairSlots``), decided on the event loop without I/O.

A request is admitted as the verified identity of its credential where the process can tell it at
hand: a token signed with the shared secret (checked in tens of microseconds), or a credential the
routes verified before (an API key, a token signed by the identity provider's published keys),
remembered by a hash of it. Every other credential (its first request, or one that will fail) is
admitted as one caller, ``unverified``: an attacker cannot become many callers by sending many
strings, nor take another's place in line. A user's several tokens are one caller. A request with
more than one ``Authorization`` header is refused (the routes would read one, admission another).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from starlette.types import Scope

from ..credentials import Authenticator
from ..errors import AuthenticationError, InvalidRequestError
from ..governance.caller import Identity

UNVERIFIED = "unverified"
REMEMBERED = 65_536
"""Credentials verified by the routes that admission remembers (least recently used dropped)."""
VERIFIED = "ragwarden.identity"
"""A request's state: (its Authorization header, the identity admission verified it as)."""


class CallerNames:
    """The name each request is admitted under, and the credentials the routes verified."""

    def __init__(self, authenticator: Authenticator, remembered: int = REMEMBERED) -> None:
        self._authenticator = authenticator
        self._size = remembered
        self._known: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, scope: Scope) -> str:
        """The name ``scope``'s request is admitted under; ``InvalidRequestError`` for two credentials."""
        given = [value for name, value in scope.get("headers") or [] if name == b"authorization"]
        if len(given) > 1:
            raise InvalidRequestError(f"send one Authorization header, not {len(given)}")
        header = given[0].decode("latin-1") if given else None
        try:
            identity = self._authenticator.at_hand(header)
        except AuthenticationError:
            return UNVERIFIED
        if identity is not None:
            scope.setdefault("state", {})[VERIFIED] = (header, identity)
            return _name(identity)
        with self._lock:
            known = self._known.get(_digest(header))
            if known is not None:
                self._known.move_to_end(_digest(header))
        return known or UNVERIFIED

    def remember(self, header: str | None, identity: Identity) -> None:
        """A credential a route verified: later requests bearing it are admitted as its identity."""
        if header is None:
            return
        with self._lock:
            self._known[_digest(header)] = _name(identity)
            self._known.move_to_end(_digest(header))
            while len(self._known) > self._size:
                self._known.popitem(last=False)


def _name(identity: Identity) -> str:
    return f"identity:{identity.tenant}\x00{identity.subject}"


def _digest(header: str | None) -> str:
    return hashlib.sha256((header or "").encode("utf-8", "replace")).hexdigest()
