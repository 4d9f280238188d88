"""What both framework retrievers check of their search arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidRequestError
from ..retrieval.search import MAX_K

DEFAULT_K = 4
FRAMEWORK_KWARGS = frozenset({"verbose", "run_id"})  # LangChain passes these through; they are its own


def check_k(k: object) -> int:
    """``k`` if it is a whole number the search accepts; else an error naming it."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise InvalidRequestError(f"k must be a whole number from 1 to {MAX_K}, not {k!r}")
    return k


def requested_k(default: int, kwargs: Mapping[str, Any]) -> int:
    """``k`` for one call: the call's own ``k`` if it passes one, else the retriever's; any other
    keyword is refused by name rather than ignored."""
    unknown = sorted(set(kwargs) - {"k", *FRAMEWORK_KWARGS})
    if unknown:
        raise InvalidRequestError(
            f"unknown search argument(s) {', '.join(unknown)}: only k may be passed per call "
            "(a filter is the retriever's: filter= or search_kwargs)"
        )
    return check_k(kwargs.get("k", default))
