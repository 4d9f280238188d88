"""The MCP server through the SDK's own client: in process, over stdio and over streamable HTTP.

Every test drives the real server over the real warehouse; identity comes only from the fixed
identity (in process, stdio) or the bearer token (HTTP), never from a tool's arguments.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import psutil
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult
from support.live_server import serving
from support.mcp_clients import mcp_over_http
from support.readme import README_SERVICE, readme_block

from ragwarden.api.http import create_app
from ragwarden.api.mcp_server import LOCAL_SESSION, SERVER_NAME, SessionUnions, build_mcp_server
from ragwarden.api_keys import ApiKeys
from ragwarden.config import AuthSettings, Settings
from ragwarden.credentials import Authenticator
from ragwarden.errors import ConfigurationError
from ragwarden.governance.caller import Identity
from ragwarden.governance.tags import Classification
from ragwarden.retrieval.hits import Hit
from ragwarden.warehouse import Warehouse

RAGWARDEN = Path(sys.executable).with_name("ragwarden")
FINANCE_QUERY = "Q3 revenue results and full-year forecast"
ALICE = Identity(subject="user:alice", tenant="acme", actor="agent:research")
DAVE = Identity(subject="user:dave", tenant="acme", actor="agent:research")
BOB = Identity(subject="user:bob", tenant="acme")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def notes_warehouse(tmp_path_factory: pytest.TempPathFactory, copy_of: Callable[[str, Path], Warehouse]) -> Warehouse:
    """The demo corpus in a warehouse of this module's own, for the tests that write to it."""
    return copy_of("demo", tmp_path_factory.mktemp("mcp") / "warehouse")


def _server(warehouse: Warehouse, identity: Identity, **options: Any) -> Any:
    authenticator = Authenticator(AuthSettings(), ApiKeys(warehouse.store.api_keys))
    return build_mcp_server(warehouse, authenticator, identity=identity, **options)


@asynccontextmanager
async def _as(warehouse: Warehouse, identity: Identity) -> AsyncIterator[Client]:
    async with Client(_server(warehouse, identity)) as client:
        yield client


async def _ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def _error(result: CallToolResult) -> str:
    assert result.is_error
    return " ".join(getattr(block, "text", "") for block in result.content)


def _docs(found: dict[str, Any]) -> set[str]:
    return {hit["doc_id"] for hit in found["hits"]}


# -- in process, fixed identity -----------------------------------------------------------------


@pytest.mark.anyio
async def test_tools_publish_input_and_output_schemas(demo_warehouse: Warehouse) -> None:
    async with _as(demo_warehouse, ALICE) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {"search", "get_chunk", "explain_access", "save_note"}
    for tool in tools.values():
        assert tool.input_schema["type"] == "object" and tool.description
        assert tool.output_schema is not None and tool.output_schema["type"] == "object"
        assert not {"subject", "tenant", "actor"} & set(tool.input_schema["properties"])
    assert set(tools["search"].input_schema["properties"]) >= {"query", "k", "mode"}
    assert tools["search"].input_schema["properties"]["mode"]["enum"] == ["vector", "fts", "hybrid"]
    assert set(tools["search"].output_schema["properties"]) == {"hits", "manifest", "session"}
    assert set(tools["get_chunk"].output_schema["properties"]) == {"chunk", "session"}
    assert set(tools["explain_access"].output_schema["properties"]) >= {"allowed", "reason", "steps"}
    assert tools["save_note"].input_schema["properties"]["kind"]["enum"] == ["note", "summary", "memory"]
    assert set(tools["save_note"].output_schema["properties"]) >= {"chunk_id", "parents", "labels", "classification"}


@pytest.mark.anyio
async def test_search_returns_only_what_the_bound_user_may_read(demo_warehouse: Warehouse) -> None:
    async with _as(demo_warehouse, ALICE) as alice, _as(demo_warehouse, DAVE) as dave:
        for_alice = await _ok(alice, "search", query=FINANCE_QUERY, k=5)
        for_dave = await _ok(dave, "search", query=FINANCE_QUERY, k=5)
    assert "acme-fin-001" in _docs(for_alice)
    assert {h["chunk_id"] for h in for_alice["hits"]} != {h["chunk_id"] for h in for_dave["hits"]}
    assert all(
        "finance" not in hit["labels"] and hit["classification"] in ("public", "internal") for hit in for_dave["hits"]
    )
    assert all(hit["doc_id"].startswith("acme-") for hit in for_alice["hits"] + for_dave["hits"])
    hit = for_alice["hits"][0]
    assert set(hit) >= {"chunk_id", "doc_id", "text", "score", "labels", "classification", "reason", "kind", "parents"}
    assert for_alice["manifest"]["chunk_ids"] == [h["chunk_id"] for h in for_alice["hits"]]
    assert "finance" in for_alice["manifest"]["labels"] and for_alice["manifest"]["classification"] == "confidential"


