"""What the doors of one warehouse share: where it is, how to tell which of its files are damaged,
and the versions the current request is pinned to.

A door (``chunks``, ``sources``, ``registries``, ``policies``, ``maintenance``) is handed its own
tables and this, never the ``Store`` that made it, so a wing handed a door reaches no other table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .freshness import Versions


@dataclass(frozen=True, kw_only=True)
class Home:
    """One warehouse, as each of its doors sees it."""

    uri: str
    damaged: Callable[[], list[str]]
    """The data files a table's current version names that are missing or damaged (for messages)."""
    pinned: Callable[[], Versions | None]
    """The versions the current request's freshness check read (``Store.pinned``), or None."""


class Door:
    """Base of a door: a failure to read or write names the warehouse and its damaged files
    (``tables.names_storage_failures`` asks ``uri`` and ``damaged_files``)."""

    def __init__(self, home: Home) -> None:
        self._home = home
        self.uri = home.uri

    def damaged_files(self) -> list[str]:
        return self._home.damaged()
