"""Ingest killed with SIGKILL at seeded random points: afterwards every document is wholly present
with its tags or absent, no chunk id is duplicated, nothing untagged is visible, and running the
same ingest again completes the job.

The killed process loads the model and its tokenizer before it says it is ready, so every kill
falls within the ingest itself (reading, embedding, committing), never in the model's start-up."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.raw_tables import raw_table
from support.warehouse_workers import document

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.policies import policy_file
from ragwarden.state import TAG_COLUMNS
from ragwarden.warehouse import Warehouse

RUNS = int(os.environ.get("RAGWARDEN_CRASH_RUNS", "10"))  # make soak: 100
DOCUMENTS = 12
BATCH_DOCS = 2  # embed two documents, commit them, and so on: many points to die between
KILLED_INGEST = textwrap.dedent("""
    import sys
    from ragwarden.config import Settings
    from ragwarden.warehouse import Warehouse
    batch = int(sys.argv[3])
    warehouse = Warehouse(Settings(warehouse=sys.argv[1], write_batch_docs=batch, embed_window_docs=batch))
    warehouse.embedder.encode(["load the model before the clock starts"])
    warehouse.embedder.tokenizer  # and the tokenizer chunking cuts windows with
    print("ready", flush=True)
    warehouse.ingest(sys.argv[2])
    print("done", flush=True)
""")


def _state(warehouse: Warehouse) -> dict[str, Any]:
    """Chunk ids, and each document's chunks with their tags, as stored."""
    rows = raw_table(warehouse.store).search().select(["chunk_id", "doc_id", *TAG_COLUMNS]).limit(None).to_list()
    documents: dict[str, dict[str, Any]] = {}
    for row in rows:
        documents.setdefault(row["doc_id"], {})[row["chunk_id"]] = {c: row[c] for c in TAG_COLUMNS}
    return {"ids": [row["chunk_id"] for row in rows], "documents": documents}


@pytest.fixture(scope="module")
def crash_input(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> dict[str, Any]:
    """The JSONL to ingest, an empty warehouse under the demo policy to copy, and the state a
    complete ingest leaves (with how long it takes)."""
    folder = tmp_path_factory.mktemp("crash")
    corpus = folder / "corpus.jsonl"
    records = [document(f"doc-{i}", 0) | {"acl": {"allow": ["group:finance"] if i % 2 else ["group:staff"]}}
               for i in range(DOCUMENTS)]  # fmt: skip
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    empty = folder / "empty"
    with Warehouse(Settings(warehouse=str(empty)), embedder=embedder) as warehouse:  # its receipt folded before the copy
        warehouse.install_policy(policy_file("demo.csv"))
    shutil.copytree(empty, folder / "complete")
    complete = Warehouse(Settings(warehouse=str(folder / "complete"), write_batch_docs=BATCH_DOCS,
                                  embed_window_docs=BATCH_DOCS), embedder=embedder)  # fmt: skip
    started = time.perf_counter()
    assert complete.ingest(corpus).ok
    return {"corpus": corpus, "empty": empty, "seconds": time.perf_counter() - started, "complete": _state(complete)}


def _kill_during_ingest(uri: str, corpus: Path, delay: float) -> bool:
    """Start an ingest process, SIGKILL it ``delay`` seconds after it is ready; whether it died first."""
    process = subprocess.Popen([sys.executable, "-c", KILLED_INGEST, uri, str(corpus), str(BATCH_DOCS)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    assert process.stdout is not None
    with process.stdout:
        assert process.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(60)
    return process.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def killed_runs(crash_input: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[str, bool, int]]:
    """Every seeded run, three at a time: seed -> (its warehouse, whether the kill came mid-ingest,
    how many documents it held just after the kill)."""
    folder = tmp_path_factory.mktemp("killed")

    def run(seed: int) -> tuple[str, bool, int]:
        uri = str(folder / f"warehouse-{seed}")
        shutil.copytree(crash_input["empty"], uri)
        delay = random.Random(seed).uniform(0, crash_input["seconds"] * 1.3)
        killed = _kill_during_ingest(uri, crash_input["corpus"], delay)
        return uri, killed, len(_state(Warehouse(Settings(warehouse=uri)))["documents"])

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(range(RUNS), pool.map(run, range(RUNS)), strict=True))


class RememberingEmbedder(Embedder):
    """The real model, asked once per text: the twenty reruns embed the same chunks again."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, Any] = {}

    def encode(self, texts: list[str]) -> Any:
        new = [t for t in dict.fromkeys(texts) if t not in self.seen]
        self.seen.update(zip(new, super().encode(new), strict=True))
        return np.stack([self.seen[t] for t in texts]) if texts else super().encode([])


@pytest.fixture(scope="module")
def rerun_embedder(embedder: Embedder) -> RememberingEmbedder:
    remembering = RememberingEmbedder()
    remembering.model = embedder.model  # the session's model, already loaded
    return remembering


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(RUNS))
def test_an_ingest_killed_at_a_random_point_leaves_whole_documents_and_a_rerun_completes(
    crash_input: dict[str, Any], killed_runs: dict[int, tuple[str, bool, int]], rerun_embedder: Embedder, seed: int
):
    uri, _, _ = killed_runs[seed]

    warehouse = Warehouse(Settings(warehouse=uri, write_batch_docs=BATCH_DOCS), embedder=rerun_embedder)
    state, complete = _state(warehouse), crash_input["complete"]
    assert len(state["ids"]) == len(set(state["ids"])), "a chunk id is duplicated"
    for doc_id, chunks in state["documents"].items():
        assert chunks == complete["documents"][doc_id], f"{doc_id} is half written or wrongly tagged"
    for subject in ("user:dave", "user:frank"):  # staff, not finance: only the even documents, and only whole ones
        for hit in warehouse.search("ledger budget forecast round", subject=subject, tenant="acme", k=100):
            assert hit.doc_id in state["documents"] and int(hit.doc_id.split("-")[1]) % 2 == 0, hit.doc_id

    assert warehouse.ingest(crash_input["corpus"]).ok  # the same job again finishes it
    assert _state(warehouse)["documents"] == complete["documents"]


@pytest.mark.slow
def test_most_seeded_runs_were_killed_mid_ingest_not_after_it(killed_runs: dict[int, tuple[str, bool, int]]):
    """The kill points fall while the ingest runs, and many between its commits: otherwise the
    runs above prove little."""
    killed = [mid for _, mid, _ in killed_runs.values()]
    assert sum(killed) >= RUNS * 0.7, killed
    written = [present for _, _, present in killed_runs.values()]
    partial = [n for n in written if 0 < n < DOCUMENTS]
    print(f"\ndocuments present after each of {RUNS} kills (of {DOCUMENTS}): {written}")
    assert len(partial) >= RUNS // 4, f"documents present after each kill: {written}"