@pytest.mark.anyio
async def test_every_tools_text_is_its_structured_content_as_compact_json(demo_warehouse: Warehouse) -> None:
    """The text a model reads carries what the structured content does, without indentation."""
    async with _as(demo_warehouse, ALICE) as alice:
        found = await alice.call_tool("search", {"query": FINANCE_QUERY, "k": 3})
        chunk = found.structured_content["hits"][0]["chunk_id"]
        answers = [found, await alice.call_tool("get_chunk", {"chunk_id": chunk}),
                   await alice.call_tool("explain_access", {"chunk_id": chunk})]  # fmt: skip
    for answer in answers:
        (block,) = answer.content
        assert json.loads(block.text) == answer.structured_content
        assert block.text == json.dumps(answer.structured_content, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.anyio
async def test_search_collapses_by_document_when_asked(demo_warehouse: Warehouse) -> None:
    async with _as(demo_warehouse, ALICE) as alice:
        found = await _ok(alice, "search", query=FINANCE_QUERY, k=5, group_by="doc", per_group=1, distinct=True)
        refused = await alice.call_tool("search", {"query": FINANCE_QUERY, "group_by": "folder"})
    assert found["hits"] and len(_docs(found)) == len(found["hits"])
    assert "at most 1 per document, distinct texts" in demo_warehouse.audit.query(subject="user:alice", limit=1)[0].reason
    assert refused.is_error


@pytest.mark.anyio
async def test_identity_named_in_arguments_is_ignored(demo_warehouse: Warehouse) -> None:
    async with _as(demo_warehouse, DAVE) as dave:
        plain = await _ok(dave, "search", query=FINANCE_QUERY, k=5)
        result = await dave.call_tool(
            "search", {"query": FINANCE_QUERY, "k": 5, "subject": "user:alice", "tenant": "acme"}
        )
    if not result.is_error:  # extra arguments are dropped, never honoured
        assert result.structured_content is not None
        assert _docs(result.structured_content) == _docs(plain)
        assert "acme-fin-001" not in _docs(result.structured_content)


@pytest.mark.anyio
async def test_session_union_grows_across_calls_and_reports_labels_and_highest_classification(
    demo_warehouse: Warehouse,
) -> None:
    async with _as(demo_warehouse, ALICE) as alice:
        public = await _ok(alice, "search", query="office opening hours and holidays", k=2, mode="fts")
        finance = await _ok(alice, "search", query=FINANCE_QUERY, k=3)
        fetched = await _ok(alice, "get_chunk", chunk_id=finance["hits"][0]["chunk_id"])
    first, second, third = public["session"], finance["session"], fetched["session"]
    assert first["session_id"] == second["session_id"] == third["session_id"] == LOCAL_SESSION
    assert first["chunk_ids"] == [h["chunk_id"] for h in public["hits"]]
    assert second["chunk_ids"] == list(dict.fromkeys(first["chunk_ids"] + [h["chunk_id"] for h in finance["hits"]]))
    assert second["count"] == len(second["chunk_ids"]) > first["count"]
    assert third["chunk_ids"] == second["chunk_ids"]  # fetching a chunk already given adds nothing
    assert set(second["labels"]) == {
        label for found in (public, finance) for h in found["hits"] for label in h["labels"]
    }
    assert "finance" in second["labels"] and second["classification"] == "confidential"
    assert finance["manifest"]["chunk_ids"] == [h["chunk_id"] for h in finance["hits"]]  # the call's own manifest


@pytest.mark.anyio
async def test_forbidden_chunk_errors_exactly_like_a_missing_one(demo_warehouse: Warehouse) -> None:
    async with _as(demo_warehouse, ALICE) as alice:
        secret = (await _ok(alice, "search", query=FINANCE_QUERY, k=1))["hits"][0]
        assert "finance" in secret["labels"]
    missing = "0" * len(secret["chunk_id"])
    async with _as(demo_warehouse, DAVE) as dave:
        forbidden_error = _error(await dave.call_tool("get_chunk", {"chunk_id": secret["chunk_id"]}))
        missing_error = _error(await dave.call_tool("get_chunk", {"chunk_id": missing}))
    assert forbidden_error == f"Error executing tool get_chunk: chunk '{secret['chunk_id']}' not found"
    assert missing_error == forbidden_error.replace(secret["chunk_id"], missing)
    assert "Traceback" not in forbidden_error


@pytest.mark.anyio
async def test_explain_access_answers_for_the_caller_itself(demo_warehouse: Warehouse) -> None:
    async with _as(demo_warehouse, ALICE) as alice:
        chunk_id = (await _ok(alice, "search", query=FINANCE_QUERY, k=1))["hits"][0]["chunk_id"]
        allowed = await _ok(alice, "explain_access", chunk_id=chunk_id)
    async with _as(demo_warehouse, DAVE) as dave:
        refused = await _ok(dave, "explain_access", chunk_id=chunk_id)
    assert allowed["allowed"] is True and allowed["subject"] == "user:alice" and allowed["steps"]
    assert all(step["passed"] for step in allowed["steps"])
    assert refused == {**refused, "allowed": False, "subject": "user:dave", "reason": "not visible", "steps": []}


@pytest.mark.anyio
async def test_bad_arguments_are_tool_errors_without_a_traceback(demo_warehouse: Warehouse) -> None:
    async with _as(demo_warehouse, ALICE) as alice:
        too_many = _error(await alice.call_tool("search", {"query": "budget", "k": 0}))
        bad_session = _error(await alice.call_tool("search", {"query": "budget", "session_id": "no spaces allowed"}))
    assert "k" in too_many and "Traceback" not in too_many
    assert "session_id" in bad_session and "Traceback" not in bad_session


@pytest.mark.anyio
async def test_save_note_takes_its_parents_labels_and_hides_it_from_who_cannot_read_a_parent(
    notes_warehouse: Warehouse,
) -> None:
    async with _as(notes_warehouse, ALICE) as alice:
        forecast = (await _ok(alice, "search", query=FINANCE_QUERY, k=1))["hits"][0]
        bands = (await _ok(alice, "search", query="engineering salary bands 2026", k=1))["hits"][0]
        assert (forecast["doc_id"], bands["doc_id"]) == ("acme-fin-001", "acme-hr-001")
        parents = [forecast["chunk_id"], bands["chunk_id"]]
        note = await _ok(alice, "save_note", text="Q3 beat plan; band midpoints rise in 2027.", parents=parents)
        again = await _ok(alice, "get_chunk", chunk_id=note["chunk_id"])
    assert note["parents"] == sorted(parents) and note["kind"] == "note"
    assert note["labels"] == sorted({*forecast["labels"], *bands["labels"]}) == ["comp", "finance"]
    assert note["classification"] == "confidential"
    assert again["chunk"]["kind"] == "note" and again["chunk"]["labels"] == note["labels"]
    async with _as(notes_warehouse, BOB) as bob:  # bob (HR) reads the salary bands, not the forecast
        assert (await _ok(bob, "get_chunk", chunk_id=bands["chunk_id"]))["chunk"]["doc_id"] == "acme-hr-001"
        hidden = _error(await bob.call_tool("get_chunk", {"chunk_id": note["chunk_id"]}))
        refused = _error(await bob.call_tool("save_note", {"text": "copy", "parents": [forecast["chunk_id"]]}))
    assert hidden.endswith(f"chunk '{note['chunk_id']}' not found")
    assert refused.endswith(f"chunk '{forecast['chunk_id']}' not found")
    derive = notes_warehouse.audit.query(chunk_id=note["chunk_id"], operation="derive")
    assert [(r.subject, r.actor, r.allowed) for r in derive] == [("user:alice", "agent:research", True)]


@pytest.mark.anyio
async def test_a_revoked_api_key_stops_a_stdio_style_server_mid_session(notes_warehouse: Warehouse) -> None:
    keys = ApiKeys(notes_warehouse.store.api_keys)
    key = keys.create(subject="user:alice", tenant="acme")
    identity = Authenticator(AuthSettings(), keys).verify(key)
    async with Client(_server(notes_warehouse, identity, credential=key)) as client:
        assert (await _ok(client, "search", query=FINANCE_QUERY, k=1))["hits"]
        keys.revoke(key.removeprefix("rwk_").partition(".")[0])
        assert _error(await client.call_tool("search", {"query": FINANCE_QUERY})).endswith("API key has been revoked")


def _hit(chunk_id: str, labels: tuple[str, ...] = (), level: int = 0) -> Hit:
    return Hit(chunk_id=chunk_id, doc_id="d", source_uri="u", text="t", score=1.0, labels=labels,
               classification=Classification(level), doc_version="v", position=0, reason="r")  # fmt: skip


def test_session_unions_are_per_caller_and_expire_when_idle_or_crowded_out() -> None:
    now = [0.0]
    unions = SessionUnions(idle_seconds=60, max_sessions=2, clock=lambda: now[0])
    unions.widen(ALICE, "s", [_hit("a", ("finance",), 2)])
    wider = unions.widen(ALICE, "s", [_hit("b", ("pii",), 1)])
    assert (wider.chunk_ids, wider.labels, wider.classification) == (("a", "b"), ("finance", "pii"), Classification(2))
    assert unions.knows(ALICE, "s") and not unions.knows(DAVE, "s")  # the same handle, another caller
    unions.widen(DAVE, "s", [])
    unions.widen(BOB, "s", [])  # a third session crowds out the least recently used (alice's)
    assert not unions.knows(ALICE, "s") and unions.knows(DAVE, "s") and len(unions) == 2
    now[0] = 61.0
    assert not unions.knows(DAVE, "s") and len(unions) == 0


# -- stdio: the launching process supplies the identity -----------------------------------------


def _stdio_env(auth_settings: AuthSettings, token: str | None) -> dict[str, str]:
    assert auth_settings.jwt_secret and auth_settings.issuer and auth_settings.audience
    env = {
        "HF_HUB_OFFLINE": "1",
        "RAGWARDEN_JWT_SECRET": auth_settings.jwt_secret.decode(),
        "RAGWARDEN_JWT_ISSUER": auth_settings.issuer,
        "RAGWARDEN_JWT_AUDIENCE": auth_settings.audience,
    }
    return env | ({"RAGWARDEN_TOKEN": token} if token is not None else {})


@pytest.mark.anyio
async def test_stdio_server_acts_for_the_user_of_its_token(
    demo_warehouse: Warehouse, auth_settings: AuthSettings, mint: Callable[..., str], onnx_worker_env: dict[str, str]
) -> None:
    purpose = f"stdio-{uuid.uuid4()}"
    env = _stdio_env(auth_settings, mint("alice", act="agent:desktop")) | onnx_worker_env
    launch = StdioServerParameters(command=str(RAGWARDEN), args=["mcp", "--warehouse", demo_warehouse.uri], env=env)
    async with Client(launch) as client:
        found = await _ok(client, "search", query=FINANCE_QUERY, k=3, purpose=purpose)
    assert "acme-fin-001" in _docs(found)
    assert found["session"]["session_id"] == LOCAL_SESSION
    receipts = [r for r in demo_warehouse.audit.query(operation="search") if r.purpose == purpose]
    assert [(r.subject, r.actor, r.tenant) for r in receipts] == [("user:alice", "agent:desktop", "acme")]


@pytest.mark.anyio
async def test_the_readme_client_configuration_reaches_the_tools_both_ways(
    demo_warehouse: Warehouse, demo_service_url: str, auth_settings: AuthSettings, mint: Callable[..., str],
    onnx_worker_env: dict[str, str],
) -> None:  # fmt: skip
    """The README's ``mcpServers`` entries, as written but for the warehouse, the address and the
    credential they leave to the reader: the stdio one starts ``ragwarden mcp``, the HTTP one
    reaches ``/mcp/``; both search as the user the credential names."""
    servers = json.loads(readme_block('"mcpServers"', language="json"))["mcpServers"]
    token = mint("alice")
    stdio = servers["ragwarden"]
    env = stdio["env"] | {"RAGWARDEN_WAREHOUSE": demo_warehouse.uri, "RAGWARDEN_TOKEN": token}
    launch = StdioServerParameters(command=str(RAGWARDEN.with_name(stdio["command"])), args=stdio["args"],
                                   env=env | _stdio_env(auth_settings, token) | onnx_worker_env)  # fmt: skip
    async with Client(launch) as client:
        assert "acme-fin-001" in _docs(await _ok(client, "search", query=FINANCE_QUERY, k=3))
    remote = servers["ragwarden-http"]
    headers = {name: value.replace("<the user's JWT or rwk_ API key>", token) for name, value in remote["headers"].items()}
    url = remote["url"].replace(README_SERVICE, demo_service_url)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        assert "acme-fin-001" in _docs(await _ok(client, "search", query=FINANCE_QUERY, k=3))


@pytest.mark.anyio
async def test_the_readme_python_client_searches_as_the_user_over_stdio_and_streamable_http(
    demo_warehouse: Warehouse, demo_service_url: str, auth_settings: AuthSettings, mint: Callable[..., str],
    onnx_worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The README's Python snippet, run as written: its two functions search as alice (who reads
    finance) and as dave (who does not), over stdio and over HTTP alike."""
    snippet: dict[str, Any] = {}
    exec(readme_block("search_over_stdio"), snippet)  # noqa: S102 - the README's own example
    for name, value in (_stdio_env(auth_settings, None) | onnx_worker_env).items():
        monkeypatch.setenv(name, value)  # what the reader's shell holds: the service's JWT settings
    monkeypatch.setenv("PATH", f"{RAGWARDEN.parent}{os.pathsep}{os.environ.get('PATH', '')}")  # `ragwarden` as installed
    url = f"{demo_service_url}/mcp/"
    for user, reads_finance in (("alice", True), ("dave", False)):
        token = mint(user)
        over_stdio = await snippet["search_over_stdio"](token, demo_warehouse.uri, FINANCE_QUERY)
        over_http = await snippet["search_over_http"](token, FINANCE_QUERY, url)
        assert _docs(over_stdio) == _docs(over_http) and ("acme-fin-001" in _docs(over_http)) is reads_finance


@pytest.mark.anyio
async def test_the_stdio_server_answers_before_it_loads_a_model(
    demo_warehouse: Warehouse, auth_settings: AuthSettings, mint: Callable[..., str], onnx_worker_env: dict[str, str]
) -> None:
    """``initialize`` and the tool list come without the embedding runtime in the process (read off
    its memory map); the first search loads it (the control)."""
    env = _stdio_env(auth_settings, mint("alice")) | onnx_worker_env
    launch = StdioServerParameters(command=str(RAGWARDEN), args=["mcp", "--warehouse", demo_warehouse.uri], env=env)

    def loaded(server: psutil.Process) -> bool:
        maps = Path(f"/proc/{server.pid}/maps").read_text()
        return "onnxruntime" in maps or "libtorch" in maps

    async with Client(launch) as client:
        assert {tool.name for tool in (await client.list_tools()).tools} >= {"search"}
        (server,) = [p for p in psutil.Process().children(recursive=True) if "mcp" in p.cmdline()]
        assert not loaded(server), "initialize waited for the model"
        await _ok(client, "search", query=FINANCE_QUERY, k=1)
        assert loaded(server)


@pytest.mark.parametrize("token", [None, "not-a-token", "expired"])
def test_stdio_server_refuses_to_start_without_a_valid_token(
    demo_warehouse: Warehouse, auth_settings: AuthSettings, mint: Callable[..., str], token: str | None
) -> None:
    if token == "expired":
        token = mint("alice", exp=1_000_000, iat=999_000, nbf=999_000)
    env = {k: v for k, v in os.environ.items() if k != "RAGWARDEN_TOKEN"} | _stdio_env(auth_settings, token)
    done = subprocess.run(
        [str(RAGWARDEN), "mcp", "--warehouse", demo_warehouse.uri],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "RAGWARDEN_TOKEN" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""  # nothing was served


# -- streamable HTTP: identity from each request's bearer token ----------------------------------


@pytest.mark.anyio
async def test_http_agents_for_two_users_see_their_own_rows_and_receipts_name_user_and_agent(
    demo_warehouse: Warehouse, demo_service_url: str, mint: Callable[..., str]
) -> None:
    purpose = f"http-{uuid.uuid4()}"
    alice_token, dave_token = mint("alice", act="agent:alpha"), mint("dave", act="agent:delta")
    async with mcp_over_http(demo_service_url, alice_token) as alice, mcp_over_http(demo_service_url, dave_token) as dave:
        for_alice = await _ok(alice, "search", query=FINANCE_QUERY, k=5, purpose=purpose)
        for_dave = await _ok(dave, "search", query=FINANCE_QUERY, k=5, purpose=purpose)
    assert "acme-fin-001" in _docs(for_alice) and "acme-fin-001" not in _docs(for_dave)
    assert {h["chunk_id"] for h in for_alice["hits"]} != {h["chunk_id"] for h in for_dave["hits"]}
    receipts = [r for r in demo_warehouse.audit.query(operation="search") if r.purpose == purpose]
    named = {(r.subject, r.actor): set(r.chunk_ids) for r in receipts}
    assert named == {
        ("user:alice", "agent:alpha"): {h["chunk_id"] for h in for_alice["hits"]},
        ("user:dave", "agent:delta"): {h["chunk_id"] for h in for_dave["hits"]},
    }


def test_http_without_a_valid_token_is_refused_with_401(demo_service_url: str, mint: Callable[..., str]) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    bad = [None, "Bearer not-a-token", f"Bearer {mint('alice', aud='someone-else')}", "Basic YWxpY2U6eA=="]
    with httpx.Client(base_url=demo_service_url, timeout=30) as http:
        for authorization in bad:
            sent = headers | ({"Authorization": authorization} if authorization else {})
            response = http.post("/mcp/", json=body, headers=sent)
            assert response.status_code == 401, authorization
            assert response.headers["www-authenticate"].startswith("Bearer")


def _initialize(url: str, token: str, *, host: str, origin: str | None = None) -> httpx.Response:
    """An MCP ``initialize`` POSTed to ``url``'s ``/mcp/`` as if addressed to ``host`` (and sent
    from a page of ``origin``): what a client reaching the server under that name sends first."""
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {token}", "Host": host}
    with httpx.Client(base_url=url, timeout=30) as http:
        return http.post("/mcp/", json=body, headers=headers | ({"Origin": origin} if origin else {}))


def test_http_refuses_unknown_hosts_against_dns_rebinding(demo_service_url: str, mint: Callable[..., str]) -> None:
    port = demo_service_url.rsplit(":", 1)[1]
    rebound = _initialize(demo_service_url, mint("alice"), host=f"attacker.example:{port}")
    local = _initialize(demo_service_url, mint("alice"), host=f"localhost:{port}")
    assert rebound.status_code == 421
    assert local.status_code == 200, local.text


PUBLIC_HOST = "rag.example.com"


@pytest.fixture(scope="module")
def public_service_url(demo_warehouse: Warehouse, auth_settings: AuthSettings) -> Iterator[str]:
    """The demo warehouse served as behind a TLS proxy at rag.example.com, which
    RAGWARDEN_ALLOWED_HOSTS names (any port too)."""
    env = {"RAGWARDEN_ALLOWED_HOSTS": f"{PUBLIC_HOST}, {PUBLIC_HOST}:*"}
    settings = Settings.from_env(env, warehouse=demo_warehouse.uri, auth=auth_settings)
    with serving(create_app(settings, warehouse=demo_warehouse)) as url:
        yield url


def test_a_public_host_is_refused_by_default_and_served_once_allowed_hosts_names_it(
    demo_service_url: str, public_service_url: str, mint: Callable[..., str]
) -> None:
    token = mint("alice")
    by_default = _initialize(demo_service_url, token, host=PUBLIC_HOST)
    named = _initialize(public_service_url, token, host=PUBLIC_HOST)
    named_with_port = _initialize(public_service_url, token, host=f"{PUBLIC_HOST}:8443",
                                  origin=f"https://{PUBLIC_HOST}:8443")  # fmt: skip
    from_its_page = _initialize(public_service_url, token, host=PUBLIC_HOST, origin=f"https://{PUBLIC_HOST}")
    assert by_default.status_code == 421
    for served in (named, named_with_port, from_its_page):
        assert served.status_code == 200, served.text
        assert '"serverInfo"' in served.text and f'"name":"{SERVER_NAME}"' in served.text.replace(" ", "")


def test_allowed_hosts_keep_the_dns_rebinding_protection_for_every_other_name(
    public_service_url: str, mint: Callable[..., str]
) -> None:
    token = mint("alice")
    rebound = _initialize(public_service_url, token, host="attacker.example")
    lookalike = _initialize(public_service_url, token, host=f"{PUBLIC_HOST}.attacker.example")
    foreign_page = _initialize(public_service_url, token, host=PUBLIC_HOST, origin="https://attacker.example")
    assert rebound.status_code == lookalike.status_code == 421
    assert foreign_page.status_code == 403


def test_allowed_hosts_refuses_what_no_host_header_could_match() -> None:
    assert Settings.from_env({"RAGWARDEN_ALLOWED_HOSTS": " rag.example.com ,, [::1]:*"}).allowed_hosts == (
        "rag.example.com", "[::1]:*")  # fmt: skip
    for wrong in ("https://rag.example.com", "rag.example.com/mcp", "*", "*.example.com", "rag example.com"):
        with pytest.raises(ConfigurationError, match=r"RAGWARDEN_ALLOWED_HOSTS: .* is not a host"):
            Settings.from_env({"RAGWARDEN_ALLOWED_HOSTS": wrong})


@pytest.mark.anyio
async def test_http_session_union_follows_its_session_id_which_no_other_caller_can_use(
    demo_service_url: str, mint: Callable[..., str]
) -> None:
    async with mcp_over_http(demo_service_url, mint("alice", act="agent:alpha")) as alice:
        first = await _ok(alice, "search", query=FINANCE_QUERY, k=2)
        handle = first["session"]["session_id"]
        second = await _ok(alice, "search", query="parental leave policy", k=2, session_id=handle)
        fresh = await _ok(alice, "search", query="parental leave policy", k=2)
    assert second["session"]["session_id"] == handle != fresh["session"]["session_id"]
    assert second["session"]["count"] > first["session"]["count"] == 2
    assert "finance" in second["session"]["labels"] and second["session"]["classification"] == "confidential"
    assert fresh["session"]["chunk_ids"] == [h["chunk_id"] for h in fresh["hits"]]
    async with mcp_over_http(demo_service_url, mint("dave")) as dave:  # alice's handle is nothing to dave
        borrowed = _error(await dave.call_tool("search", {"query": "leave", "session_id": handle}))
        made_up = _error(await dave.call_tool("search", {"query": "leave", "session_id": "made-up"}))
    assert borrowed == made_up.replace("made-up", handle)
    assert borrowed.endswith(f"unknown or expired session_id {handle!r}: omit it to start a new session")


@pytest.mark.anyio
async def test_http_legacy_session_keeps_one_union_without_passing_an_id(
    demo_service_url: str, mint: Callable[..., str]
) -> None:
    async with mcp_over_http(demo_service_url, mint("alice", act="agent:old"), mode="legacy") as alice:
        first = await _ok(alice, "search", query=FINANCE_QUERY, k=2)
        second = await _ok(alice, "search", query="parental leave policy", k=2)
    assert first["session"]["session_id"] == second["session"]["session_id"]
    assert first["session"]["session_id"].startswith("mcp:")
    assert second["session"]["chunk_ids"][:2] == first["session"]["chunk_ids"]
    assert second["session"]["count"] > 2


@pytest.mark.anyio
async def test_search_filter_narrows_and_hits_carry_metadata(demo_warehouse: Warehouse) -> None:
    async with _as(demo_warehouse, ALICE) as alice:
        found = await _ok(alice, "search", query=FINANCE_QUERY, k=5, filter={"doc_id": {"$in": ["acme-pub-001", "acme-fin-001"]}})
        refused = await alice.call_tool("search", {"query": FINANCE_QUERY, "filter": {"acl_allow": "user:alice"}})
    assert found["hits"] and _docs(found) <= {"acme-pub-001", "acme-fin-001"}
    assert all(hit["metadata"]["title"] for hit in found["hits"])
    assert "filtered" in demo_warehouse.audit.query(subject="user:alice", limit=1)[0].reason
    assert refused.is_error and "governs who may read" in refused.content[0].text
