"""The rule of DESIGN §4, counted rather than timed: a search does no work over rows its caller cannot
read. Rows an intern cannot read, written to match his every query and filter, change neither the
bytes of any answer he gets nor any count of the work done for it (rows read, filtered, matched,
scored, analysed, post-checked), on every surface: the Python face (each plan), HTTP, MCP, and the
LangChain and LlamaIndex retrievers, and on the serving index's plan; for search in every mode and
filter operator, collapsed or not, for get and for explain. The same rows made readable to him do change the counts: the
counters see the rows a search works over.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.hidden_rows import FILTERS, QUERIES, READER, TENANT, hidden_sheet_ids, world
from support.live_server import serving
from support.mcp_clients import mcp_over_http

from ragwarden.api.http import create_app
from ragwarden.config import AuthSettings, Settings
from ragwarden.embedder import Embedder
from ragwarden.errors import NotFoundError
from ragwarden.governance.caller import Caller
from ragwarden.integrations.langchain import WardenRetriever as LangChainRetriever
from ragwarden.integrations.llamaindex import WardenRetriever as LlamaIndexRetriever
from ragwarden.retrieval.narrowing import narrowing
from ragwarden.retrieval.search import Searcher
from ragwarden.stages import counting, work_done
from ragwarden.warehouse import Warehouse

HIDDEN = 10
MODES = ("vector", "fts", "hybrid")
COLLAPSES: tuple[dict[str, Any], ...] = ({}, {"group_by": "doc", "per_group": 1}, {"distinct": True})
Observed = dict[str, tuple[str, dict[str, int]]]
"""What each operation answered (its bytes, as text) and the work counted for it, by operation."""


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> dict[str, Path]:
    """The folders of three warehouses: the base, the base with sheets the intern cannot read, and
    the base with the same sheets readable by him."""
    made = {"base": world(tmp_path_factory.mktemp("base"), embedder),
            "hidden": world(tmp_path_factory.mktemp("hidden"), embedder, hidden=HIDDEN),
            "shown": world(tmp_path_factory.mktemp("shown"), embedder, visible=HIDDEN)}  # fmt: skip
    versions = {name: warehouse.store.chunks.version for name, warehouse in made.items()}
    assert len(set(versions.values())) == 1, f"every world stands at one table version: {versions}"
    return {name: Path(warehouse.uri) for name, warehouse in made.items()}


def _opened(folder: Path, embedder: Embedder, **settings: Any) -> Warehouse:
    """The warehouse opened afresh: nothing held from an earlier search (caches are per process object)."""
    return Warehouse(Settings(warehouse=str(folder), **settings), embedder=embedder)


def _counted(action: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, dict[str, int]]:
    """What ``action(*args, **kwargs)`` returns (or the error it raises, by class and message) and
    the work counted for it."""
    before = work_done()
    try:
        result: Any = action(*args, **kwargs)
    except NotFoundError as exc:
        result = f"{type(exc).__name__}: {exc}"
    after = work_done()
    return result, {name: after[name] - before[name] for name in after}


def _face(warehouse: Warehouse, hidden_doc: str) -> Observed:
    """Every search, get and explain the intern can ask of the Python face."""
    seen: Observed = {}
    hidden_chunks = warehouse.store.chunks.chunk_ids_of(hidden_doc) or [f"no-chunk-of-{hidden_doc}"]
    for query in QUERIES:
        for mode in MODES:
            for narrow in FILTERS:
                for collapse in COLLAPSES if narrow in (None, FILTERS[3]) else ({},):
                    hits, work = _counted(warehouse.search, query, subject=READER, tenant=TENANT, k=5, mode=mode,
                                          filter=narrow, **collapse)  # fmt: skip
                    seen[f"search {query!r} {mode} {narrow} {collapse}"] = (json.dumps([h.as_dict() for h in hits]), work)
    for chunk_id in [*hidden_chunks, "no-such-chunk"]:
        found, work = _counted(warehouse.get_chunk, chunk_id, subject=READER, tenant=TENANT)
        seen[f"get {'the hidden row' if chunk_id != 'no-such-chunk' else 'a missing row'}"] = (str(found).replace(chunk_id, "ID"), work)
        explained, work = _counted(warehouse.explain, chunk_id, subject=READER, tenant=TENANT)
        seen[f"explain {chunk_id == 'no-such-chunk'}"] = (json.dumps(explained.as_dict()).replace(chunk_id, "ID"), work)
    return seen


def _retrievers(warehouse: Warehouse) -> Observed:
    seen: Observed = {}
    for narrow in (FILTERS[1], FILTERS[6]):
        chain = LangChainRetriever(warehouse=warehouse, subject=READER, tenant=TENANT, k=5, filter=narrow)
        documents, work = _counted(chain.invoke, QUERIES[0])
        seen[f"langchain {narrow}"] = (json.dumps([[d.page_content, d.metadata] for d in documents], default=str), work)
        index = LlamaIndexRetriever(warehouse=warehouse, subject=READER, tenant=TENANT, k=5, mode="hybrid", filter=narrow)
        nodes, work = _counted(index.retrieve, QUERIES[1])
        seen[f"llamaindex {narrow}"] = (json.dumps([[n.node.get_content(), n.score] for n in nodes]), work)
    return seen


@pytest.fixture
def access_lines(caplog: pytest.LogCaptureFixture) -> Callable[[int], list[dict[str, Any]]]:
    """The access log's lines so far, once at least ``count`` have been written (a server writes
    a request's line just after its answer)."""
    caplog.set_level(logging.INFO, logger="ragwarden.access")

    def lines(count: int) -> list[dict[str, Any]]:
        deadline = time.monotonic() + 10
        while True:
            found = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ragwarden.access"]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.01)

    return lines


