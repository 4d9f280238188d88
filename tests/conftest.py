"""Shared fixtures, named for the state they hand over: warehouses, credentials, live servers."""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from support.built import Built
from support.demo_world import with_demo_corpus
from support.identity_provider import AUDIENCE, ISSUER, JWT_SECRET
from support.lineage_receiver import Receiver
from support.live_server import api_app, serving
from support.oracle import ORACLE_COLUMNS, oracle_visible, world_of_policy
from support.raw_tables import raw_table

from ragwarden.api.balance import WorkerLoads
from ragwarden.api.http import create_app
from ragwarden.config import AuthSettings, Settings
from ragwarden.embedder import Embedder, ensure_export
from ragwarden.policies import policy_file
from ragwarden.warehouse import Warehouse

pytest_plugins = ["support.suite_record", "support.parallel"]

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def export_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private folder for the default encoder's export, made once for the run and named in the
    environment, so this process and every one it starts use it and never the user's cache."""
    folder = tmp_path_factory.mktemp("onnx-export")
    ensure_export("onnx-int8", folder)
    before = os.environ.get("RAGWARDEN_EMBED_CACHE")
    os.environ["RAGWARDEN_EMBED_CACHE"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("RAGWARDEN_EMBED_CACHE", None)
    else:
        os.environ["RAGWARDEN_EMBED_CACHE"] = before


@pytest.fixture(scope="session")
def embedder(export_cache: Path) -> Embedder:
    """The packaged model under the default (int8 ONNX) backend, loaded once for the whole run."""
    return Embedder(cache_dir=export_cache)


@pytest.fixture(scope="session")
def onnx_worker_env(export_cache: Path) -> dict[str, str]:
    """Environment for the processes tests start: the default encoder, from the run's export
    (it starts in under a second where the PyTorch model takes about seven)."""
    return {"RAGWARDEN_EMBED_BACKEND": "onnx-int8", "RAGWARDEN_EMBED_CACHE": str(export_cache)}


@pytest.fixture(scope="session")
def onnx_embedder(embedder: Embedder) -> Embedder:
    """In this process, the embedder of the processes started with ``onnx_worker_env``."""
    return embedder


@pytest.fixture
def onnx_workers(onnx_worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``onnx_worker_env`` set in this process's environment for the test, so every process it
    starts inherits it."""
    for name, value in onnx_worker_env.items():
        monkeypatch.setenv(name, value)
    return onnx_worker_env


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared data sets (RAGWARDEN_DATA, default ../shared/data beside the checkout)."""
    return Path(os.environ.get("RAGWARDEN_DATA") or REPO.parent / "shared" / "data")


@pytest.fixture(scope="session")
def demo_oracle(demo_warehouse: Warehouse) -> Callable[[str, str], set[str]]:
    """The chunk ids of the demo warehouse a subject may read in a tenant, by the independent oracle
    (``support.oracle``) over the demo policy: demo_oracle("user:dave", "acme")."""
    rows = raw_table(demo_warehouse.store).search().select(ORACLE_COLUMNS).limit(None).to_list()
    world = world_of_policy(policy_file("demo.csv").read_text(encoding="utf-8"))
    registry = demo_warehouse.store.registries.clauses()

    def visible(subject: str, tenant: str) -> set[str]:
        return oracle_visible(world, subject, tenant, rows, registry)

    return visible


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Warehouses built once in this test process; each test that asks gets a copy of its own."""
    return Built(tmp_path_factory.mktemp("built"))


@pytest.fixture(scope="session")
def copy_of(built: Built, embedder: Embedder) -> Callable[[str, Path], Warehouse]:
    """A copy at a folder of one of the warehouses the fixtures below share, opened with the run's
    embedder: copy_of("demo", tmp_path / "warehouse"). "demo-policy" is empty under the demo policy,
    "small" holds SMALL_CORPUS under it, "demo" the demo corpus."""

    def opened(folder: Path) -> Warehouse:
        return Warehouse(Settings(warehouse=str(folder)), embedder=embedder)

    def demo_policy(folder: Path) -> None:
        with opened(folder) as warehouse:
            warehouse.install_policy(policy_file("demo.csv"))

    def small(folder: Path) -> None:
        with opened(folder) as warehouse:
            warehouse.install_policy(policy_file("demo.csv"))
            report = warehouse.ingest_records(SMALL_CORPUS)
            assert report.ok, report.rejected

    def demo(folder: Path) -> None:
        with opened(folder) as warehouse:
            with_demo_corpus(warehouse)

    builders = {"demo-policy": demo_policy, "small": small, "demo": demo}

    def copy(name: str, to: Path) -> Warehouse:
        return opened(Path(built.copy(name, builders[name], to)))

    return copy


@pytest.fixture
def fresh_warehouse(tmp_path: Path, embedder: Embedder) -> Warehouse:
    """An empty warehouse with no policy at all (nothing is visible)."""
    return Warehouse(Settings(warehouse=str(tmp_path / "warehouse")), embedder=embedder)


@pytest.fixture
def demo_policy_warehouse(tmp_path: Path, copy_of: Callable[[str, Path], Warehouse]) -> Warehouse:
    """An empty warehouse whose installed policy is the demo policy."""
    return copy_of("demo-policy", tmp_path / "warehouse")


@pytest.fixture(scope="session")
def demo_warehouse(tmp_path_factory: pytest.TempPathFactory, copy_of: Callable[[str, Path], Warehouse]) -> Warehouse:
    """The demo corpus ingested under the demo policy; shared, so tests must only read it."""
    return copy_of("demo", tmp_path_factory.mktemp("demo") / "warehouse")


@pytest.fixture
def demo_copy(tmp_path: Path, copy_of: Callable[[str, Path], Warehouse]) -> Warehouse:
    """The demo corpus under the demo policy in a warehouse of this test's own, to write to."""
    return copy_of("demo", tmp_path / "warehouse")


BASE_RECORD: dict[str, Any] = {
    "id": "doc-1",
    "text": "The quarterly budget review is on Thursday.",
    "tenant": "acme",
    "acl": {"allow": ["group:finance"], "deny": []},
    "labels": ["finance"],
    "classification": "internal",
    "uri": "test://doc-1",
}


@pytest.fixture
def make_record() -> Callable[..., dict[str, Any]]:
    """Build a valid JSONL-shaped record, with keyword overrides (None removes a key)."""

    def build(**overrides: Any) -> dict[str, Any]:
        record = copy.deepcopy(BASE_RECORD)
        for key, value in overrides.items():
            if value is None:
                record.pop(key, None)
            else:
                record[key] = value
        return record

    return build


# ---------------------------------------------------------------- credentials and services

@pytest.fixture(scope="session")
def auth_settings() -> AuthSettings:
    """HS256 tokens from the test identity provider."""
    return AuthSettings(jwt_secret=JWT_SECRET, issuer=ISSUER, audience=AUDIENCE)


@pytest.fixture(scope="session")
def mint() -> Callable[..., str]:
    """Mint a token: mint("alice", tenant="acme", act="agent:x", exp=..., key=..., algorithm=...);
    any other keyword overrides or (as None) removes a claim."""

    def build(sub: str, *, tenant: str = "acme", act: str | None = None, key: Any = JWT_SECRET,
              algorithm: str = "HS256", headers: dict[str, Any] | None = None, **claims: Any) -> str:
        now = int(time.time())
        payload: dict[str, Any] = {"sub": sub, "tenant": tenant, "iss": ISSUER, "aud": AUDIENCE,
                                   "iat": now, "nbf": now, "exp": now + 600}
        if act:
            payload["act"] = {"sub": act}
        for name, value in claims.items():
            if value is None:
                payload.pop(name, None)
            else:
                payload[name] = value
        return jwt.encode(payload, key, algorithm=algorithm, headers=headers)

    return build  # fmt: skip


@pytest.fixture(scope="session")
def demo_service_url(demo_warehouse: Warehouse, auth_settings: AuthSettings) -> Iterator[str]:
    """The demo warehouse served over HTTP (API and MCP) on 127.0.0.1, for the whole run."""
    settings = Settings(warehouse=demo_warehouse.uri, auth=auth_settings)
    with serving(create_app(settings, warehouse=demo_warehouse)) as url:
        yield url


@pytest.fixture
def as_user(demo_service_url: str, mint: Callable[..., str]) -> Iterator[Callable[..., httpx.Client]]:
    """An HTTP client for a demo user: as_user("alice"), as_user("carol", act="agent:notes")."""
    clients: list[httpx.Client] = []

    def client(sub: str, **token_claims: Any) -> httpx.Client:
        made = httpx.Client(base_url=demo_service_url, headers={"Authorization": f"Bearer {mint(sub, **token_claims)}"}, timeout=60)
        clients.append(made)
        return made

    yield client
    for made in clients:
        made.close()


# ---------------------------------------------------------------- fresh warehouses and servers for writes

SMALL_CORPUS: list[dict[str, Any]] = [
    {"id": "acme-memo", "text": "The cafeteria menu changes on Mondays; soup is served daily.", "tenant": "acme",
     "acl": {"allow": ["everyone"], "deny": []}, "labels": [], "classification": "public", "uri": "test://acme/memo"},
    {"id": "acme-budget", "text": "The quarterly budget review moves to Thursday; forecasts are due Wednesday.",
     "tenant": "acme", "acl": {"allow": ["group:finance"], "deny": []}, "labels": ["finance"],
     "classification": "confidential", "uri": "test://acme/budget"},
    {"id": "globex-plan", "text": "Globex plans a new warehouse in Springfield for its widget line.", "tenant": "globex",
     "acl": {"allow": ["group:staff"], "deny": []}, "labels": [], "classification": "internal",
     "uri": "test://globex/plan"},
]  # fmt: skip


@pytest.fixture
def small_warehouse(tmp_path: Path, copy_of: Callable[[str, Path], Warehouse]) -> Warehouse:
    """A fresh warehouse under the demo policy holding SMALL_CORPUS (two acme documents, one globex)."""
    return copy_of("small", tmp_path / "warehouse")


@pytest.fixture
def serve(auth_settings: AuthSettings) -> Iterator[Callable[..., str]]:
    """Serve a warehouse's API (no MCP) on 127.0.0.1 until the test ends: serve(warehouse, max_body_bytes=...);
    ``auth`` replaces the HS256 test settings, ``configure`` gets the app before it starts, ``peers``
    makes it one of several workers (``api.balance``)."""
    with contextlib.ExitStack() as stack:

        def start(warehouse: Warehouse, *, auth: AuthSettings | None = None, configure: Callable[[Any], None] | None = None,
                  peers: WorkerLoads | None = None, **settings: Any) -> str:
            app = api_app(warehouse, auth or auth_settings, peers=peers, **settings)
            if configure is not None:
                configure(app)
            return stack.enter_context(serving(app))

        yield start  # fmt: skip


@pytest.fixture
def bearer(mint: Callable[..., str]) -> Callable[..., dict[str, str]]:
    """Authorization headers for a demo user: bearer("admin"), bearer("alice", tenant="globex")."""

    def headers(sub: str, **token_claims: Any) -> dict[str, str]:
        return {"Authorization": f"Bearer {mint(sub, **token_claims)}"}

    return headers


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    """Starts OpenLineage backends on 127.0.0.1 (``receiver(port, mode=...)``, see
    ``support.lineage_receiver``); stops them all after the test."""
    started: list[Receiver] = []

    def start(port: int = 0, **options: Any) -> Receiver:
        started.append(Receiver(port, **options))
        return started[-1]

    yield start
    for running in started:
        running.stop()
