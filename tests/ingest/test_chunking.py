"""Chunking by the model's tokenizer: windows fit the model, overlap, and are verbatim slices."""

from __future__ import annotations

import pytest

from ragwarden.ingest.chunking import chunk_text

LONG_TEXT = " ".join(f"Sentence number {i} talks about budgets, salaries and contracts." for i in range(200))


def test_every_window_fits_the_model_and_is_a_verbatim_slice(embedder):
    window = embedder.max_tokens
    chunks = chunk_text(LONG_TEXT, embedder.tokenizer, window=window, overlap=32)
    assert len(chunks) > 3
    for chunk in chunks:
        assert LONG_TEXT[chunk.start : chunk.end] == chunk.text
        assert len(embedder.tokenizer.spans(chunk.text)) <= window
    assert [c.position for c in chunks] == list(range(len(chunks)))


def test_windows_overlap_and_cover_the_whole_text(embedder):
    chunks = chunk_text(LONG_TEXT, embedder.tokenizer, window=64, overlap=16)
    assert chunks[0].start == 0
    assert chunks[-1].end == len(LONG_TEXT.rstrip())
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert after.start < before.end, "consecutive windows must overlap"


def test_short_text_is_one_chunk_and_empty_text_none(embedder):
    (only,) = chunk_text("A short note.", embedder.tokenizer, window=254, overlap=32)
    assert only.text == "A short note."
    assert chunk_text("   ", embedder.tokenizer, window=254, overlap=32) == []


@pytest.mark.parametrize(("window", "overlap"), [(0, 0), (10, 10), (10, -1)])
def test_impossible_window_settings_are_refused(embedder, window, overlap):
    with pytest.raises(ValueError):
        chunk_text("text", embedder.tokenizer, window=window, overlap=overlap)