@pytest.fixture
def served(auth_settings: AuthSettings) -> Iterator[Callable[[Warehouse], str]]:
    """Serve a warehouse (API and MCP) on 127.0.0.1 for the test."""
    with_servers: list[Any] = []

    def serve(warehouse: Warehouse) -> str:
        context = serving(create_app(Settings(warehouse=warehouse.uri, auth=auth_settings), warehouse=warehouse))
        with_servers.append(context)
        return context.__enter__()

    yield serve
    for context in with_servers:
        context.__exit__(None, None, None)


def _over_http(url: str, token: str, hidden_chunk: str, lines: Callable[[int], list[dict[str, Any]]]) -> Observed:
    """Searches, a get and an explain over HTTP, each answer's bytes with the work its access line counts."""
    seen: Observed = {}
    headers = {"Authorization": f"Bearer {token}"}
    asked = [("search", {"query": QUERIES[0], "k": 5, "mode": mode, **({"filter": narrow} if narrow else {})})
             for mode in MODES for narrow in (None, FILTERS[3], FILTERS[10], FILTERS[12])]  # fmt: skip
    asked += [("get", hidden_chunk), ("explain", hidden_chunk)]
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        for what, argument in asked:
            count = len(lines(0))
            if what == "search":
                answer = http.post("/v1/search", json=argument)
            else:
                answer = http.get(f"/v1/chunks/{argument}" + ("/explain" if what == "explain" else ""))
            (line,) = lines(count + 1)[count:]
            key = f"{what} {argument if what == 'search' else ''}"
            seen[key] = (f"{answer.status_code} {answer.content.decode().replace(str(argument), 'ID')}", line.get("work", {}))
    return seen


def _over_mcp(url: str, token: str, hidden_chunk: str, lines: Callable[[int], list[dict[str, Any]]]) -> Observed:
    """The MCP tools over streamable HTTP through the SDK's client: what each returned (its session
    handle aside, which is minted at random) and the work the session's requests counted."""
    calls = [("search", {"query": QUERIES[1], "k": 5, "mode": mode, "filter": FILTERS[4]}) for mode in MODES]
    calls += [("get_chunk", {"chunk_id": hidden_chunk}), ("explain_access", {"chunk_id": hidden_chunk})]

    async def session() -> list[str]:
        answers = []
        async with mcp_over_http(url, token) as client:
            for tool, arguments in calls:
                result = await client.call_tool(tool, arguments)
                content = dict(result.structured_content or {})
                content.pop("session", None)
                text = json.dumps(content) if content else " ".join(getattr(b, "text", "") for b in result.content)
                answers.append(f"{result.is_error} {text.replace(hidden_chunk, 'ID')}")
        return answers

    count = len(lines(0))
    answers = asyncio.run(session())
    time.sleep(0.5)  # the session's last requests (its close) write their lines just after
    work: dict[str, int] = {}
    for line in lines(count)[count:]:
        for name, rows in line.get("work", {}).items():
            work[name] = work.get(name, 0) + rows
    named = {f"mcp {tool} {json.dumps(arguments).replace(hidden_chunk, 'ID')}": (answer, {})
             for (tool, arguments), answer in zip(calls, answers, strict=True)}  # fmt: skip
    return named | {"mcp session": ("", work)}


def _differences(one: Observed, other: Observed) -> list[str]:
    assert one.keys() == other.keys()
    return [f"{key}: {'answer' if one[key][0] != other[key][0] else 'work'} {one[key][1]} != {other[key][1]}"
            for key in one if one[key] != other[key]]  # fmt: skip


@pytest.mark.parametrize(
    "configuration", [{}, {"flat_cache_mb": 0}], ids=["rows and fields held", "nothing held: filters evaluated by Lance"]
)
def test_rows_a_caller_cannot_read_change_no_answer_and_no_work_on_the_python_face(
    worlds: dict[str, Path], embedder: Embedder, configuration: dict[str, Any]
):
    hidden_doc = hidden_sheet_ids(1)[0]  # in the world with hidden rows a forbidden row, elsewhere a missing one
    base, hidden, shown = (_face(_opened(worlds[name], embedder, **configuration), hidden_doc)
                           for name in ("base", "hidden", "shown"))  # fmt: skip
    assert not _differences(base, hidden)
    assert any(work["rows_analysed"] for _, work in base.values()) and any(work["rows_read"] for _, work in base.values())
    assert any(work["filter_rows"] for _, work in base.values()) == (not configuration), "in memory where fields are held"
    changed = _differences(base, shown)
    assert len(changed) > len(base) // 2, "the counters see the rows a search works over (the positive control)"


