"""Warehouses built once per test process and handed to each test as a copy of its own.

Building a warehouse (a policy installed, documents embedded and committed, indexes trained)
costs far more than copying its folder, and dozens of tests start from the same one. A copy is
exactly the state the build left, on disk: the test may change it as it likes. What a copy does
not share is the building process's memory, so a copy's first writer starts an audit chain of its
own, as any new process on the warehouse would.

The build's warehouse is closed before its folder is first copied: its audit journal is folded
into the table and nothing of it runs in the background while the folder is read.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

Builder = Callable[[Path], None]
"""Writes a warehouse into an empty folder, and closes what it opened there."""


class Built:
    """Warehouses built in ``root``, each the first time a test asks for it by name."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def copy(self, name: str, build: Builder, to: Path) -> str:
        """A copy at ``to`` (which must not exist yet) of the warehouse ``build`` writes, built
        under ``name`` the first time; its URI. One name, one builder: the name is the cache key."""
        original = self._root / name
        if not original.exists():
            building = self._root / f"{name}.building"
            shutil.rmtree(building, ignore_errors=True)  # a build that failed before: never copied
            build(building)
            building.rename(original)
        shutil.copytree(original, to)
        return str(to)
