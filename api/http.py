"""The HTTP service (``ragwarden serve``): the warehouse behind authenticated routes.

Stateless by design: every durable thing lives in the warehouse, so any number of replicas can
serve one warehouse and restart one at a time. The caller's identity comes from its credential
(``credentials.py``); operations are then authorized by the policy inside the warehouse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from pydantic import BeforeValidator
from starlette.concurrency import run_in_threadpool

from ..config import Settings
from ..credentials import Authenticator
from ..deadline import Deadline, bounded, in_turns
from ..errors import InvalidValueError, PolicyError, RagwardenError
from ..governance.caller import Identity
from ..release import version
from ..retrieval.manifest import ContextManifest
from ..warehouse import Warehouse
from .admission import BEHIND, COST, Admission
from .balance import WorkerLoads
from .callers import VERIFIED, CallerNames
from .console import mount_console
from .http_errors import ERROR_RESPONSES, install_error_handlers
from .http_models import (
    MAX_ID_CHARS,
    AccessReviewModel,
    ChainModel,
    DerivedModel,
    DeriveRequest,
    ExplanationModel,
    ForgetRequest,
    ForgetResponse,
    Health,
    HitModel,
    IdentityModel,
    IngestRequest,
    IngestResponse,
    InventoryModel,
    LineageModel,
    ManifestModel,
    PolicyRequest,
    PolicyResponse,
    ReadersModel,
    Readiness,
    ReceiptModel,
    SearchRequest,
    SearchResponse,
    ServingIndexModel,
    SyncRequest,
    SyncResponse,
    TrendsModel,
    VocabularyModel,
)
from .limits import CLIENT_GONE, BodyLimit
from .metrics import METRICS_PATH, install_metrics, service_metrics
from .scim import mount_scim

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
DOCS_ASSETS = "/docs-assets"
MAX_RECEIPTS = 1000
ChunkId = Annotated[str, Path(max_length=MAX_ID_CHARS, description="A chunk or derived row id.")]
ItemId = Annotated[str, Path(max_length=MAX_ID_CHARS, description="A document, chunk or derived row id.")]


def _not_a_number(value: object) -> object:
    """Refuse a number where a date-time is documented (pydantic would read it as a Unix time)."""
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return value
    raise InvalidValueError("must be an ISO 8601 date-time with a timezone, such as 2026-01-31T00:00:00Z")


Instant = Annotated[datetime, BeforeValidator(_not_a_number)]

_bearer = HTTPBearer(auto_error=False, description="A JWT from the identity provider, or an API key (rwk_...).")


Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _header(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    """The ``Authorization`` header value the bearer scheme read (None: no header)."""
    return f"{credentials.scheme} {credentials.credentials}" if credentials else None


def _caller(request: Request, credentials: Bearer) -> Identity:
    """The verified identity of the request's bearer credential (401 without one), remembered for
    admission (``callers``)."""
    authenticator: Authenticator = request.app.state.authenticator
    header = _header(credentials)
    identity = authenticator.from_header(header)
    request.app.state.caller_names.remember(header, identity)
    return identity


Verified = Annotated[Identity, Depends(_caller)]


async def _caller_on_loop(request: Request, credentials: Bearer) -> Identity:
    """``_caller``, decided on the event loop where that needs no I/O (no credential, or a token
    signed with the shared secret), else in a worker thread as ``_caller`` is. Why: a hand-off to a
    thread waits its turn at the interpreter lock under load, and with a few requests at work that
    wait is the service's throughput (two hand-offs against one: ``docs/performance.md``, the
    constants table)."""
    verified = request.scope.get("state", {}).get(VERIFIED)
    header = _header(credentials)
    if verified is not None and verified[0] == header:  # decided once, on admission
        return verified[1]
    authenticator: Authenticator = request.app.state.authenticator
    return authenticator.at_hand(header) or await run_in_threadpool(_caller, request, credentials)


VerifiedOnLoop = Annotated[Identity, Depends(_caller_on_loop)]


async def _call_off_when_gone(request: Request, deadline: Deadline) -> None:
    """Stop the request's work if its client goes away before the answer (the body is read: the
    next message is the disconnect, or nothing until the answer is sent)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            request.scope.setdefault("state", {})[CLIENT_GONE] = True
            deadline.call_off("its client went away")
            return


def _closed(warehouse: Warehouse) -> None:
    """The warehouse closed as the service stops: said in one line when it cannot be (its
    journal's receipts already count as the log's; the next writer folds them)."""
    try:
        warehouse.close()
    except RagwardenError as exc:
        log.warning("stopping: the audit journal was not folded, the next writer folds it (%s)", exc)