def test_rows_a_caller_cannot_read_change_nothing_the_framework_retrievers_see_or_do(
    worlds: dict[str, Path], embedder: Embedder
):
    base, hidden = (_retrievers(_opened(worlds[name], embedder)) for name in ("base", "hidden"))
    assert not _differences(base, hidden)
    assert all(work["filter_rows"] > 0 for _, work in base.values())


def test_rows_a_caller_cannot_read_change_no_answer_and_no_work_over_http_or_mcp(
    worlds: dict[str, Path], embedder: Embedder, served: Callable[[Warehouse], str], mint: Callable[..., str],
    access_lines: Callable[[int], list[dict[str, Any]]],
):
    token = mint(READER.removeprefix("user:"), tenant=TENANT)
    observed = {}
    for name in ("base", "hidden"):
        warehouse = _opened(worlds[name], embedder)
        url = served(warehouse)
        hidden_chunk = (warehouse.store.chunks.chunk_ids_of(hidden_sheet_ids(1)[0]) or ["absent-in-this-world"])[0]
        observed[name] = _over_http(url, token, hidden_chunk, access_lines) | _over_mcp(url, token, hidden_chunk, access_lines)
    assert not _differences(observed["base"], observed["hidden"])
    assert observed["base"]["mcp session"][1]["filter_rows"] > 0
    assert all(work.get("rows_checked", 0) > 0 for key, (_, work) in observed["base"].items() if key.startswith("search"))


@pytest.mark.parametrize("colleague", ["user:frank", "user:alice"], ids=["same rows readable", "other rows readable"])
def test_what_a_colleague_filtered_on_changes_nothing_a_caller_sees_or_costs(
    worlds: dict[str, Path], embedder: Embedder, colleague: str
):
    """No cache keyed by a filter is shared between callers: what the intern's filtered search
    costs is the same whether a colleague sent that filter just before, another one, or none."""
    asked = {"title": {"$in": ["band-2", "band-3"]}}

    def intern_after(colleague_filter: dict[str, Any] | None) -> list[tuple[str, dict[str, int]]]:
        warehouse = _opened(worlds["hidden"], embedder)
        if colleague_filter is not None:
            for mode in MODES:
                warehouse.search(QUERIES[0], subject=colleague, tenant=TENANT, k=5, mode=mode, filter=colleague_filter)
        seen = []
        for mode in MODES:
            hits, work = _counted(warehouse.search, QUERIES[0], subject=READER, tenant=TENANT, k=5, mode=mode, filter=asked)
            seen.append((json.dumps([h.as_dict() for h in hits]), work))
        return seen

    alone = intern_after(None)
    assert intern_after(asked) == intern_after({"dept": "sales"}), "the colleague's filter leaves no trace"
    assert [answer for answer, _ in intern_after(asked)] == [answer for answer, _ in alone]


def test_rows_a_caller_cannot_read_change_no_answer_and_no_counted_work_on_the_serving_index_plan(
    worlds: dict[str, Path], embedder: Embedder
):
    """The plan of a caller who may read many rows of a large table: the serving index (built here
    over each small table) with every row's tags and terms resident, the caller's rows a mask over
    them, a filter's matches mapped into it; in every mode.
    The walk of its graph is not counted (SECURITY.md, guarantee 34, says what that leaves); what
    is read, filtered and scored besides is, and stays the same."""

    def observed(name: str) -> Observed:
        warehouse = _opened(worlds[name], embedder)
        searcher = Searcher(warehouse.store.read_doors(), embedder, flat_max_rows=-1, resident_index_bytes=2**28, resident_min_rows=0)
        searcher.serving.build_now()
        vector = embedder.encode([QUERIES[0]])[0]
        seen: Observed = {}
        for mode in MODES:
            for narrow in FILTERS:
                with counting() as work:
                    found = searcher.search(QUERIES[0], policy=warehouse.policy, caller=Caller(subject=READER, tenant=TENANT),
                                            k=5, vector=vector, narrowing=narrowing(narrow), mode=mode)  # fmt: skip
                assert searcher.plan(searcher.prefilter(searcher.view(warehouse.policy, Caller(subject=READER, tenant=TENANT))),
                                     found.table_version) == "resident"  # fmt: skip
                seen[f"{mode} {narrow}"] = (json.dumps([hit.as_dict() for hit in found.hits]), dict(work))
        return seen

    base = observed("base")
    assert not _differences(base, observed("hidden"))
    assert any(work.get("filter_rows") for _, work in base.values())
