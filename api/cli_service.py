"""Service commands: the HTTP server, the stdio MCP server, and the credentials they accept."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import click

from ..api_keys import ApiKeys, api_keys_at
from ..config import Settings
from ..embedder import Embedder
from ..errors import ConfigurationError, WarehouseFormatError
from ..warehouse import Warehouse
from .balance import WorkerLoads, create_loads_file, worker_loads
from .cli_options import common_options
from .until_servable import RECHECK_S, UntilServable


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option("--no-mcp", is_flag=True, help="Do not mount the MCP server at /mcp.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Server processes sharing the port, their loads kept even (each loads the model; about one per core).")  # fmt: skip
@common_options
def serve(host: str, port: int, no_mcp: bool, workers: int, settings: Settings) -> None:
    """Serve the HTTP API (the MCP server at /mcp, the compliance console at /console/) over the
    warehouse. Stateless: run as many replicas on one warehouse as needed; identity comes from
    each request's bearer credential."""
    import uvicorn

    from .console import CONSOLE_PATH

    click.echo(f"compliance console: http://{host}:{port}{CONSOLE_PATH}/ (sign in with a token or API key)", err=True)
    # One JSON line per request from ragwarden.access, in place of uvicorn's plain access line.
    log_config = {**uvicorn.config.LOGGING_CONFIG, "loggers": {**uvicorn.config.LOGGING_CONFIG["loggers"],
                  "ragwarden.access": {"handlers": ["access_json"], "level": "INFO", "propagate": False}},
                  "handlers": {**uvicorn.config.LOGGING_CONFIG["handlers"],
                               "access_json": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout"}}}  # fmt: skip
    options: dict[str, Any] = {"host": host, "port": port, "log_level": "info", "timeout_graceful_shutdown": 10,
                               "access_log": False, "log_config": log_config}  # fmt: skip
    if workers == 1:
        _one_blas_thread_per_call()
        app = served_app(settings, with_mcp=not no_mcp)
        _freeze_startup_objects()
        uvicorn.run(app, **options)
        return
    # Each worker process builds its app from the environment: hand it what the flags chose, and
    # its share of the cores for the encoder, so the workers' threads never contend for one core.
    threads = settings.embed_threads or max(1, (os.cpu_count() or 1) // workers)
    loads = create_loads_file()  # where the workers even out their load (``balance``)
    os.environ.update({"RAGWARDEN_WAREHOUSE": settings.warehouse, "RAGWARDEN_POLICY": settings.policy or "",
                       "RAGWARDEN_EMBED_THREADS": str(threads), SERVE_MCP: "0" if no_mcp else "1",
                       SERVE_LOADS: str(loads)})  # fmt: skip
    try:
        uvicorn.run("ragwarden.api.cli_service:app_from_env", factory=True, workers=workers, **options)
    finally:
        os.environ.pop(SERVE_LOADS, None)
        loads.unlink(missing_ok=True)


SERVE_MCP = "RAGWARDEN_SERVE_MCP"
SERVE_LOADS = "RAGWARDEN_SERVE_LOADS"


def app_from_env() -> Any:
    """The app of one ``serve --workers`` process, from the settings ``serve`` put in the environment."""

    _one_blas_thread_per_call()
    peers = worker_loads(os.environ.get(SERVE_LOADS))
    settings = Settings.from_env()
    app = served_app(settings, with_mcp=os.environ.get(SERVE_MCP, "1") != "0", peers=peers)
    _freeze_startup_objects()
    return app


def served_app(settings: Settings, *, embedder: Embedder | None = None, with_mcp: bool = True,
               peers: WorkerLoads | None = None, recheck_s: float = RECHECK_S) -> Any:  # fmt: skip
    """The service over the warehouse ``settings`` name. While that warehouse is of a format this
    release does not serve, a replica that answers, says why, and serves once it is
    (``until_servable``): a rolling upgrade starts the new release before ``ragwarden migrate``."""
    from .http import create_app

    embedder = embedder or Embedder.from_settings(settings)  # one model for every try

    def opened() -> Any:
        return create_app(settings, warehouse=Warehouse(settings, embedder=embedder, create=False), with_mcp=with_mcp, peers=peers)

    try:
        return opened()
    except WarehouseFormatError as refused:
        click.echo(f"not serving yet: {refused}", err=True)
        return UntilServable(opened, refused, recheck_s=recheck_s)


def _freeze_startup_objects() -> None:
    """Exempt what the server built to start (modules, the app, the model's session) from the
    garbage collector's full passes. Each pass walked them all, stopping every request in the
    process: the slowest answers of a loaded server (figures: ``docs/performance.md``, the
    constants table). They live as long as the process, so nothing is lost by not collecting them."""
    import gc

    gc.collect()
    gc.freeze()


def _one_blas_thread_per_call() -> None:
    """A server scores many searches at once, each a small matrix-vector product: BLAS's own
    threads would only spin against the request threads (profiled at 16 clients: a third of the
    server's time in the scoring product), so each call gets one thread."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


@click.command()
@common_options
def mcp(settings: Settings) -> None:
    """Serve the MCP tools over stdio for one identity: the launching process supplies a token or
    API key in RAGWARDEN_TOKEN, and every call acts as that caller."""
    from .mcp_server import run_stdio

    run_stdio(settings)


@click.command()
@click.option("--sub", required=True, help="The subject (user:NAME, or NAME).")
@click.option("--tenant", required=True, help="The tenant claim.")
@click.option("--act", help="An agent acting for the subject (the act claim), e.g. agent:notes-bot.")
@click.option("--ttl", default=3600, show_default=True, type=click.IntRange(1, 86400), help="Seconds until it expires.")
@common_options
def token(sub: str, tenant: str, act: str | None, ttl: int, settings: Settings) -> None:
    """Mint an HS256 token with the configured secret, issuer and audience (RAGWARDEN_JWT_*): for
    development and tests; production tokens come from the identity provider."""
    import jwt

    auth = settings.auth
    if not auth.jwt_secret:
        raise ConfigurationError("set RAGWARDEN_JWT_SECRET, RAGWARDEN_JWT_ISSUER and RAGWARDEN_JWT_AUDIENCE to mint tokens")
    now = int(time.time())
    claims: dict[str, object] = {
        "sub": sub, "iss": auth.issuer, "aud": auth.audience, "iat": now, "nbf": now, "exp": now + ttl,
        auth.tenant_claim: tenant,
    }  # fmt: skip
    if act:
        claims["act"] = {"sub": act}
    click.echo(jwt.encode(claims, auth.jwt_secret, algorithm="HS256"))


@click.group()
def apikey() -> None:
    """API keys for service accounts, stored hashed in the warehouse."""


def _keys(settings: Settings) -> ApiKeys:
    return api_keys_at(settings.warehouse, settings.storage_options, create=False)


@apikey.command("create")
@click.option("--subject", required=True, help="service:NAME (or user:NAME) the key acts as.")
@click.option("--tenant", required=True, help="The tenant the key acts in.")
@common_options
def apikey_create(subject: str, tenant: str, settings: Settings) -> None:
    """Create a key and print it once; only its hash is kept. Its rights are the policy's grants to SUBJECT."""
    click.echo(_keys(settings).create(subject=subject, tenant=tenant))


@apikey.command("list")
@common_options
def apikey_list(settings: Settings) -> None:
    """List keys (id, subject, tenant, created, revoked) as JSON lines; secrets are never shown."""
    for key in _keys(settings).list():
        click.echo(json.dumps({**key.__dict__, "created_at": key.created_at.isoformat()}))


@apikey.command("revoke")
@click.argument("key_id")
@common_options
def apikey_revoke(key_id: str, settings: Settings) -> None:
    """Revoke the key KEY_ID (the part after rwk_ and before the dot); every replica refuses it at once."""
    _keys(settings).revoke(key_id)
    click.echo(f"revoked {key_id}")
