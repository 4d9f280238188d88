"""Lineage: OpenLineage events that validate, land in the warehouse by default, and survive a
lineage backend that is down or slow without holding up a run, delivered once when it is back.

Validation is offline, against the OpenLineage JSON schemas in the shared data sets
(``$RAGWARDEN_DATA/openlineage-spec``, default ``../shared/data`` beside the checkout) and our
facets' schemas in ``governance/lineage/facet_schemas/``: the event against its ``schemaURL``,
every facet against its own ``_schemaURL``, with a format checker for uuid, date-time and uri.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pytest
import referencing
import referencing.exceptions
from jsonschema import Draft202012Validator, FormatChecker
from openlineage.client.transport import HttpTransport
from support.lineage_receiver import closed_port

from ragwarden.governance.lineage import (
    MAX_LISTED_INPUTS,
    Chunking,
    ChunksOutput,
    Embedding,
    GovernanceSummary,
    location_dataset,
    source_dataset,
)
from ragwarden.governance.tags import Classification, GovernanceTags
from ragwarden.lineage_emitter import FlushReport, LineageEmitter
from ragwarden.lineage_transport import HTTP_BOUNDS

Event = dict[str, Any]
DATA = Path(os.environ.get("RAGWARDEN_DATA") or Path(__file__).resolve().parents[2].parent / "shared" / "data")
SPEC = DATA / "openlineage-spec"
SCHEMA = pa.schema(
    [
        pa.field("chunk_id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("vector", pa.list_(pa.float32(), 4)),
        pa.field("labels", pa.list_(pa.string())),
        pa.field("meta", pa.struct([pa.field("page", pa.int32())])),
    ]
)
SOURCES = ["/srv/docs/handbook.pdf", "file:///srv/docs/a%20b.txt", "s3://corp-docs/hr/policy.md", "doc:42"]
TAGS = [
    GovernanceTags(tenant="acme", acl_clauses=(frozenset({"group:hr"}),), labels=frozenset({"hr", "pii"})),
    GovernanceTags(
        tenant="acme",
        acl_clauses=(frozenset({"group:hr"}),),
        labels=frozenset({"hr"}),
        classification=Classification.CONFIDENTIAL,
    ),
]
OUTPUT = ChunksOutput(
    version=7,
    schema=SCHEMA,
    rows=2,
    chunking=Chunking(tokenizer="all-MiniLM-L6-v2", window=256, overlap=32, chunk_count=2),
    embedding=Embedding(model="all-MiniLM-L6-v2", dimension=4),
    governance=GovernanceSummary.of(TAGS, documents=1),
)


# --- offline validation -------------------------------------------------------------------------

RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
FORMATS = FormatChecker()


@FORMATS.checks("date-time", raises=ValueError)
def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    datetime.fromisoformat(value)
    return RFC3339.fullmatch(value) is not None


@FORMATS.checks("uri")
def _is_uri(value: object) -> bool:
    if not isinstance(value, str):
        return True
    scheme = urlsplit(value).scheme
    return bool(re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme)) and not re.search(r"\s", value)


def _facets_of(event: Event) -> Iterator[tuple[str, str, Event]]:
    places = [("run", event["run"].get("facets")), ("job", event["job"].get("facets"))]
    for kind in ("inputs", "outputs"):
        for n, dataset in enumerate(event.get(kind) or []):
            for group in ("facets", "inputFacets", "outputFacets"):
                places.append((f"{kind}[{n}].{group}", dataset.get(group)))
    for where, facets in places:
        for name, facet in (facets or {}).items():
            yield where, name, facet


class EventValidator:
    """Checks an event and each facet against the schema its URL names; lists every problem."""

    def __init__(self, schema_files: list[Path]) -> None:
        documents = [json.loads(path.read_text(encoding="utf-8")) for path in schema_files]
        for document in documents:
            Draft202012Validator.check_schema(document)
        self.registry: referencing.Registry = referencing.Registry().with_resources(
            (document["$id"], referencing.Resource.from_contents(document)) for document in documents
        )

    def problems(self, event: Event) -> list[str]:
        found = self._check("event", event, event.get("schemaURL", "<no schemaURL>"))
        for where, name, facet in _facets_of(event):
            url = facet.get("_schemaURL", "<no _schemaURL>")
            found += self._check(f"{where}.{name}", facet, url)
            if not found:
                declared = self.registry.resolver().lookup(url.partition("#")[0]).contents.get("properties", {})
                if name not in declared:
                    found.append(f"{where}.{name}: {url} declares the facet as {sorted(declared)}, not {name!r}")
        return found

    def _check(self, where: str, instance: Event, url: str) -> list[str]:
        try:
            self.registry.resolver().lookup(url)
        except referencing.exceptions.Unresolvable as exc:
            return [f"{where}: schema {url} cannot be resolved offline ({exc!r})"]
        validator = Draft202012Validator({"$ref": url}, registry=self.registry, format_checker=FORMATS)
        return [f"{where}: {error.message} at {list(error.absolute_path)}" for error in validator.iter_errors(instance)]


@pytest.fixture(scope="module")
def validator() -> EventValidator:
    if not (SPEC / "OpenLineage.json").is_file():
        pytest.skip(f"the OpenLineage JSON schemas are not at {SPEC}; set RAGWARDEN_DATA to the shared data sets")
    ours = sorted(Path(str(resources.files("ragwarden.governance.lineage") / "facet_schemas")).glob("*.json"))
    assert ours, "governance/lineage/facet_schemas/*.json are missing from the package"
    return EventValidator([SPEC / "OpenLineage.json", *sorted((SPEC / "facets").glob("*.json")), *ours])


def assert_valid(validator: EventValidator, events: list[Event]) -> None:
    problems = [f"{e['eventType']} {p}" for e in events for p in validator.problems(e)]
    assert not problems, "\n".join(problems)


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No OpenLineage settings of the machine running the tests reach the client."""
    for name in list(os.environ):
        if name.startswith("OPENLINEAGE"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def emitters(tmp_path: Path) -> Iterator[Callable[..., LineageEmitter]]:
    """Builds emitters over the warehouse ``tmp_path/warehouse``; closes them after the test."""
    made: list[LineageEmitter] = []

    def make(env: dict[str, str] | None = None) -> LineageEmitter:
        warehouse = tmp_path / "warehouse"
        made.append(LineageEmitter(str(warehouse), warehouse / "_lineage", env or {}))
        return made[-1]

    yield make
    for emitter in made:
        emitter.close()


def http_env(url: str) -> dict[str, str]:
    return {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": url}


def ingest_ok(emitter: LineageEmitter, sources: list[str] = SOURCES) -> str:
    with emitter.run("ingest", sources) as scope:
        scope.output = OUTPUT
    return scope.run.run_id


def ingest_failing(emitter: LineageEmitter) -> str:
    with pytest.raises(RuntimeError, match="embedder ran out of memory"), emitter.run("ingest", SOURCES) as scope:
        raise RuntimeError("embedder ran out of memory")
    return scope.run.run_id


def read_events(folder: Path) -> list[Event]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


def by_run_and_type(events: list[Event]) -> Counter[tuple[str, str]]:
    return Counter((e["run"]["runId"], e["eventType"]) for e in events)


# --- the events ---------------------------------------------------------------------------------


@pytest.mark.data
def test_every_event_of_a_completed_and_a_failed_run_validates(
    emitters: Callable[..., LineageEmitter], validator: EventValidator, tmp_path: Path
) -> None:
    emitter = emitters()
    ok, failed = ingest_ok(emitter), ingest_failing(emitter)

    events = read_events(tmp_path / "warehouse" / "_lineage" / "events")
    assert [(e["run"]["runId"], e["eventType"]) for e in events] == [
        (ok, "START"), (ok, "COMPLETE"), (failed, "START"), (failed, "FAIL")
    ]  # fmt: skip
    assert_valid(validator, events)

    complete, fail = events[1], events[3]
    assert (complete["job"]["namespace"], complete["job"]["name"]) == ("ragwarden", "ragwarden.ingest")
    (chunks,) = complete["outputs"]
    assert (chunks["namespace"], chunks["name"]) == ("file", str(tmp_path / "warehouse" / "chunks"))
    assert chunks["facets"]["version"]["datasetVersion"] == "7"
    assert [f["name"] for f in chunks["facets"]["schema"]["fields"]] == SCHEMA.names
    lineage = chunks["facets"]["columnLineage"]["fields"]
    assert [(f["name"], f["field"]) for f in lineage["vector"]["inputFields"]] == [(chunks["name"], "text")]
    assert {(f["namespace"], f["name"], f["field"]) for f in lineage["text"]["inputFields"]} == {
        (i["namespace"], i["name"], "text") for i in complete["inputs"]
    }
    facets = complete["run"]["facets"]
    assert facets["ragwarden_chunking"]["chunkCount"] == 2
    assert (facets["ragwarden_embedding"]["model"], facets["ragwarden_embedding"]["dimension"]) == (
        "all-MiniLM-L6-v2",
        4,
    )
    assert facets["ragwarden_governance"]["labelCounts"] == {"hr": 2, "pii": 1}
    assert facets["ragwarden_governance"]["classificationCounts"] == {"confidential": 1, "public": 1}
    assert facets["ragwarden_governance"]["aclClauses"] == 1
    error = fail["run"]["facets"]["errorMessage"]
    assert error["message"] == "embedder ran out of memory"
    assert error["programmingLanguage"] == "python"
    assert "RuntimeError: embedder ran out of memory" in error["stackTrace"]


@pytest.mark.data
def test_many_sources_are_one_input_the_sources_table_with_their_count(
    emitters: Callable[..., LineageEmitter], validator: EventValidator, tmp_path: Path
) -> None:
    sources = [f"doc:{n}" for n in range(MAX_LISTED_INPUTS + 1)] + ["doc:0"]
    ingest_ok(emitters(), sources)

    events = read_events(tmp_path / "warehouse" / "_lineage" / "events")
    assert_valid(validator, events)
    for event in events:
        assert [(i["namespace"], i["name"]) for i in event["inputs"]] == [
            ("file", str(tmp_path / "warehouse" / "sources"))
        ]
        counts = event["run"]["facets"]["ragwarden_sources"]
        assert (counts["sourceCount"], counts["listedInputs"]) == (MAX_LISTED_INPUTS + 1, 1)


@pytest.mark.parametrize(
    ("ref", "namespace", "name"),
    [
        ("/srv/docs/a.txt", "file", "/srv/docs/a.txt"),
        ("file:///srv/docs/a%20b.txt", "file", "/srv/docs/a b.txt"),
        ("file://nas/share/a.txt", "file://nas", "/share/a.txt"),
        ("s3://bucket/dir/a.pdf", "s3://bucket", "dir/a.pdf"),
        ("gs://bucket/a.pdf", "gs://bucket", "a.pdf"),
        ("https://wiki.example.com/page/1", "https://wiki.example.com", "/page/1"),
        ("doc:42", "doc", "42"),
        ("42", "doc", "42"),
        ("test://x", "test", "x"),
    ],
)
def test_sources_are_named_by_the_openlineage_conventions(ref: str, namespace: str, name: str) -> None:
    dataset = source_dataset(ref)
    assert (dataset.namespace, dataset.name) == (namespace, name)


def test_a_relative_warehouse_path_names_its_tables_absolutely(tmp_path: Path) -> None:
    assert location_dataset("warehouse/chunks").name == str(tmp_path / "warehouse" / "chunks")
    assert location_dataset("s3://lake/wh/chunks").name == "wh/chunks"


@pytest.mark.data
def test_the_validator_reports_bad_facets_unknown_schemas_and_misnamed_facets(
    emitters: Callable[..., LineageEmitter], validator: EventValidator, tmp_path: Path
) -> None:
    ingest_ok(emitters())
    complete = read_events(tmp_path / "warehouse" / "_lineage" / "events")[1]
    assert validator.problems(complete) == []

    def problems_after(change: Callable[[Event], object]) -> list[str]:
        event = copy.deepcopy(complete)
        change(event)
        return validator.problems(event)

    chunking = ("run", "facets", "ragwarden_chunking")
    assert problems_after(lambda e: _at(e, chunking).update(chunkCount=-1))
    assert problems_after(lambda e: _at(e, chunking).update(surprise=1))
    assert problems_after(lambda e: e["run"].update(runId="run-1"))
    assert problems_after(lambda e: e.update(eventTime="yesterday"))
    assert problems_after(lambda e: _at(e, ("outputs",))[0]["facets"]["schema"].update(fields=[{"type": "int"}]))
    unknown = "https://ragwarden.dev/spec/facets/9-9-9/RagwardenChunkingRunFacet.json#/$defs/RagwardenChunkingRunFacet"
    assert "cannot be resolved" in " ".join(problems_after(lambda e: _at(e, chunking).update(_schemaURL=unknown)))
    misnamed = problems_after(
        lambda e: e["run"]["facets"].update(chunking=e["run"]["facets"].pop("ragwarden_chunking"))
    )
    assert "declares the facet as ['ragwarden_chunking']" in " ".join(misnamed)


def _at(event: Event, path: tuple[str, ...]) -> Any:
    for key in path:
        event = event[key]
    return event


def test_the_format_checker_checks_the_formats_the_spec_uses() -> None:
    assert not FORMATS.conforms("not-a-uuid", "uuid")
    assert not FORMATS.conforms("2026-08-20 12:00", "date-time")
    assert FORMATS.conforms("2026-08-20T12:00:00.5+00:00", "date-time")
    assert not FORMATS.conforms("no scheme here", "uri")


# --- where the events go ------------------------------------------------------------------------


def test_without_configuration_events_are_files_in_the_warehouse(
    emitters: Callable[..., LineageEmitter], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "console")  # the process env is not the caller's env
    ingest_ok(emitters({"HOME": str(tmp_path / "home")}))

    lineage = tmp_path / "warehouse" / "_lineage"
    assert len(read_events(lineage / "events")) == 2
    assert not list((lineage / "spool").glob("*.json"))
    assert {p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*") if p.is_file()} == {"warehouse"}


def test_the_environment_mapping_configures_the_client(emitters: Callable[..., LineageEmitter], tmp_path: Path) -> None:
    config = tmp_path / "ol.yml"
    config.write_text("transport:\n  type: http\n  url: http://127.0.0.1:9\n")
    from_file = emitters({"OPENLINEAGE_CONFIG": str(config)})
    from_url = emitters({"OPENLINEAGE_URL": "http://127.0.0.1:9", "OPENLINEAGE_ENDPOINT": "x/lineage"})
    for emitter in (from_file, from_url):
        assert isinstance(emitter.transport, HttpTransport)
        assert emitter.transport.timeout == HTTP_BOUNDS["timeout"]
        assert emitter.transport.config.retry["total"] == HTTP_BOUNDS["retry"]["total"]
    assert isinstance(from_url.transport, HttpTransport) and from_url.transport.endpoint == "x/lineage"

    disabled = emitters({"OPENLINEAGE_DISABLED": "true"})
    assert disabled.transport is None
    ingest_ok(disabled)
    assert not (tmp_path / "warehouse" / "_lineage").exists()


# --- a backend that is down, slow or refusing ---------------------------------------------------


def _backend_down(how: str, receiver: Callable[..., Any]) -> tuple[int, Any]:
    """A port whose backend is down, and the receiver answering 503 there (None: nobody listens)."""
    if how == "port closed":
        return closed_port(), None
    answering = receiver(mode="503")
    return int(urlsplit(answering.url).port or 0), answering


def _bring_up(receiver: Callable[..., Any], port: int, answering: Any) -> Any:
    if answering is None:
        return receiver(port)
    answering.mode = "up"
    return answering


@pytest.mark.parametrize("how", ["port closed", "answering 503"])
def test_a_down_backend_costs_little_and_flush_delivers_every_event_once(
    how: str,
    emitters: Callable[..., LineageEmitter],
    receiver: Callable[..., Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    port, answering = _backend_down(how, receiver)
    emitter = emitters(http_env(f"http://127.0.0.1:{port}"))
    spool = tmp_path / "warehouse" / "_lineage" / "spool"

    with caplog.at_level(logging.WARNING, logger="ragwarden.governance"):
        began = time.perf_counter()
        ok = ingest_ok(emitter)
        failed = ingest_failing(emitter)
        took = time.perf_counter() - began
    assert took < 2.0, f"two runs took {took:.2f}s against a backend that is down"
    if answering is not None:
        assert answering.posts <= 4, "more than one attempt (with its one retry) per run"
    spooled = read_events(spool)
    expected = Counter({(ok, "START"): 1, (ok, "COMPLETE"): 1, (failed, "START"): 1, (failed, "FAIL"): 1})
    assert by_run_and_type(spooled) == expected
    assert any("kept in" in record.getMessage() for record in caplog.records)

    up = _bring_up(receiver, port, answering)
    report = emitter.flush()
    assert (report.sent, report.failed, report.pending) == (4, 0, 0)
    assert not list(spool.glob("*.json"))
    assert by_run_and_type(up.events) == expected
    assert up.events == spooled  # a re-send is the spooled event itself
    assert emitter.flush().sent == 0
    assert by_run_and_type(up.events) == expected


@pytest.mark.parametrize("how", ["port closed", "answering 503"])
def test_the_next_run_delivers_what_a_down_backend_left_spooled(
    how: str,
    emitters: Callable[..., LineageEmitter],
    receiver: Callable[..., Any],
    tmp_path: Path,
) -> None:
    port, answering = _backend_down(how, receiver)
    earlier = ingest_ok(emitters(http_env(f"http://127.0.0.1:{port}")))
    up = _bring_up(receiver, port, answering)

    later = ingest_ok(emitters(http_env(up.url)))  # a new emitter: as in the next process

    assert [(e["run"]["runId"], e["eventType"]) for e in up.events] == [
        (earlier, "START"), (earlier, "COMPLETE"), (later, "START"), (later, "COMPLETE")
    ]  # fmt: skip
    assert not list((tmp_path / "warehouse" / "_lineage" / "spool").glob("*.json"))


def test_a_slow_backend_does_not_hold_up_a_run(
    emitters: Callable[..., LineageEmitter], receiver: Callable[..., Any], tmp_path: Path
) -> None:
    slow = receiver(mode="slow", delay=30.0)
    emitter = emitters(http_env(slow.url))

    began = time.perf_counter()
    run = ingest_ok(emitter)
    took = time.perf_counter() - began

    assert took < 3.0, f"a run took {took:.2f}s against a backend that does not answer"
    assert by_run_and_type(read_events(tmp_path / "warehouse" / "_lineage" / "spool")) == Counter(
        {(run, "START"): 1, (run, "COMPLETE"): 1}
    )


def test_an_event_the_backend_refuses_is_set_aside_not_retried_forever(
    emitters: Callable[..., LineageEmitter], receiver: Callable[..., Any], tmp_path: Path
) -> None:
    refusing = receiver(mode="400")
    emitter = emitters(http_env(refusing.url))
    ingest_ok(emitter)

    lineage = tmp_path / "warehouse" / "_lineage"
    assert len(read_events(lineage / "rejected")) == 2
    assert not list((lineage / "spool").glob("*.json"))
    refusing.mode = "up"
    ingest_ok(emitter)
    assert len(refusing.events) == 2


def test_a_flush_under_way_elsewhere_is_not_joined(
    emitters: Callable[..., LineageEmitter], receiver: Callable[..., Any]
) -> None:
    port = closed_port()
    emitter = emitters(http_env(f"http://127.0.0.1:{port}"))
    ingest_ok(emitter)
    up = receiver(port)

    with emitter.spool.exclusive() as ours:  # as another process flushing this spool would
        assert ours
        assert emitters(http_env(up.url)).flush() == FlushReport(pending=2)
    assert up.events == []
    assert emitter.flush().sent == 2


def test_chunking_and_summaries_refuse_impossible_numbers() -> None:
    with pytest.raises(ValueError, match="overlap"):
        Chunking(tokenizer="t", window=8, overlap=8, chunk_count=1)
    with pytest.raises(ValueError, match="documents"):
        GovernanceSummary(frozenset(), {}, {}, acl_clauses=0, documents=-1)


# --- the warehouse's jobs -----------------------------------------------------------------------


def _warehouse(tmp_path: Path, embedder: Any, env: dict[str, str] | None = None) -> Any:
    from ragwarden.config import Settings
    from ragwarden.policies import policy_file
    from ragwarden.warehouse import Warehouse

    warehouse = Warehouse(Settings(warehouse=str(tmp_path / "wh"), openlineage_env=env or {}), embedder=embedder)
    warehouse.install_policy(policy_file("demo.csv"))
    return warehouse


RECORD = {
    "id": "r1",
    "text": "Budget notes for Q4.",
    "tenant": "acme",
    "acl": {"allow": ["group:staff"]},
    "classification": "internal",
}


def test_ingest_derive_sync_and_forget_each_emit_a_valid_completed_run(
    tmp_path: Path, embedder: Any, validator: EventValidator
) -> None:
    wh = _warehouse(tmp_path, embedder)
    wh.ingest_records([RECORD])
    chunk = wh.store.chunks.chunk_ids_of("r1")[0]
    wh.derive("A note.", parents=[chunk], subject="user:dave", tenant="acme")
    wh.sync([{**RECORD, "labels": ["finance"]}])
    wh.forget("r1", reason="test")
    events = read_events(tmp_path / "wh" / "_lineage" / "events")
    assert_valid(validator, events)
    runs = Counter((e["job"]["name"], e["eventType"]) for e in events)
    for job in ("ingest", "derive", "sync", "forget"):
        assert runs[(f"ragwarden.{job}", "START")] == 1 and runs[(f"ragwarden.{job}", "COMPLETE")] == 1
    ingest = next(e for e in events if e["job"]["name"] == "ragwarden.ingest" and e["eventType"] == "COMPLETE")
    assert {"ragwarden_chunking", "ragwarden_embedding", "ragwarden_governance"} <= set(ingest["run"]["facets"])
    assert ingest["inputs"][0]["name"] == "r1"
    (output,) = ingest["outputs"]
    assert output["name"].endswith("/chunks") and {"schema", "columnLineage", "version"} <= set(output["facets"])
    assert ingest["run"]["facets"]["ragwarden_governance"]["classificationCounts"] == {"internal": 1}


def test_a_failed_ingest_emits_fail_with_the_error(tmp_path: Path, embedder: Any, validator: EventValidator) -> None:
    from ragwarden.embedder import Embedder

    class BrokenEmbedder(Embedder):
        def encode(self, texts: list[str]) -> Any:
            raise RuntimeError("the embedder broke")

    wh = _warehouse(tmp_path, BrokenEmbedder())
    with pytest.raises(RuntimeError, match="the embedder broke"):
        wh.ingest_records([RECORD])
    events = read_events(tmp_path / "wh" / "_lineage" / "events")
    assert_valid(validator, events)
    (fail,) = [e for e in events if e["eventType"] == "FAIL"]
    assert "the embedder broke" in fail["run"]["facets"]["errorMessage"]["message"]


def test_lineage_flush_command_delivers_what_a_down_backend_left(
    tmp_path: Path, embedder: Any, receiver: Callable[..., Any]
) -> None:
    from click.testing import CliRunner

    from ragwarden.api.cli import main

    port = closed_port()
    env = http_env(f"http://127.0.0.1:{port}")
    wh = _warehouse(tmp_path, embedder, env)
    wh.ingest_records([RECORD])
    assert len(list((tmp_path / "wh" / "_lineage" / "spool").glob("*.json"))) == 2
    up = receiver(port)
    result = CliRunner().invoke(main, ["lineage", "flush", "--warehouse", wh.uri], env=env)
    assert result.exit_code == 0 and "sent 2" in result.stdout
    assert sorted(by_run_and_type(up.events).values()) == [1, 1]
