"""Distributed ingest on Ray Data gives what a local ingest of the same input gives (the same chunk
ids, tags and sources, vectors within 1e-5), even with an actor killed mid-run. Ray runs in a user and network namespace the test
makes, with only the loopback interface up, and the test fails if any process there listens on
anything but loopback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.raw_tables import raw_table

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.policies import policy_file
from ragwarden.state import TAG_COLUMNS
from ragwarden.warehouse import Warehouse

pytest.importorskip("ray", reason="the Ray engine is tested where the ray extra is installed (make test installs it)")
pytestmark = pytest.mark.slow  # starts a Ray cluster and two model-loading actors: about a minute

WORKER = Path(__file__).parents[1] / "support" / "ray_ingest_worker.py"
CORPUS = Path(__file__).parents[2] / "examples" / "demo" / "corpus.jsonl"
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
ISOLATED = ["unshare", "--user", "--map-root-user", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


def _namespaces_work() -> str | None:
    """None if this machine lets an unprivileged user make a network namespace, else why not."""
    try:
        probe = subprocess.run([*ISOLATED, "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None if probe.returncode == 0 else probe.stderr.strip() or f"exit {probe.returncode}"


def _rows(warehouse: Warehouse) -> dict[str, dict]:
    columns = ["chunk_id", "doc_id", "position", "text", "vector", "kind", *TAG_COLUMNS]
    return {r["chunk_id"]: r for r in raw_table(warehouse.store).search().select(columns).limit(None).to_list()}


def _sources(warehouse: Warehouse) -> list[tuple]:
    rows = raw_table(warehouse.store, "sources").search().select(["doc_id", "tenant", "doc_version", "tags_fingerprint"]).limit(None).to_list()
    return sorted((r["tenant"], r["doc_id"], r["doc_version"], r["tags_fingerprint"]) for r in rows)


@pytest.mark.usefixtures("onnx_workers")  # the actors start in a second, not seven; three of them start here
def test_a_ray_ingest_with_an_actor_killed_equals_a_local_one_and_ray_listens_on_loopback_only(
    tmp_path: Path, onnx_embedder: Embedder
) -> None:
    why = _namespaces_work()
    if why:
        pytest.skip(f"cannot make a network namespace with only loopback for Ray ({why}); Ray is not started outside one")
    corpus = tmp_path / "corpus.jsonl"
    long_text = " ".join(f"Clause {i} of the vendor master agreement sets payment terms and audit rights." for i in range(120))
    extra = {"id": "acme-long-001", "text": long_text, "tenant": "acme", "acl": {"allow": ["group:finance"]},
             "labels": ["finance"], "classification": "confidential"}  # fmt: skip
    more = [{"id": f"acme-memo-{n:03d}", "text": f"Memo {n}. " + " ".join(f"Item {i} of memo {n} reviews vendor spend."
             for i in range(40)), "tenant": "acme", "acl": {"allow": ["group:staff"]}, "classification": "internal"}
            for n in range(40)]  # fmt: skip
    lines = [json.dumps(r) for r in (extra, *more)]
    corpus.write_text(CORPUS.read_text(encoding="utf-8").rstrip("\n") + "\n" + "\n".join(lines) + "\n", encoding="utf-8")
    empty = tmp_path / "empty"
    with Warehouse(Settings(warehouse=str(empty)), embedder=onnx_embedder) as warehouse:  # its receipt folded before the copy
        warehouse.install_policy(policy_file("demo.csv"))
    shutil.copytree(empty, tmp_path / "distributed")
    local = Warehouse(Settings(warehouse=str(empty)), embedder=onnx_embedder)
    assert local.ingest(corpus).ok

    out = tmp_path / "ray.json"
    run = subprocess.run([*ISOLATED, sys.executable, str(WORKER), str(tmp_path / "distributed"), str(corpus), str(out)],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["killed"], "no actor was killed mid-run: the retry went untested"
    print(f"\nray ingest: {figures['documents']} documents, {figures['chunks']} chunks, actor killed: {figures['killed']}, "
          f"listening: {sorted({(s['process'], s['address']) for s in figures['sockets']})}")  # fmt: skip

    assert figures["interfaces_up"] == ["lo"]
    assert len(figures["sockets"]) >= 3, f"too few sockets seen for the check to mean anything: {figures}"
    outside = [s for s in figures["sockets"] if s["address"] not in LOOPBACK]
    assert not outside, f"Ray processes listening beyond loopback: {outside}"

    distributed = Warehouse(Settings(warehouse=str(tmp_path / "distributed")), embedder=onnx_embedder)
    ours, theirs = _rows(local), _rows(distributed)
    assert figures["rejected"] == [] and figures["documents"] == len(_sources(local))
    assert sorted(theirs) == sorted(ours), "the Ray ingest made other chunk ids"
    assert len([r for r in ours.values() if r["doc_id"] == "acme-long-001"]) > 1, "the long document should be several chunks"
    for chunk_id, row in ours.items():
        other = theirs[chunk_id]
        assert {c: other[c] for c in (*TAG_COLUMNS, "doc_id", "position", "text", "kind")} == {
            c: row[c] for c in (*TAG_COLUMNS, "doc_id", "position", "text", "kind")
        }, chunk_id
        assert np.allclose(other["vector"], row["vector"], atol=1e-5), chunk_id
    assert _sources(distributed) == _sources(local)
