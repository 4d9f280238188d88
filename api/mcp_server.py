"""The MCP server: the warehouse as tools an agent calls on behalf of a real user.

Identity never comes from a tool's arguments. Over streamable HTTP it is each request's bearer
credential, verified by ``Authenticator`` through the SDK's ``TokenVerifier`` hook (a bad or missing
one is answered 401 before any tool runs); over stdio the launching process supplies one credential
(``RAGWARDEN_TOKEN``) and every call acts as its caller. The token's ``act`` claim names the agent,
so every receipt names both the user and the agent acting for it.

Every result carries the running union (labels, highest classification, chunk ids) of what the
session has been given so far, so an agent can label what it makes at least as high as anything
that went into it. Protocol 2026-07-28 has no sessions (each request stands alone, and even the
SDK's per-request ``ServerSession`` is new every time), so a session here is an application handle:
the legacy ``Mcp-Session-Id`` when a client still sends one, the process itself over stdio, else a
``session_id`` the server mints and the client passes back. Unions are held per (caller, handle), so
a handle is worthless in anyone else's hands, and they expire when idle.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel, Field
from starlette.applications import Starlette

from ..api_keys import api_keys_at
from ..config import Settings
from ..credentials import Authenticator
from ..errors import AuthenticationError, ConfigurationError, RagwardenError
from ..governance.caller import Identity
from ..ingest.lifecycle import MAX_DERIVED_CHARS
from ..release import version
from ..retrieval.collapse import GroupBy
from ..retrieval.hits import Hit
from ..retrieval.manifest import ContextManifest
from ..retrieval.narrowing import FILTER_DESCRIPTION
from ..retrieval.search import MAX_K, MAX_QUERY_CHARS, Mode
from ..warehouse import Warehouse
from .http_models import MAX_ID_CHARS, MAX_PARENTS, DerivedModel, ExplanationModel, HitModel, Level, ManifestModel

T = TypeVar("T")
SERVER_NAME = "ragwarden"
LOCAL_SESSION = "local"  # the one session of a server with a fixed identity (stdio): the process
SESSION_IDLE_SECONDS = 30 * 60  # as the SDK's own idle timeout for legacy HTTP sessions
MAX_SESSIONS = 1_000
_SESSION_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
PLACEHOLDER_ISSUER = "https://ragwarden.invalid"
SessionArg = Annotated[
    str | None,
    Field(pattern=_SESSION_ID.pattern, description="session_id of an earlier result, to keep widening its union."),
]
ChunkId = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS, description="A chunk or note id from a result.")]
# DNS-rebinding protection stays on (the SDK answers 421 to other Host headers); loopback by default.
LOOPBACK = TransportSecuritySettings(
    enable_dns_rebinding_protection=True,
    allowed_hosts=["127.0.0.1", "127.0.0.1:*", "localhost", "localhost:*", "[::1]", "[::1]:*"],
    allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
)


def transport_security(allowed_hosts: Sequence[str] = ()) -> TransportSecuritySettings:
    """Loopback, and the public names of a service behind a proxy (``Settings.allowed_hosts``:
    ``rag.example.com``, ``rag.example.com:*``): each admitted as a ``Host``, and as the ``Origin``
    of a page served from it over HTTPS or HTTP. Every other ``Host`` is still answered 421 and
    every other ``Origin`` 403, so a page whose name was rebound to this server reaches no tool."""
    hosts = list(dict.fromkeys(allowed_hosts))
    origins = [f"{scheme}://{host}" for host in hosts for scheme in ("https", "http")]
    return LOOPBACK.model_copy(update={"allowed_hosts": [*LOOPBACK.allowed_hosts, *hosts],
                                       "allowed_origins": [*LOOPBACK.allowed_origins, *origins]})  # fmt: skip


# -- results ------------------------------------------------------------------------------------


class SessionModel(BaseModel):
    """What this session has been given so far: pass ``session_id`` back to keep widening it."""

    session_id: str = Field(description="Pass back as session_id on later calls to continue this union.")
    count: int = Field(description="How many distinct chunks the session has been given.")
    chunk_ids: list[str]
    labels: list[str] = Field(description="Union of the labels of every chunk given so far.")
    classification: Level = Field(description="Highest classification of any chunk given so far.")

    @classmethod
    def of(cls, session_id: str, union: ContextManifest) -> SessionModel:
        return cls(
            session_id=session_id,
            count=len(union.chunk_ids),
            chunk_ids=list(union.chunk_ids),
            labels=list(union.labels),
            classification=union.classification.label,  # type: ignore[arg-type]
        )


class SearchResult(BaseModel):
    hits: list[HitModel]
    manifest: ManifestModel = Field(description="Labels, highest classification and versions of these hits.")
    session: SessionModel


class ChunkResult(BaseModel):
    chunk: HitModel
    session: SessionModel


# -- identity -----------------------------------------------------------------------------------


class CredentialVerifier:
    """The SDK's ``TokenVerifier`` over ``Authenticator``: an ``AccessToken`` whose subject is the
    caller and whose claims carry its tenant, agent and method; None (so 401) for a bad credential."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    async def verify_token(self, token: str) -> AccessToken | None:
        try:  # off the loop: a JWKS fetch or an API-key lookup may block
            identity = await anyio.to_thread.run_sync(self.authenticator.verify, token)
        except AuthenticationError:
            return None
        return AccessToken(
            token=token,
            client_id=identity.actor or identity.subject,  # the SDK binds legacy sessions to this principal
            scopes=[],
            subject=identity.subject,
            claims={"tenant": identity.tenant, "actor": identity.actor, "method": identity.method,
                    "groups": sorted(identity.groups)},
        )


