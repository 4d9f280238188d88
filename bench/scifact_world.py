"""The benchmark's world over real embeddings: SciFact's 5,183 abstracts and its 300 judged test
queries, embedded by the packaged model (once; kept in the work folder), under the synthetic
access structure of ``world.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ragwarden.config import Settings
from ragwarden.embedder import Embedder

from . import scifact
from .world import World, from_embeddings


def scifact_world(folder: Path, workdir: Path, *, log=print) -> World:  # type: ignore[no-untyped-def]
    """The SciFact world; its embeddings are computed on first use and kept in ``workdir``."""
    cache = workdir / "scifact-embeddings.npz"
    if cache.exists():
        saved = np.load(cache, allow_pickle=False)
        ids, vectors, query_vectors = saved["ids"].tolist(), saved["vectors"], saved["queries"]
    else:
        embedder = Embedder.from_settings(Settings())
        records = list(scifact.records(folder))
        texts, _ = scifact.judged_queries(folder)
        log(f"SciFact: embedding {len(records):,} abstracts and {len(texts)} queries")
        ids = [record["id"] for record in records]
        vectors = embedder.encode([record["text"] for record in records])
        query_vectors = embedder.encode(list(texts.values()))
        workdir.mkdir(parents=True, exist_ok=True)
        np.savez(cache, ids=np.array(ids), vectors=vectors, queries=query_vectors)
    return from_embeddings([f"scifact-{i}" for i in ids], vectors, query_vectors)
