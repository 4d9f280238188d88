"""The deployment in ``Dockerfile`` and ``deploy/``, as far as a machine without a container engine
can run it.

``deploy/compose.yaml`` is read, not restated: every service but the TLS proxy runs as a process on
127.0.0.1 with the command and environment the file (and, for the replicas, the Dockerfile) gives
it (``support.compose``): moto's S3 server and the job that makes its bucket, the lineage receiver,
the job that installs the policy, and two ``ragwarden serve`` replicas on one ``s3://`` warehouse.
The variables an operator exports (the JWT secret, issuer and audience) are the test identity
provider's. A wrong command, variable or address in the file makes these tests fail. The proxy's
Caddyfile is checked against the file statically, and so is the Dockerfile: its image cannot be
built here.
"""

from __future__ import annotations

import json
import re
import signal
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.compose import ComposeFile, Dockerfile, LocalCompose
from support.identity_provider import AUDIENCE, ISSUER, JWT_SECRET

from ragwarden.governance.policy import Policy

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
# What the operator exports before `docker compose up`: here, the test identity provider's.
OPERATOR = {"RAGWARDEN_JWT_SECRET": JWT_SECRET.decode(), "RAGWARDEN_JWT_ISSUER": ISSUER,
            "RAGWARDEN_JWT_AUDIENCE": AUDIENCE}  # fmt: skip
PROXY = "proxy"
IMAGE_EMBED_CACHE = "RAGWARDEN_EMBED_CACHE"


def compose(**variables: str) -> ComposeFile:
    """deploy/compose.yaml as Compose reads it with the operator's variables (and ``variables``)."""
    return ComposeFile.read(DEPLOY / "compose.yaml", OPERATOR | variables)


def replicas(read: ComposeFile) -> list[str]:
    """The services that run ``ragwarden serve``."""
    return [name for name, service in read.services.items() if (service.command or ())[:2] == ("ragwarden", "serve")]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory, export_cache: Path) -> Iterator[LocalCompose]:
    """Every service of the compose file but the proxy, running on 127.0.0.1 until the module ends.
    The image's encoder export (its ``RAGWARDEN_EMBED_CACHE``) is this run's."""
    read = compose()
    image = read.services[replicas(read)[0]].image
    assert image is not None and IMAGE_EMBED_CACHE in image.env, "the image names where its encoder export is"
    with LocalCompose(read, tmp_path_factory.mktemp("compose"), paths={image.env[IMAGE_EMBED_CACHE]: export_cache},
                      skip=(PROXY,)) as running:  # fmt: skip
        yield running


@pytest.fixture(scope="module")
def two_replicas(deployed: LocalCompose) -> tuple[str, str]:
    """The URLs of the compose file's two replicas."""
    first, second = replicas(deployed.compose)
    return deployed.url(first), deployed.url(second)


@pytest.fixture(scope="module")
def ingested(two_replicas: tuple[str, str], mint: Callable[..., str]) -> dict[str, Any]:
    """Two documents ingested through the first replica by user:admin (whom deploy/policy.csv
    lets ingest in acme): one whose ACL names alice, one whose ACL names bob."""
    marker = uuid.uuid4().hex[:8]
    records = [
        {"id": f"alice-{marker}", "text": f"Compose deployment memo {marker} for alice.", "tenant": "acme",
         "acl": {"allow": ["user:alice"]}, "labels": [], "classification": "internal"},
        {"id": f"bob-{marker}", "text": f"Compose deployment memo {marker} for bob.", "tenant": "acme",
         "acl": {"allow": ["user:bob"]}, "labels": [], "classification": "internal"},
    ]  # fmt: skip
    response = httpx.post(f"{two_replicas[0]}/v1/ingest", json={"records": records},
                          headers={"Authorization": f"Bearer {mint('admin')}"}, timeout=120)  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.json()["documents"] == len(records), response.text
    return {"marker": marker, "records": records, "answer": response.json()}


@pytest.mark.slow
def test_a_document_ingested_through_one_replica_is_found_through_the_other_as_its_acl_allows(
    two_replicas: tuple[str, str], ingested: dict[str, Any], mint: Callable[..., str]
) -> None:
    query = {"query": f"Compose deployment memo {ingested['marker']}", "k": 5}
    alice = httpx.post(f"{two_replicas[1]}/v1/search", json=query, headers={"Authorization": f"Bearer {mint('alice')}"},
                       timeout=60)  # fmt: skip
    anonymous = httpx.post(f"{two_replicas[1]}/v1/search", json=query, timeout=60)
    assert alice.status_code == 200, alice.text
    assert {hit["doc_id"] for hit in alice.json()["hits"]} == {f"alice-{ingested['marker']}"}
    assert anonymous.status_code == 401


@pytest.mark.slow
def test_both_replicas_serve_the_policy_the_init_job_installed_and_the_one_table_version(
    two_replicas: tuple[str, str], ingested: dict[str, Any]
) -> None:
    ready = [httpx.get(f"{url}/readyz", timeout=30).json() for url in two_replicas]
    installed = Policy.from_file(DEPLOY / "policy.csv").version  # what the init job was to install
    assert [answer["policy_version"] for answer in ready] == [installed, installed]
    assert [answer["table_version"] for answer in ready] == [ingested["answer"]["table_version"]] * 2