def _token_identity() -> Identity:
    """The caller of the current HTTP request, from the token ``CredentialVerifier`` accepted."""
    token = get_access_token()
    claims = token.claims if token is not None else None
    if token is None or not token.subject or not claims or not isinstance(claims.get("tenant"), str):
        raise AuthenticationError("no verified caller: send Authorization: Bearer <token or API key>")
    return Identity(
        subject=token.subject, tenant=claims["tenant"], actor=claims.get("actor"), method=claims.get("method", "jwt"),
        groups=frozenset(claims.get("groups") or ()),
    )


# -- the session union --------------------------------------------------------------------------


class SessionUnions:
    """Running context manifests, one per (caller, session id), least recently used dropped first.

    Keyed by the caller as well as the handle, so a handle is worthless in anyone else's hands.
    Bounded in number and idle time: a union is up to a few hundred kilobytes (k=1000 ids and
    versions), and a stateless client that never passes its handle back leaves one per call.
    """

    def __init__(
        self,
        *,
        idle_seconds: float = SESSION_IDLE_SECONDS,
        max_sessions: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_seconds = idle_seconds
        self.max_sessions = max_sessions
        self._clock = clock
        self._unions: OrderedDict[tuple[str, str, str | None, str], tuple[float, ContextManifest]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._unions)

    @staticmethod
    def _key(caller: Identity, session_id: str) -> tuple[str, str, str | None, str]:
        return (caller.subject, caller.tenant, caller.actor, session_id)

    def _expire(self, now: float) -> None:
        while self._unions:
            oldest, (used, _) = next(iter(self._unions.items()))
            if len(self._unions) <= self.max_sessions and now - used <= self.idle_seconds:
                return
            del self._unions[oldest]

    def knows(self, caller: Identity, session_id: str) -> bool:
        """Whether ``caller`` holds a live session ``session_id``."""
        with self._lock:
            self._expire(self._clock())
            return self._key(caller, session_id) in self._unions

    def widen(self, caller: Identity, session_id: str, hits: Sequence[Hit]) -> ContextManifest:
        """The session's union widened by ``hits`` (and kept as such); a new session starts empty."""
        key, now = self._key(caller, session_id), self._clock()
        with self._lock:
            _, union = self._unions.pop(key, (now, ContextManifest()))
            union = union.including(hits)
            self._unions[key] = (now, union)
            self._expire(now)
            return union


# -- the server ---------------------------------------------------------------------------------


class RagwardenMCP(MCPServer):
    """``MCPServer`` whose streamable HTTP app defaults to the path and transport security it was
    built with, so ``create_app`` can mount ``streamable_http_app()`` as it is."""

    def __init__(
        self, *args: Any, streamable_path: str, transport_security: TransportSecuritySettings, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.streamable_path = streamable_path
        self.transport_security = transport_security

    def streamable_http_app(self, **options: Any) -> Starlette:  # type: ignore[override]
        options.setdefault("streamable_http_path", self.streamable_path)
        options.setdefault("transport_security", self.transport_security)
        return super().streamable_http_app(**options)


def _version() -> str:
    return version(unknown="0")  # "0": run from a checkout without installing


def _auth_settings(authenticator: Authenticator) -> AuthSettings:
    """The SDK's resource-server settings. Only the issuer is required; this server serves no OAuth
    routes and no protected-resource metadata (``resource_server_url`` None), and checks the token's
    audience itself, so a placeholder issuer is enough when the configured one is not a URL."""
    issuer = authenticator.settings.issuer
    issuer_url = issuer if issuer and issuer.startswith(("https://", "http://")) else PLACEHOLDER_ISSUER
    return AuthSettings(issuer_url=issuer_url, resource_server_url=None)  # type: ignore[arg-type]


def build_mcp_server(
    warehouse: Warehouse,
    authenticator: Authenticator,
    *,
    identity: Identity | None = None,
    credential: str | None = None,
    streamable_path: str = "/",
    allowed_hosts: Sequence[str] = (),
    unions: SessionUnions | None = None,
) -> RagwardenMCP:
    """The MCP tools over ``warehouse``.

    With ``identity`` (stdio) every call acts as that caller, and ``credential``, the token it came
    from, is verified again before each call, so an expired token or a revoked API key stops the
    server rather than outliving it. Without, each HTTP request's bearer credential decides, and a
    request without a valid one never reaches a tool. ``streamable_path`` is the path inside the
    app that ``streamable_http_app()`` returns (``create_app`` mounts that app at ``/mcp``);
    ``allowed_hosts`` the public names it answers to besides loopback (``transport_security``).
    """
    fixed = identity is not None
    server = RagwardenMCP(
        SERVER_NAME,
        version=_version(),
        instructions=(
            "Governed retrieval: every result holds only rows the calling user may read. Each result's "
            "'session' is the union of labels and highest classification of everything given so far: "
            "label what you make from it at least that high, and pass session_id back to keep it."
        ),
        token_verifier=None if fixed else CredentialVerifier(authenticator),
        auth=None if fixed else _auth_settings(authenticator),
        streamable_path=streamable_path,
        transport_security=transport_security(allowed_hosts),
        log_level="WARNING",  # the SDK configures the root logger; at INFO the policy engine floods it
    )
    sessions = unions or SessionUnions()

    def caller() -> Identity:
        """Who calls (in a worker thread: re-verifying a credential may block)."""
        if identity is None:
            return _token_identity()
        if credential is not None and authenticator.verify(credential) != identity:
            raise AuthenticationError("the server's credential now names another caller")
        return identity

    async def run(action: Callable[[], T]) -> T:
        """``action()`` off the event loop; ragwarden's errors become tool errors, message only."""
        try:  # the worker thread runs in a copy of this context, so get_access_token() still answers
            return await anyio.to_thread.run_sync(action)
        except RagwardenError as exc:
            raise ToolError(str(exc)) from None

    async def begin(ctx: Context, given: str | None) -> tuple[Identity, str]:
        """The caller and its session handle, settled before the warehouse is asked anything: a
        handle passed back must be the caller's own and still live, else the union it expects
        (and would label its output by) is gone, and saying so beats silently starting afresh."""
        who = await run(caller)
        if given is not None:
            if not sessions.knows(who, given):
                raise ToolError(f"unknown or expired session_id {given!r}: omit it to start a new session")
            return who, given
        headers = ctx.headers
        legacy = headers.get("mcp-session-id") if headers is not None else None
        if legacy and _SESSION_ID.fullmatch(f"mcp:{legacy}"):  # a client still on the handshake protocol
            return who, f"mcp:{legacy}"
        return who, LOCAL_SESSION if fixed else secrets.token_urlsafe(16)

    def report(who: Identity, handle: str, hits: Sequence[Hit]) -> SessionModel:
        return SessionModel.of(handle, sessions.widen(who, handle, hits))

    @server.tool(title="Search the governed warehouse")
    async def search(
        query: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS, description="What to search for.")],
        ctx: Context,
        k: Annotated[int, Field(ge=1, le=MAX_K, description="How many chunks.")] = 5,
        mode: Mode = "vector",
        purpose: Annotated[str | None, Field(max_length=256, description="Why; kept in the audit receipt.")] = None,
        session_id: SessionArg = None,
        group_by: Annotated[GroupBy | None, Field(description='"doc": at most per_group chunks of one document.')] = None,
        per_group: Annotated[int, Field(ge=1, le=MAX_K, description="With group_by: chunks per document.")] = 1,
        distinct: Annotated[bool, Field(strict=True, description="One chunk of each text (copies collapse).")] = False,
        filter: Annotated[dict[str, Any] | None, Field(description=FILTER_DESCRIPTION)] = None,
    ) -> SearchResult:
        """The best k chunks the calling user may read, with their labels and classification."""
        who, handle = await begin(ctx, session_id)
        hits = await run(
            lambda: warehouse.search(query, caller=who, k=k, mode=mode, purpose=purpose, group_by=group_by,
                                     per_group=per_group, distinct=distinct, filter=filter)  # fmt: skip
        )
        return compact(SearchResult(
            hits=[HitModel.of(h) for h in hits],
            manifest=ManifestModel.of(ContextManifest.of(hits)),
            session=report(who, handle, hits),
        ))

    @server.tool(title="Fetch one chunk by id")
    async def get_chunk(chunk_id: ChunkId, ctx: Context, session_id: SessionArg = None) -> ChunkResult:
        """One chunk or saved note by id; 'not found' alike whether it is missing or not the user's to read."""
        who, handle = await begin(ctx, session_id)
        hit = await run(lambda: warehouse.get_chunk(chunk_id, caller=who))
        return compact(ChunkResult(chunk=HitModel.of(hit), session=report(who, handle, [hit])))

    @server.tool(title="Explain access to a chunk")
    async def explain_access(chunk_id: ChunkId) -> ExplanationModel:
        """Why the calling user may or may not read a chunk, step by step (only 'not visible' for a
        row the user may not learn anything of)."""
        who = await run(caller)
        return compact(ExplanationModel.of(
            await run(
                lambda: warehouse.explain(chunk_id, subject=who.subject, caller=who)
            )
        ))

    @server.tool(title="Save a note derived from chunks")
    async def save_note(
        text: Annotated[str, Field(min_length=1, max_length=MAX_DERIVED_CHARS)],
        parents: Annotated[
            list[str], Field(min_length=1, max_length=MAX_PARENTS, description="Chunk ids it derives from.")
        ],
        kind: Literal["note", "summary", "memory"] = "note",
    ) -> DerivedModel:
        """Save a note, summary or agent memory made from chunks the user may read. Its labels and
        classification come from those parents, and only someone who may read every parent can read it."""
        who = await run(caller)
        return compact(DerivedModel.of(
            await run(
                lambda: warehouse.derive(text, parents=parents, caller=who, kind=kind)
            )
        ))

    return server


