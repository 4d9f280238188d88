"""Words for people: counts with the noun in the number they take ("1 result", "2 results")."""

from __future__ import annotations

__all__ = ["plural"]


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``count`` with ``noun`` (one) or ``nouns`` (default: ``noun`` + "s") for any other count."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"