@pytest.mark.slow
def test_the_lineage_backend_receives_the_ingest_run_with_the_warehouse_as_its_output(
    deployed: LocalCompose, ingested: dict[str, Any]
) -> None:
    services = deployed.compose.services
    lineage = next(name for name, service in services.items()
                   if any(word.endswith("/lineage_receiver.py") for word in service.command or ()))  # fmt: skip
    warehouse = services[replicas(deployed.compose)[0]].environment["RAGWARDEN_WAREHOUSE"]
    deadline = time.monotonic() + 60  # events are sent as the run ends; wait for them, never for a time
    while True:
        events = [json.loads(line) for line in deployed.log(lineage).splitlines() if line.startswith("{")]
        completed = [e for e in events if e["job"]["name"] == "ragwarden.ingest" and e["eventType"] == "COMPLETE"]
        if completed or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert completed, f"no COMPLETE ingest event reached the receiver: {[e.get('eventType') for e in events]}"
    outputs = {f"{o['namespace']}/{o['name']}" for e in completed for o in e["outputs"]}
    assert f"{warehouse.rstrip('/')}/chunks" in outputs, outputs


@pytest.mark.slow
def test_mcp_answers_the_proxy_s_public_name_on_every_replica(
    deployed: LocalCompose, two_replicas: tuple[str, str], mint: Callable[..., str]
) -> None:
    public = deployed.compose.services[PROXY].environment["RAGWARDEN_HOSTNAME"]
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {mint('alice')}"}
    for url in two_replicas:
        served = httpx.post(f"{url}/mcp/", json=body, headers=headers | {"Host": public}, timeout=60)
        rebound = httpx.post(f"{url}/mcp/", json=body, headers=headers | {"Host": "attacker.example"}, timeout=60)
        assert served.status_code == 200, served.text
        assert rebound.status_code == 421


# -- what cannot run here, checked as written ------------------------------------------------------


def test_the_proxy_sends_to_every_replica_under_the_name_the_replicas_admit() -> None:
    caddyfile = (DEPLOY / "Caddyfile").read_text(encoding="utf-8")
    upstreams = set(re.search(r"^\s*to\s+(.+)$", caddyfile, re.MULTILINE).group(1).split())  # type: ignore[union-attr]
    site = re.search(r"^\{\$RAGWARDEN_HOSTNAME(:[^}]*)?\} \{$", caddyfile, re.MULTILINE)
    assert site, "the site Caddy serves is the name the proxy is given"
    for variables in ({}, {"RAGWARDEN_HOSTNAME": "rag.example.com"}):
        read = compose(**variables)
        proxy = read.services[PROXY]
        assert proxy.mounts["/etc/caddy/Caddyfile"] == DEPLOY / "Caddyfile"
        assert upstreams == {f"{name}:{read.services[name].port}" for name in replicas(read)}
        name = proxy.environment["RAGWARDEN_HOSTNAME"]
        assert name == variables.get("RAGWARDEN_HOSTNAME", "rag.localhost")
        for replica in replicas(read):
            allowed = read.services[replica].environment["RAGWARDEN_ALLOWED_HOSTS"].split(",")
            assert {name, f"{name}:*"} <= set(allowed), (replica, allowed)


def test_the_image_installs_the_pinned_cpu_torch_first_and_serves_as_a_non_root_user() -> None:
    image = Dockerfile.read(REPO / "Dockerfile")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    torch_pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("torch=="))
    runs = image.all("RUN")
    torch_step = next(n for n, run in enumerate(runs) if torch_pin in run.split())
    package_step = next(n for n, run in enumerate(runs) if re.search(r"\bpip install \.(\s|$)", run))
    assert image.last("FROM") == "python:3.11-slim"
    assert torch_step < package_step and "download.pytorch.org/whl/cpu" in runs[torch_step]
    user = image.last("USER")
    assert user is not None and user.split(":")[0] not in ("root", "0")
    keywords = [keyword for keyword, _ in image.instructions]
    assert keywords.index("USER") < keywords.index("CMD") and "RUN" not in keywords[keywords.index("USER"):]
    assert image.env["HF_HUB_OFFLINE"] == "1"
    assert image.exposed == [8000]
    assert image.cmd == ["ragwarden", "serve", "--host", "0.0.0.0", "--port", "8000"]
    assert image.healthcheck is not None and "/readyz" in " ".join(image.healthcheck)


def test_the_stand_in_object_store_is_the_moto_server_the_tests_run() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    pin = next(d for d in pyproject["project"]["optional-dependencies"]["test"] if d.startswith("moto"))
    s3 = compose().services["s3"]
    assert s3.image is not None and any(f'"{pin}"' in run or pin in run.split() for run in s3.image.all("RUN"))
    assert s3.command is not None and s3.command[:3] == ("python", "-m", "moto.server")


@pytest.mark.slow
def test_stopping_the_stack_stops_each_replica_before_the_object_store_so_it_folds_its_journal_at_exit(
    deployed: LocalCompose, two_replicas: tuple[str, str], ingested: dict[str, Any], mint: Callable[..., str]
) -> None:
    """Last in this module: it stops the stack. ``docker compose down`` stops a service after the
    services that depend on it; a replica whose object store stopped first could not fold its
    journal at exit and printed a "Generic S3 error ... list request" about it."""
    for url in two_replicas:  # a receipt waiting in each replica's journal as the stack stops
        searched = httpx.post(f"{url}/v1/search", json={"query": f"memo {ingested['marker']}", "k": 1},
                              headers={"Authorization": f"Bearer {mint('alice')}"}, timeout=60)  # fmt: skip
        assert searched.status_code == 200, searched.text
    deployed.down()
    for name in replicas(deployed.compose):
        said = deployed.log(name)
        assert deployed.processes[name].returncode in (0, -signal.SIGTERM), said[-2000:]  # uvicorn re-raises it once stopped
        assert "audit journal" not in said and "Generic S3 error" not in said, said[-2000:]