def compact(result: BaseModel) -> Any:
    """A tool's answer: ``result`` as structured content (validated against the tool's output
    schema), and as text the same JSON without indentation, not the SDK's indented dump: a client
    that reads the text (a model's context) pays for every space."""
    data = result.model_dump(mode="json", by_alias=True)
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


def run_stdio(settings: Settings) -> None:
    """Serve the tools over stdio as the caller of ``RAGWARDEN_TOKEN`` (a JWT or an API key).

    The credential is checked before the warehouse (and its model) is opened, and a missing or
    refused one stops the process: it never serves without a verified caller.
    """
    credential = settings.auth.token
    if not credential:
        raise ConfigurationError(
            "set RAGWARDEN_TOKEN to the token or API key of the user this MCP server acts for; "
            "over stdio it serves no one without it"
        )
    _verified(Authenticator(settings.auth, api_keys_at(settings.warehouse, settings.storage_options, create=False)), credential)
    warehouse = Warehouse(settings, create=False)
    authenticator = warehouse.authenticator()
    identity = _verified(authenticator, credential)
    build_mcp_server(warehouse, authenticator, identity=identity, credential=credential).run("stdio")


def _verified(authenticator: Authenticator, credential: str) -> Identity:
    try:
        return authenticator.verify(credential)
    except AuthenticationError as exc:
        raise ConfigurationError(f"RAGWARDEN_TOKEN refused: {exc}") from None


__all__ = [
    "ChunkResult",
    "CredentialVerifier",
    "RagwardenMCP",
    "SearchResult",
    "SessionModel",
    "SessionUnions",
    "build_mcp_server",
    "run_stdio",
    "transport_security",
]
