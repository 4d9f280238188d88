"""Distributed ingest on Ray Data: an actor pool chunks and embeds, the driver commits.

Each changed document goes to ``map_batches`` whole; an actor (on a GPU when the cluster has one)
cuts it into chunks with the same tokenizer and ids as a local ingest and embeds them. The driver
gathers a document's chunks and commits a batch only when every document in it is complete, in
one commit through the same ``DocumentWriter``: same tags, lineage and receipts, and a failed
worker leaves no half-written document (Ray retries its task; if it cannot, the run fails with the
batches already committed whole and the rest absent).

Ray is an optional extra (``pip install ragwarden[ray]``). The cluster is ``RAY_ADDRESS`` when set,
else a local one this process starts on 127.0.0.1's node, with no dashboard and no usage reports.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigurationError, RagwardenError
from .chunking import Chunk
from .records import SourceRecord
from .writer import BatchResult, DocumentWriter, chunk_document

ROWS_PER_TASK = 8  # documents per map_batches call: enough to fill the model's batches, small enough to spread


@dataclass(frozen=True, kw_only=True)
class EmbedderSpec:
    """How each actor builds its embedder (the settings a warehouse's embedder has)."""

    backend: str
    device: str
    batch_size: int | None
    cache_dir: str | None
    overlap: int


class ChunkAndEmbed:
    """A Ray actor: loads the model once, then chunks and embeds the documents of each batch."""

    def __init__(self, spec: EmbedderSpec) -> None:
        from ..embedder import Embedder

        self.spec = spec
        self.embedder = Embedder(device=spec.device, batch_size=spec.batch_size, backend=spec.backend, cache_dir=spec.cache_dir)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        columns: dict[str, list[Any]] = defaultdict(list)
        window, tokenizer = self.embedder.max_tokens, self.embedder.tokenizer
        for n, text, tenant, doc_id in zip(batch["n"], batch["text"], batch["tenant"], batch["doc_id"], strict=True):
            chunks = chunk_document(str(text), tenant=str(tenant), doc_id=str(doc_id), tokenizer=tokenizer,
                                    window=window, overlap=self.spec.overlap)  # fmt: skip
            for chunk, cid in chunks:
                row = {"n": int(n), "count": len(chunks), "position": chunk.position, "start": chunk.start,
                       "end": chunk.end, "text": chunk.text, "chunk_id": cid}  # fmt: skip
                for name, value in row.items():
                    columns[name].append(value)
        vectors = self.embedder.encode(columns["text"])
        return {**{name: np.asarray(values) for name, values in columns.items()}, "vector": vectors}


class RayEngine:
    """The ``IngestEngine`` that chunks and embeds on a Ray cluster."""

    window_docs = 1 << 62  # one dataset for the whole run: its actors load the model once

    def __init__(self, spec: EmbedderSpec, *, actors: int | None = None) -> None:
        self.spec = spec
        self.actors = actors

    def write_many(self, writer: DocumentWriter, batches: Sequence[Sequence[SourceRecord]]) -> list[BatchResult]:
        plans = [writer.decide(records) for records in batches]
        changed = [record for plan in plans for record in plan.changed]
        plan_of = [p for p, plan in enumerate(plans) for _ in plan.changed]  # document n belongs to plan_of[n]
        first = [0, *accumulate(len(plan.changed) for plan in plans)]  # plan p's documents start at first[p]
        remaining = [len(plan.changed) for plan in plans]
        chunks: dict[int, list[tuple[Chunk, str]]] = defaultdict(list)
        vectors: dict[str, list[float]] = {}
        results: list[BatchResult | None] = [None] * len(plans)

        def commit(p: int) -> None:
            ordered = [sorted(chunks.pop(n), key=lambda c: c[0].position) for n in range(first[p], first[p + 1])]
            embedded = {cid: vectors.pop(cid) for document in ordered for _, cid in document}
            results[p] = writer.commit_embedded(plans[p], ordered, embedded)

        for p, left in enumerate(remaining):
            if left == 0:  # nothing changed in this batch
                commit(p)
        if changed:
            for batch in self._chunked_and_embedded(changed):
                for row in range(len(batch["n"])):
                    n, cid = int(batch["n"][row]), str(batch["chunk_id"][row])
                    chunk = Chunk(position=int(batch["position"][row]), text=str(batch["text"][row]),
                                  start=int(batch["start"][row]), end=int(batch["end"][row]))  # fmt: skip
                    chunks[n].append((chunk, cid))
                    vectors[cid] = batch["vector"][row].tolist()
                    if len(chunks[n]) == int(batch["count"][row]):  # the document's last chunk
                        remaining[plan_of[n]] -= 1
                        if remaining[plan_of[n]] == 0:
                            commit(plan_of[n])
        missing = [p for p, result in enumerate(results) if result is None]
        if missing:
            raise RagwardenError(
                f"the Ray actors returned no chunks for some documents of batches {missing}; nothing of them was "
                "written: run the ingest again, or with engine='local' to see the failure"
            )
        return [result for result in results if result is not None]

    def _chunked_and_embedded(self, records: list[SourceRecord]) -> Any:
        ray = start_ray()
        gpus = int(ray.cluster_resources().get("GPU", 0))
        actors = self.actors or (gpus if gpus else max(1, min(4, int(ray.cluster_resources().get("CPU", 1)) // 2)))
        items = [{"n": n, "text": r.text, "tenant": r.tags.tenant, "doc_id": r.doc_id} for n, r in enumerate(records)]
        dataset = ray.data.from_items(items).map_batches(
            ChunkAndEmbed,
            fn_constructor_kwargs={"spec": self.spec},
            batch_size=ROWS_PER_TASK,
            batch_format="numpy",
            concurrency=actors,
            num_gpus=1 if gpus else 0,
        )
        return dataset.iter_batches(batch_size=None, batch_format="numpy")


def start_ray() -> Any:
    """The Ray module, connected: to ``RAY_ADDRESS`` if set, else to a local cluster started here."""
    try:
        import ray
    except ImportError:
        raise ConfigurationError("the ray engine needs Ray: pip install 'ragwarden[ray]'") from None
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage reports leave the machine
        ray.init(
            address=os.environ.get("RAY_ADDRESS") or None,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}},
        )
        ray.data.DataContext.get_current().enable_progress_bars = False
    return ray


def spec_of(settings: Any, cache_dir: Path | None) -> EmbedderSpec:
    """The embedder spec of a warehouse's settings."""
    return EmbedderSpec(
        backend=settings.embed_backend,
        device=settings.embed_device,
        batch_size=settings.embed_batch_size,
        cache_dir=str(cache_dir) if cache_dir else None,
        overlap=settings.chunk_overlap,
    )