def create_app(
    settings: Settings, *, warehouse: Warehouse | None = None, with_mcp: bool = True, peers: WorkerLoads | None = None
) -> FastAPI:
    """The FastAPI app over one warehouse; ``with_mcp`` mounts the MCP server at ``/mcp``;
    ``peers``: this process's slot among the workers of ``serve --workers N`` (``balance``)."""
    warehouse = warehouse or Warehouse(settings)
    warehouse.policy  # noqa: B018 -- a stored policy that does not load is refused before serving
    authenticator = warehouse.authenticator(settings.auth)
    caller_names = CallerNames(authenticator)
    mcp_server = None
    if with_mcp:
        from .mcp_server import build_mcp_server

        mcp_server = build_mcp_server(warehouse, authenticator, streamable_path="/", allowed_hosts=settings.allowed_hosts)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            # Last out: the journal folded and the background work ended while the store still
            # answers (a replica stopped by SIGTERM never reaches the interpreter's exit hooks).
            stack.push_async_callback(asyncio.to_thread, _closed, warehouse)
            if mcp_server is not None:
                await stack.enter_async_context(mcp_server.session_manager.run())
            if peers is not None:  # counted among the workers once it serves, until it stops
                peers.claim()
                stack.callback(peers.release)
                publishing = asyncio.create_task(peers.keep_published())
                stack.callback(publishing.cancel)
            yield

    app = FastAPIOffline(  # /docs served from the package: it works where no CDN can be reached
        static_url=DOCS_ASSETS,
        title="ragwarden",
        summary="Governed retrieval: every answer is filtered by the policy for the caller of the credential.",
        version=version(),
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    metrics = service_metrics(warehouse, settings)
    app.add_middleware(
        Admission, max_in_flight=settings.max_in_flight, max_queued=settings.max_queued,
        exempt=("/healthz", "/readyz", METRICS_PATH), streams=(MCP_PATH,), peers=peers, caller_of=caller_names,
        server_timing=settings.server_timing, on_stages=metrics.timed if metrics is not None else None,
    )
    install_metrics(app, metrics, settings)  # around admission, so its refusals are counted too
    app.state.warehouse = warehouse
    app.state.authenticator = authenticator
    app.state.caller_names = caller_names

    @app.get("/healthz", response_model=Health, tags=["service"])
    def healthz() -> Health:
        """Liveness: the process answers."""
        return Health(status="ok")

    @app.get("/readyz", response_model=Readiness, tags=["service"])
    def readyz() -> Readiness:
        """Readiness: the warehouse answers, is of a format this release serves, and a policy is
        in force (503 otherwise, with the reason)."""
        warehouse.check_format()
        policy = warehouse.policy
        table_version = warehouse.table_version
        if policy is None:
            raise PolicyError("no policy is in force: install one (ragwarden policy install) before serving")
        serving = warehouse.serving_status()
        return Readiness(
            status="ready", policy_version=policy.version, table_version=table_version, policy_problem=warehouse.public_policy_problem,
            serving_index=ServingIndexModel(state=serving.state, version=serving.version, rows=serving.rows,
                                            bytes=serving.bytes, reason=serving.reason, warm=serving.warm),
        )  # fmt: skip

    @app.get("/v1/whoami", response_model=IdentityModel, tags=["identity"])
    def whoami(identity: Verified) -> IdentityModel:
        """Who the credential says the caller is, and what the policy in force grants it (read
        from the policy alone: no row is read and no receipt written)."""
        return IdentityModel(**identity.as_dict(), rights=list(warehouse.rights(caller=identity)))

    @app.post("/v1/search", response_model=SearchResponse, tags=["retrieval"])
    async def search(body: SearchRequest, identity: VerifiedOnLoop, request: Request) -> Response:
        """The best k chunks the caller may read, with the context manifest of what they are."""
        deadline = Deadline(settings.search_deadline_seconds, request.scope.get("state", {}).get(BEHIND))

        # The search and its answer's JSON in one hand-off to a worker thread, after the credential
        # is decided (a dependency, so that a caller without one hears 401 before anything about
        # its body): FastAPI's own path takes three (a sync dependency, the route, the response
        # model's check), and under load each waits its turn at the interpreter lock. Its work
        # stops at the deadline, or when the client goes away.
        def answer() -> Response:
            began = time.thread_time()
            with bounded(deadline.seconds, deadline):
                hits = warehouse.search(
                    body.query, caller=identity, k=body.k, mode=body.mode, min_version=body.min_version,
                    purpose=body.purpose, group_by=body.group_by, per_group=body.per_group, distinct=body.distinct,
                    filter=body.filter,
                )  # fmt: skip
                manifest = ManifestModel.of(ContextManifest.of(hits))
                model = SearchResponse(hits=[HitModel.of(h) for h in in_turns(hits)], manifest=manifest)
            answered = model.model_dump_json().encode()
            request.scope.setdefault("state", {})[COST] = time.thread_time() - began  # its own, not its pauses
            return Response(answered, media_type="application/json")

        watching = asyncio.create_task(_call_off_when_gone(request, deadline))
        try:
            return await run_in_threadpool(answer)
        finally:
            watching.cancel()

    @app.get("/v1/chunks/{chunk_id}", response_model=HitModel, tags=["retrieval"])
    def get_chunk(chunk_id: ChunkId, identity: Verified) -> HitModel:
        """One chunk or derived row; 404 alike whether it is missing or the caller may not see it."""
        return HitModel.of(
            warehouse.get_chunk(chunk_id, caller=identity)
        )

    @app.get("/v1/chunks/{chunk_id}/explain", response_model=ExplanationModel, tags=["retrieval"])
    def explain(
        chunk_id: ChunkId,
        identity: Verified,
        about: Annotated[str | None, Query(max_length=256, description="Whose access to explain (needs audit).")] = None,
    ) -> ExplanationModel:
        """Why the caller (or, for an auditor, ``about``) may or may not read the chunk."""
        return ExplanationModel.of(
            warehouse.explain(chunk_id, subject=about or identity.subject, caller=identity)
        )

    @app.post("/v1/ingest", response_model=IngestResponse, tags=["lifecycle"])
    def ingest(body: IngestRequest, identity: Verified) -> IngestResponse:
        """Ingest source records into the caller's tenant (needs ``ingest``)."""
        report = warehouse.ingest_records(body.records, caller=identity, allow_move=body.allow_move,
                                          restore_erased=body.restore_erased)  # fmt: skip
        return IngestResponse.of(report, warehouse.table_version)

    @app.post("/v1/derive", response_model=DerivedModel, tags=["lifecycle"])
    def derive(body: DeriveRequest, identity: Verified) -> DerivedModel:
        """Save a summary or note derived from chunks the caller may read (needs ``derive``)."""
        row = warehouse.derive(body.text, parents=body.parents, caller=identity, kind=body.kind)
        return DerivedModel.of(row)

    @app.post("/v1/sync", response_model=SyncResponse, tags=["lifecycle"])
    def sync(body: SyncRequest, identity: Verified) -> SyncResponse:
        """Apply changed ACLs, labels or classifications to documents and what derives from them (needs ``sync``)."""
        return SyncResponse.of(
            warehouse.sync(body.records, caller=identity)
        )

    @app.post("/v1/forget", response_model=ForgetResponse, tags=["lifecycle"])
    def forget(body: ForgetRequest, identity: Verified) -> ForgetResponse:
        """Erase a document, or a derived row by its own id, and everything derived from it, old
        versions included (needs ``forget``)."""
        return ForgetResponse.of(
            warehouse.forget(body.doc_id, reason=body.reason, caller=identity)
        )

    @app.get("/v1/lineage/{item_id:path}", response_model=LineageModel, tags=["audit"])  # ids of files hold '/'
    def lineage(item_id: ItemId, identity: Verified) -> LineageModel:
        """A document's or row's lineage and the receipts that returned it (needs ``audit``)."""
        return LineageModel.model_validate(warehouse.lineage(item_id, caller=identity))

    @app.get("/v1/audit/receipts", response_model=list[ReceiptModel], tags=["audit"])
    def receipts(
        identity: Verified,
        subject: Annotated[str | None, Query(max_length=256)] = None,
        label: Annotated[str | None, Query(max_length=256)] = None,
        doc_id: Annotated[str | None, Query(max_length=MAX_ID_CHARS)] = None,
        chunk_id: Annotated[str | None, Query(max_length=MAX_ID_CHARS)] = None,
        operation: Annotated[str | None, Query(max_length=32)] = None,
        since: Instant | None = None,
        until: Instant | None = None,
        allowed: Annotated[bool | None, Query(description="Only the allowed (true) or the refused (false).")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_RECEIPTS)] = 100,
        offset: Annotated[int, Query(ge=0, description="Skip the newest this many (a page).")] = 0,
        *,
        response: Response,
    ) -> list[ReceiptModel]:
        """The caller's tenant's receipts, newest first, filtered and paged; ``X-Total-Count`` says
        how many match in all (needs ``audit``)."""
        total, found = warehouse.receipt_page(
            caller=identity,
            subject=subject,
            label=label,
            doc_id=doc_id,
            chunk_id=chunk_id,
            operation=operation,
            since=since,
            until=until,
            allowed=allowed,
            limit=limit,
            offset=offset,
        )
        response.headers["X-Total-Count"] = str(total)
        return [ReceiptModel.of(r) for r in found]

    @app.get("/v1/audit/access-review", response_model=AccessReviewModel, tags=["audit"])
    def review(
        identity: Verified,
        subject: Annotated[str | None, Query(max_length=256, description="Whose access (default: the caller; another needs audit).")] = None,
    ) -> AccessReviewModel:
        """What a subject can read in the caller's tenant, by source, label and classification."""
        return AccessReviewModel.of(
            warehouse.access_review(subject=subject or identity.subject, caller=identity)
        )

    @app.get("/v1/audit/inventory", response_model=InventoryModel, tags=["audit"])
    def inventory(identity: Verified, label: Annotated[str, Query(min_length=1, max_length=256)]) -> InventoryModel:
        """Every row carrying ``label`` in the caller's tenant, grouped by source document (needs ``audit``)."""
        found = warehouse.inventory(label=label, caller=identity)
        return InventoryModel(label=label, tenant=identity.tenant, sources=found)

    @app.get("/v1/audit/readers", response_model=ReadersModel, tags=["audit"])
    def who_can_read(
        identity: Verified,
        doc_id: Annotated[str | None, Query(max_length=MAX_ID_CHARS, description="A document.")] = None,
        label: Annotated[str | None, Query(max_length=256, description="Or a label.")] = None,
    ) -> ReadersModel:
        """Who can read a document (and what derives from it) or the rows carrying a label, in the
        caller's tenant: each user, service and group, its rows, and its path (needs ``audit``)."""
        return ReadersModel.model_validate(warehouse.readers(caller=identity, doc_id=doc_id, label=label).as_dict())

    @app.get("/v1/audit/trends", response_model=TrendsModel, tags=["audit"])
    def audit_trends(identity: Verified, days: Annotated[int, Query(ge=1, le=366)] = 30) -> TrendsModel:
        """The caller's tenant's last ``days`` days from its receipts: searches and refusals a day,
        labels returned, the documents returned most (needs ``audit``)."""
        return TrendsModel.model_validate(warehouse.trends(caller=identity, days=days).as_dict())

    @app.get("/v1/audit/vocabulary", response_model=VocabularyModel, tags=["audit"])
    def vocabulary(identity: Verified) -> VocabularyModel:
        """The labels, users and services, and documents of the caller's tenant, to filter its
        receipts by (at most 1,000 of each; needs ``audit``)."""
        found = warehouse.vocabulary(caller=identity)
        return VocabularyModel(tenant=found.tenant, labels=list(found.labels), subjects=list(found.subjects),
                               documents=list(found.documents))  # fmt: skip

    @app.get("/v1/audit/verify", response_model=ChainModel, tags=["audit"])
    def verify(identity: Verified, expect_head: str | None = None) -> ChainModel:
        """Verify every receipt chain; record the checkpoint elsewhere to detect a truncated tail (needs ``audit``)."""
        report = warehouse.verify_audit(caller=identity, expect_head=expect_head)
        return ChainModel(ok=report.ok, receipts=report.receipts, chains=report.chains, problems=list(report.problems),
                          checkpoint=report.checkpoint.root if report.checkpoint else None)  # fmt: skip

    @app.put("/v1/policy", response_model=PolicyResponse, tags=["admin"])
    def install_policy(body: PolicyRequest, identity: Verified) -> PolicyResponse:
        """Install a new policy (needs ``admin`` in every tenant the old or new policy names)."""
        policy = warehouse.install_policy_text(body.text, caller=identity)
        return PolicyResponse(version=policy.version, rules=len(policy.rules), tenants=sorted(policy.tenants))

    mount_console(app)
    mount_scim(app, warehouse, authenticator)
    if mcp_server is not None:
        app.mount(MCP_PATH, mcp_server.streamable_http_app())
    return app
