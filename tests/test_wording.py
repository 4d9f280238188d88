"""Counts read as English: one of a thing, any other number of things."""

from __future__ import annotations

import pytest

from ragwarden.wording import plural


@pytest.mark.parametrize(
    ("count", "noun", "nouns", "said"),
    [(1, "result", None, "1 result"), (0, "result", None, "0 results"), (2, "derived row", None, "2 derived rows"),
     (1, "time", None, "1 time"), (3, "query", "queries", "3 queries")],
)  # fmt: skip
def test_a_count_takes_the_noun_in_its_number(count: int, noun: str, nouns: str | None, said: str) -> None:
    assert plural(count, noun, nouns) == said
