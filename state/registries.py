"""The clause and label registries' door: clause token -> principals, and every label a row has
carried.

Tokens and labels are registered before any row carrying them is committed, so a compiled filter
can name them; each registry is re-read only when its table has a new version (the request's
pinned one inside ``Store.pinned``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .commit_retry import retrying_conflicts
from .home import Door, Home
from .schema import CLAUSES_SCHEMA, LABELS_SCHEMA
from .tables import names_storage_failures


@dataclass(frozen=True, kw_only=True)
class Registries:
    """What a search compiles and checks against: the clause and label registries' version
    (``RegistryReads.version``) and the clause registry at it."""

    version: str
    clauses: Mapping[str, tuple[str, ...]]


def _registry_version(clauses: int, labels: int) -> str:
    return f"{clauses}.{labels}"


@names_storage_failures
class RegistryReads(Door):
    """Reads of the ``acl_clauses`` and ``labels`` tables: what a search compiles against."""

    def __init__(self, home: Home, *, clauses: Any, labels: Any) -> None:
        super().__init__(home)
        self._clauses = clauses
        self._labels = labels
        self._lock = threading.Lock()
        self._clause_cache: tuple[int, dict[str, tuple[str, ...]]] = (-1, {})
        self._label_cache: tuple[int, frozenset[str]] = (-1, frozenset())

    def _clauses_version(self) -> int:
        pin = self._home.pinned()
        return pin.clauses if pin is not None else int(self._clauses.version)

    def _labels_version(self) -> int:
        pin = self._home.pinned()
        return pin.labels if pin is not None else int(self._labels.version)

    def clauses(self) -> dict[str, tuple[str, ...]]:
        """Clause token -> principals, re-read only when the registry has a new version."""
        return self._clauses_at(self._clauses_version())

    def current(self) -> Registries:
        """The registries' version and the clause registry, read once for a whole search."""
        clauses, labels = self._clauses_version(), self._labels_version()
        return Registries(version=_registry_version(clauses, labels), clauses=self._clauses_at(clauses))

    def version(self) -> str:
        """Changes whenever a clause token or a label is registered (part of every filter cache key)."""
        return _registry_version(self._clauses_version(), self._labels_version())

    def _clauses_at(self, version: int) -> dict[str, tuple[str, ...]]:
        with self._lock:
            if self._clause_cache[0] == version:
                return self._clause_cache[1]
        rows = self._clauses.to_arrow().to_pylist()
        registry = {row["token"]: tuple(row["principals"]) for row in rows}
        with self._lock:
            self._clause_cache = (version, registry)
        return registry

    def labels(self) -> frozenset[str]:
        """Every label a row has carried, re-read only when the registry has a new version."""
        version = self._labels_version()
        with self._lock:
            if self._label_cache[0] == version:
                return self._label_cache[1]
        labels = frozenset(self._labels.to_arrow().column("label").to_pylist())
        with self._lock:
            self._label_cache = (version, labels)
        return labels


@names_storage_failures
class RegistryTables(RegistryReads):
    """Reads and registrations: a writer registers a row's clause tokens and labels before it
    commits the row."""

    def register_clauses(self, clauses: Mapping[str, Iterable[str]]) -> None:
        """Record new clause tokens; existing ones are left as they are (tokens are content hashes)."""
        known = self.clauses()
        new = [{"token": t, "principals": sorted(p)} for t, p in clauses.items() if t not in known]
        if new:
            rows = pa.Table.from_pylist(new, schema=CLAUSES_SCHEMA)
            merge = self._clauses.merge_insert("token").when_not_matched_insert_all()
            retrying_conflicts(lambda: merge.execute(rows), what="registering ACL clauses")

    def register_labels(self, labels: Iterable[str]) -> None:
        """Record labels before any row carrying them is written, so a filter can name them."""
        new = sorted(set(labels) - self.labels())
        if new:
            rows = pa.Table.from_pydict({"label": new}, schema=LABELS_SCHEMA)
            merge = self._labels.merge_insert("label").when_not_matched_insert_all()
            retrying_conflicts(lambda: merge.execute(rows), what="registering labels")
