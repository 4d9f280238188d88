"""The analyser of the ``text`` index: LanceDB's own tokenizer with the options the index is built
with (``FTS()``), so terms computed outside Lance are what Lance's index makes of the text."""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import lancedb
from lancedb.index import FTS

from ..errors import ConfigurationError

ANALYZER: dict[str, Any] = {
    name: getattr(FTS(), name) for name in inspect.signature(lancedb.tokenize).parameters if name != "query"
}
"""The options of the analyser the ``text`` index is built with (``Store`` indexes it with ``FTS()``)."""
WORDS_PER_CALL = 8192
CHARACTERS_PER_CALL = 1 << 20  # and no call longer than this, however long the words
_SEPARATOR = "zqxragwardenzqx"
_JOINER = f" {_SEPARATOR} "

if ANALYZER["base_tokenizer"] not in ("simple", "whitespace"):  # pragma: no cover - a new LanceDB default
    raise ConfigurationError(f"lexical ranking splits text at spaces first, which {ANALYZER['base_tokenizer']!r} may not")
if [token.text for token in lancedb.tokenize(_SEPARATOR, **ANALYZER)] != [_SEPARATOR]:  # pragma: no cover
    raise ConfigurationError(f"the separator word {_SEPARATOR!r} is not a term of its own for LanceDB's analyser")


def terms_of_words(words: Sequence[str]) -> list[list[str]]:
    """LanceDB's analyser on each word (a run of text without spaces).

    A call has a fixed cost besides its text, so words go many to a call, joined by a separator
    word, and the terms are cut apart again at the separator's own term. The separator yields
    exactly one term and no word yields part of it (spaces bound both), so the cut is exact
    unless a word yields the separator's term itself: such a batch is analysed word by word."""
    terms: list[list[str]] = []
    for batch in _batches(words):
        runs: list[list[str]] = [[]]
        for token in lancedb.tokenize(_JOINER.join(batch), **ANALYZER):
            if token.text == _SEPARATOR:
                runs.append([])
            else:
                runs[-1].append(token.text)
        if len(runs) != len(batch):
            runs = [[token.text for token in lancedb.tokenize(word, **ANALYZER)] for word in batch]
        terms.extend(runs)
    return terms


def _batches(words: Sequence[str]) -> Iterator[Sequence[str]]:
    """``words`` in order, at most ``WORDS_PER_CALL`` and about ``CHARACTERS_PER_CALL`` to a batch."""
    start, size = 0, 0
    for end, word in enumerate(words):
        if end > start and (end - start == WORDS_PER_CALL or size + len(word) > CHARACTERS_PER_CALL):
            yield words[start:end]
            start, size = end, 0
        size += len(word) + len(_JOINER)
    if start < len(words):
        yield words[start:]
