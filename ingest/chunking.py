"""Chunking by the embedding model's own tokenizer, so no chunk is truncated by the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..errors import InvalidValueError


class TokenSpans(Protocol):
    """What chunking needs of the model's tokenizer: each token's character span in a text, no
    special tokens added and nothing cut off (``Embedder.tokenizer``)."""

    def spans(self, text: str) -> list[tuple[int, int]]: ...


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """One window of a document: its position and its exact text (a slice of the original)."""

    position: int
    text: str
    start: int
    end: int


def chunk_text(text: str, tokenizer: TokenSpans, *, window: int, overlap: int) -> list[Chunk]:
    """Split ``text`` into windows of at most ``window`` tokens overlapping by ``overlap`` tokens.

    Windows are cut on token boundaries and mapped back to character offsets, so each chunk's
    text is a verbatim slice of the document.
    """
    if window < 1:
        raise InvalidValueError(f"window must be at least 1 token, got {window}")
    if not 0 <= overlap < window:
        raise InvalidValueError(f"overlap must be at least 0 and below the window ({window}), got {overlap}")
    offsets = tokenizer.spans(text)
    if not offsets:
        return []
    chunks: list[Chunk] = []
    step = window - overlap
    first = 0
    while True:
        last = min(first + window, len(offsets)) - 1
        start, end = offsets[first][0], offsets[last][1]
        chunks.append(Chunk(position=len(chunks), text=text[start:end], start=start, end=end))
        if last == len(offsets) - 1:
            return chunks
        first += step
