"""A table's old versions, and the purge that leaves none of them holding a row the latest does
not, without blinding concurrent writers.

Why: an erasure must leave the erased text and vectors in no file, so every version older than the
erasure must lose its files. But Lance checks a commit against the commits made since the version
it was planned on by reading their records (manifests and transaction files). A record removed
under a writer that planned before it is a conflict Lance never sees: that writer's commit lands as
if the removed commit had not happened (a row updated by both is stored twice, a deleted row comes
back). So a purge removes an old version's *content* (its data files and index folders that the
latest version does not use) and keeps its record: the purges after ``RECORDS_KEPT`` drop it, and
no plan may commit after living ``tables.PLAN_LIFETIME``. A record names ids (a deletion's predicate), as
the erasure's tombstone does, never a row's text or vector.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any

from ..errors import WarehouseError
from .commit_retry import is_missing_file
from .files import WarehouseFiles

RECORDS_KEPT = timedelta(hours=1)
"""How long a purge keeps the records of the ``chunks`` and ``sources`` tables' older versions:
far beyond ``tables.PLAN_LIFETIME``, as the clocks of the hosts that stamped them may run apart."""


Folder = Callable[[str], WarehouseFiles]
"""A folder inside the table's folder, by its path there (``data``, ``_indices/<uuid>``)."""


def _content(dataset: Any) -> tuple[frozenset[str], frozenset[str]]:
    """A version's data files (names under ``data``) and index folders (uuids under ``_indices``)."""
    data = frozenset(file.path for fragment in dataset.get_fragments() for file in fragment.data_files())
    indexes = frozenset(str(segment.uuid) for index in dataset.describe_indices() for segment in index.segments)
    return data, indexes


def _earlier_versions(latest: Any, since: int | None) -> Iterator[Any]:
    """The table at each version from ``since`` (None: the oldest there is) to before ``latest``
    whose record is still there."""
    if since is None:
        numbers: Iterable[int] = sorted(
            int(v["version"]) for v in latest.versions() if int(v["version"]) < latest.version
        )
    else:
        numbers = range(since, latest.version)
    for number in numbers:
        try:
            yield latest.checkout_version(number)
        except Exception as exc:
            if not _missing_record(exc):  # a version whose record was pruned
                raise


def _missing_record(exc: BaseException) -> bool:
    """Whether ``exc`` is Lance finding no manifest for a version (and not some other missing file)."""
    return is_missing_file(exc) and "manifest" in str(exc).lower()


class EmptiedMark:
    """The latest version of a table at its last purge, kept in the warehouse's ``history``
    folder with that version's commit time: every earlier version holds no file that version
    does not use, so the next purge (or count) need only read the versions since."""

    def __init__(self, files: WarehouseFiles, table: str) -> None:
        self._files, self.table = files, table

    def since(self, latest: Any) -> int | None:
        """The version to read from: the mark, while that version's record is there and was
        committed when the mark says (None otherwise: a table restored or made again under the
        same name has other versions of that number; a pruned mark may be outlived by an older
        version whose host's clock ran ahead)."""
        raw = (self._files.get(self.table) or b"").decode(errors="replace").split()
        if len(raw) != 2 or not raw[0].isdigit() or not 0 < int(raw[0]) <= latest.version:
            return None
        try:
            marked = latest.checkout_version(int(raw[0]))
        except Exception as exc:
            if not _missing_record(exc):
                raise
            return None
        return marked.version if _stamp(marked) == raw[1] else None

    def set(self, latest: Any) -> None:
        self._files.put(self.table, f"{latest.version} {_stamp(latest)}".encode())


def _stamp(dataset: Any) -> str:
    """When the version ``dataset`` is at was committed, as its manifest says."""
    return dataset.get_version()["timestamp"].isoformat()


class _Present:
    """Which content files of a table exist beside those its ``latest`` version uses, listed once
    and asked per version."""

    def __init__(self, folder: Folder, latest: Any) -> None:
        self._folder = folder
        self._keep = _content(latest)
        self.data = set(folder("data").names())
        self._indexes: dict[str, bool] = {}

    def _index(self, uuid: str) -> bool:
        if uuid not in self._indexes:
            self._indexes[uuid] = bool(self._folder(f"_indices/{uuid}").names())
        return self._indexes[uuid]

    def beyond(self, dataset: Any) -> tuple[set[str], set[str]]:
        """The data files and index folders of ``dataset`` that are there and the latest does not use."""
        data, indexes = _content(dataset)
        keep_data, keep_indexes = self._keep
        return {n for n in data - keep_data if n in self.data}, {u for u in indexes - keep_indexes if self._index(u)}

    def remove(self, data: set[str], indexes: set[str]) -> None:
        for name in sorted(data):
            self._folder("data").remove(name)
            self.data.discard(name)
        for uuid in sorted(indexes):
            self._folder(f"_indices/{uuid}").clear()
            self._indexes[uuid] = False


def drop_superseded_content(latest: Any, folder: Folder, mark: EmptiedMark) -> int:
    """Remove every file of a version older than ``latest`` that ``latest`` does not use, keeping
    the versions' records, and move ``mark`` to ``latest``; returns how many versions held such
    files."""
    present = _Present(folder, latest)
    if latest.get_fragments() and not present.data:  # looking in the wrong place would remove nothing
        raise WarehouseError(
            f"the purge of table {mark.table!r} cannot list the data files its latest version uses; "
            "nothing was removed: check the warehouse's storage options"
        )
    dropped = 0
    for dataset in _earlier_versions(latest, mark.since(latest)):
        data, indexes = present.beyond(dataset)
        present.remove(data, indexes)
        dropped += bool(data or indexes)
    mark.set(latest)
    return dropped


def versions_left(latest: Any, folder: Folder, mark: EmptiedMark) -> int:
    """How many versions hold content: ``latest``, and each earlier one still holding a data file
    or index folder that ``latest`` does not use (one sharing all its files with ``latest`` shows
    nothing it does not)."""
    present = _Present(folder, latest)
    return 1 + sum(any(present.beyond(dataset)) for dataset in _earlier_versions(latest, mark.since(latest)))


def prune_records(latest: Any, older_than: timedelta = RECORDS_KEPT) -> int:
    """Drop the records (and any files) of versions older than ``older_than``; returns how many."""
    return int(latest.cleanup_old_versions(older_than=older_than, error_if_tagged_old_versions=False).old_versions)


__all__ = ["RECORDS_KEPT", "EmptiedMark", "drop_superseded_content", "prune_records", "versions_left"]
