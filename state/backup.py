"""Backups of a warehouse, and restores: from a backup, or to a moment of the warehouse's own history.

A backup is a copy of every table at one version each (Lance's deep clone of a version pinned by a
tag while it is copied), taken in an order that leaves the copies consistent while other processes
write: ``sources`` before ``chunks`` (their records are written after their rows), the registries
after ``chunks`` (a writer registers before it commits), the audit checkpoints before the journal
and the journal before the receipts (a receipt a checkpoint binds is then in the copy). Receipts
still in the journal are folded into the copy of the ``audit`` table, so the copy verifies alone;
the lineage files are copied beside. ``_backup/backup.json``, written last, says what was copied.

A restore into a warehouse in use brings back what it holds, never who may read it nor what was
recorded: ``chunks`` and ``sources`` become the backup's (or their own versions as of a moment) as
new versions, so every version number keeps moving forward and no cache keyed by one is fooled;
the registries gain what the backup registered; the audit log, its checkpoints and journal, the
erasure marks, the policies, the API keys, the directory and the lineage files are left as they
are. A restore into an empty location copies every table as the backup holds it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import lance
import pyarrow as pa

from ..errors import InvalidRequestError, WarehouseError
from .audit_journal import ReceiptJournal
from .commit_retry import is_missing_file, retrying_conflicts
from .files import LINEAGE_EVENTS, warehouse_files
from .maintenance import Maintenance
from .registries import RegistryTables
from .schema import AUDIT, AUDIT_CHECKPOINTS, AUDIT_SEALS, CHUNKS, CLAUSES, LABELS, SOURCES
from .tables import connect, local_path, names_storage_failures

BACKUP_FORMAT = "ragwarden-backup/1"
MANIFEST_FOLDER = "_backup"
MANIFEST_NAME = "backup.json"

ROLLED_BACK = (SOURCES, CHUNKS)
"""The tables a restore in place brings back: what the warehouse holds, rows and their source records."""

MERGED = (CLAUSES, LABELS)
"""The registries a restore in place adds the backup's entries to: extra entries are harmless."""

FILE_FOLDERS = (LINEAGE_EVENTS, "_lineage/spool")
"""Plain files copied with the tables: the lineage events and the spool of those not yet sent."""

CLONE_ATTEMPTS = 3
"""Copies of one table tried: an erasure's purge may remove the files of the version being copied
(it spares no older version), and the next attempt copies the version that erasure left."""

ERASURE_SLACK = timedelta(minutes=10)
"""How long before the restored point a restore looks for erasures to apply again: receipts are
stamped by their writers' clocks, which differ. Applying one too many finds nothing to erase (or,
for an item erased and then restored on purpose just before the point, erases it: failing closed)."""

_FIRST = (SOURCES, CHUNKS, CLAUSES, LABELS)
_LAST = (AUDIT_CHECKPOINTS, AUDIT, AUDIT_SEALS)  # a seal copied after the receipts: an archive meanwhile leaves its rows, never a cut without its seal
_CONTENT_FILES = ("data file", "deletion file", "index file")


@dataclass(frozen=True, kw_only=True)
class TableCopy:
    """One table in a backup: the warehouse's version copied, when that version was committed,
    and the rows the copy holds."""

    name: str
    version: int
    committed_at: datetime
    rows: int


@dataclass(frozen=True, kw_only=True)
class Backup:
    """A backup, as its manifest describes it."""

    uri: str
    source: str
    taken_at: datetime
    tables: tuple[TableCopy, ...]
    receipts_folded: int
    files: int

    def table(self, name: str) -> TableCopy | None:
        return next((copy for copy in self.tables if copy.name == name), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": BACKUP_FORMAT,
            "uri": self.uri,
            "source": self.source,
            "taken_at": self.taken_at.isoformat(),
            "tables": {copy.name: {"version": copy.version, "committed_at": copy.committed_at.isoformat(), "rows": copy.rows}
                       for copy in self.tables},
            "receipts_folded": self.receipts_folded,
            "files": self.files,
        }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class TableRestore:
    """What a restore did to one table: its version ``before``, the version it brought back
    (``point``: of the warehouse's history, or of the backup), and the version it is at ``after``.
    ``how``: ``history`` (an earlier version made the latest again), ``backup`` (the backup's rows
    written as a new version, indexes rebuilt), ``merged`` (a registry given the backup's entries),
    ``copied`` (into an empty location, at the backup's version) or ``unchanged``."""

    name: str
    before: int
    point: int
    after: int
    how: str


@dataclass(frozen=True, kw_only=True)
class RestoreReport:
    """What a restore did: to which ``point`` (a backup, or a moment), table by table, and the
    erasures receipted since ``since`` (the point, less ``ERASURE_SLACK``) that it applied again
    (``(tenant, id)``; the face fills them)."""

    point: str
    since: datetime
    tables: tuple[TableRestore, ...]
    erasures: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "point": self.point,
            "since": self.since.isoformat(),
            "tables": {t.name: {"before": t.before, "point": t.point, "after": t.after, "how": t.how} for t in self.tables},
            "erasures_reapplied": [{"tenant": tenant, "id": item} for tenant, item in self.erasures],
        }


def table_uri(uri: str, name: str) -> str:
    return f"{uri.rstrip('/')}/{name}.lance"


def _committed_at(dataset: Any) -> datetime:
    """When the version ``dataset`` is at was committed (Lance reports the local time, unzoned)."""
    return _utc(dataset.get_version()["timestamp"])


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(timezone.utc)


def holds_warehouse(uri: str, storage_options: Mapping[str, str]) -> bool:
    """Whether ``uri`` holds any table (a location a backup may be restored into holds none)."""
    folder = local_path(uri)
    if folder is not None and not folder.is_dir():
        return False
    return bool(connect(uri, storage_options).list_tables().tables)


def _holds_anything(uri: str, storage_options: Mapping[str, str]) -> bool:
    folder = local_path(uri)
    if folder is not None:
        return folder.is_dir() and any(folder.iterdir())
    return holds_warehouse(uri, storage_options) or _manifest_files(uri, storage_options).get(MANIFEST_NAME) is not None


def _manifest_files(uri: str, storage_options: Mapping[str, str]) -> Any:
    files = warehouse_files(uri, storage_options, MANIFEST_FOLDER)
    if files is None:
        raise InvalidRequestError(f"{uri!r} is neither a folder nor an S3 prefix: a backup lives in one")
    return files


def read_backup(uri: str, storage_options: Mapping[str, str]) -> Backup:
    """The backup at ``uri``, from its manifest; refused when there is none (not a backup, or one
    whose copy did not finish: the manifest is written last)."""
    raw = _manifest_files(uri, storage_options).get(MANIFEST_NAME)
    if raw is None:
        raise InvalidRequestError(
            f"{uri!r} holds no complete backup (no {MANIFEST_FOLDER}/{MANIFEST_NAME}; it is written last): "
            "name a folder or prefix `ragwarden backup` finished"
        )
    try:
        found = json.loads(raw)
        made = found.get("format")
    except (ValueError, AttributeError) as exc:
        raise InvalidRequestError(f"{uri!r}: its backup manifest cannot be read ({exc})") from None
    if made != BACKUP_FORMAT:
        raise InvalidRequestError(
            f"{uri!r}: a backup of format {made!r}, not {BACKUP_FORMAT!r}: restore it with the release that made it"
        )
    try:
        tables = tuple(TableCopy(name=name, version=int(t["version"]), committed_at=datetime.fromisoformat(t["committed_at"]),
                                 rows=int(t["rows"])) for name, t in found["tables"].items())  # fmt: skip
        return Backup(uri=uri, source=found["source"], taken_at=datetime.fromisoformat(found["taken_at"]), tables=tables,
                      receipts_folded=int(found["receipts_folded"]), files=int(found["files"]))  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidRequestError(f"{uri!r}: its backup manifest cannot be read ({exc})") from None


def _copy_files(source: str, target: str, storage_options: Mapping[str, str]) -> int:
    """Copy the plain files of ``FILE_FOLDERS`` (hidden ones, locks, left out); returns how many."""
    copied = 0
    for folder in FILE_FOLDERS:
        found, into = warehouse_files(source, storage_options, folder), warehouse_files(target, storage_options, folder)
        if found is None or into is None:
            continue
        for name in sorted(found.names()):
            data = None if name.startswith(".") else found.get(name)
            if data is not None:
                into.put(name, data)
                copied += 1
    return copied


def _clone(dataset: Any, target: str, storage_options: Mapping[str, str], *, pin: bool) -> Any:
    """Lance's deep clone of ``dataset`` at its version into ``target``; with ``pin``, the version
    is tagged while it is copied (no prune removes a tagged version's files). A backup is never
    pinned when restored from: it is only read."""
    options = dict(storage_options) or None
    if not pin:
        return dataset.deep_clone(target, dataset.version, storage_options=options)
    tag = f"backup-{uuid.uuid4().hex}"
    dataset.tags.create(tag, dataset.version)
    try:
        return dataset.deep_clone(target, dataset.version, storage_options=options)
    finally:
        dataset.tags.delete(tag)


def _clear(uri: str, storage_options: Mapping[str, str], name: str) -> None:
    files = warehouse_files(uri, storage_options, f"{name}.lance")
    if files is not None:
        files.clear()


def _version_files(dataset: Any) -> dict[int, set[str]]:
    """The content files (data, deletions, indexes) each kept version of ``dataset`` names."""
    oldest = min(int(v["version"]) for v in dataset.versions())
    named: dict[int, set[str]] = {}
    for row in dataset.tracked_files(min_version=oldest).read_all().to_pylist():
        named.setdefault(int(row["version"]), set())
        if row["type"] in _CONTENT_FILES:
            named[int(row["version"])].add(row["path"])
    return named


def _intact_versions(dataset: Any) -> dict[int, datetime]:
    """The kept versions of ``dataset`` whose every content file is still there, with their commit
    times: an erasure's purge removes the files of every older version (``history``), keeping the
    version's record for an hour; such a version can no longer be made the latest again."""
    present = set(dataset.all_files().read_all().column("path").to_pylist())
    named = _version_files(dataset)
    times = {int(v["version"]): _utc(v["timestamp"]) for v in dataset.versions()}
    return {version: times[version] for version, files in named.items() if version in times and files <= present}


@names_storage_failures
class Backups:
    """Backups of the warehouse at ``uri``, and restores into it (``state`` module docstring)."""

    def __init__(
        self, uri: str, *, storage_options: Mapping[str, str], registries: RegistryTables, maintenance: Maintenance
    ) -> None:
        self.uri = uri
        self._options: Mapping[str, str] = dict(storage_options)
        self._registries = registries
        self._maintenance = maintenance

    def damaged_files(self) -> list[str]:
        return self._maintenance.damaged_files()

    def _dataset(self, name: str) -> Any:
        return lance.dataset(table_uri(self.uri, name), storage_options=dict(self._options) or None)

    # -- taking a backup ------------------------------------------------------------------

    def take(self, destination: str) -> Backup:
        """Copy the warehouse to ``destination``, a folder or S3 prefix that must hold nothing yet."""
        destination = destination.rstrip("/")
        if destination == self.uri.rstrip("/"):
            raise InvalidRequestError("a backup cannot be taken into the warehouse itself: name another folder or prefix")
        if _holds_anything(destination, self._options):
            raise InvalidRequestError(f"backup destination {destination!r} is not empty: name a new folder or prefix")
        manifest = _manifest_files(destination, self._options)
        taken_at = datetime.now(timezone.utc)
        present = set(connect(self.uri, self._options, create=False).list_tables().tables)
        order = [*(n for n in _FIRST if n in present), *sorted(present - {*_FIRST, *_LAST}), *(n for n in _LAST if n in present)]
        copies, folded = [], 0
        for name in order:
            unfolded = self._unfolded_receipts() if name == AUDIT else None
            copy = self._copy(name, destination)
            if unfolded is not None and unfolded.num_rows:
                folded, copy = self._fold_into(destination, copy, unfolded)
            copies.append(copy)
        files = _copy_files(self.uri, destination, self._options)
        backup = Backup(uri=destination, source=self.uri, taken_at=taken_at, tables=tuple(copies), receipts_folded=folded,
                        files=files)  # fmt: skip
        manifest.put(MANIFEST_NAME, json.dumps(backup.as_dict(), indent=2).encode("utf-8"))
        return backup

    def _copy(self, name: str, destination: str) -> TableCopy:
        for attempt in range(1, CLONE_ATTEMPTS + 1):
            dataset = self._dataset(name)
            try:
                clone = _clone(dataset, table_uri(destination, name), self._options, pin=True)
            except Exception as exc:
                if attempt == CLONE_ATTEMPTS or not is_missing_file(exc):
                    raise
                _clear(destination, self._options, name)  # a purge took the version's files: copy the next
                continue
            return TableCopy(name=name, version=dataset.version, committed_at=_committed_at(dataset), rows=clone.count_rows())
        raise WarehouseError(f"table {name!r} could not be copied")  # not reached: the last attempt raises

    def _unfolded_receipts(self) -> pa.Table | None:
        """Receipts still in the journal (read before the table, so one folded meanwhile is in the copy)."""
        journal = ReceiptJournal.of(self.uri, self._options)
        return journal.read(journal.files()).rows if journal is not None else None

    def _fold_into(self, destination: str, copy: TableCopy, unfolded: pa.Table) -> tuple[int, TableCopy]:
        """Add to the copy of the receipts those of ``unfolded`` it lacks; returns how many, and the copy."""
        dataset = lance.dataset(table_uri(destination, AUDIT), storage_options=dict(self._options) or None)
        before = dataset.count_rows()
        dataset.merge_insert("receipt_id").when_not_matched_insert_all().execute(unfolded)
        after = dataset.count_rows()
        return after - before, TableCopy(name=AUDIT, version=copy.version, committed_at=copy.committed_at, rows=after)

    # -- restoring in place -----------------------------------------------------------------

    def read(self, backup: str) -> Backup:
        """The backup at ``backup`` (on this warehouse's store), from its manifest (``read_backup``)."""
        return read_backup(backup.rstrip("/"), self._options)

    def restore_backup(self, backup: Backup) -> RestoreReport:
        """Bring ``chunks`` and ``sources`` back to the backup's versions, as new versions: from the
        warehouse's own history where that version is still whole there (the same commit), else
        from the backup's copy (indexes rebuilt); the registries gain the backup's entries."""
        plans = []
        for name in ROLLED_BACK:
            copy = backup.table(name)
            if copy is None:
                raise InvalidRequestError(f"backup {backup.uri!r} holds no table {name!r}: it is not a backup of a warehouse")
            live = self._dataset(name)
            kept = _intact_versions(live).get(copy.version)
            plans.append((name, live, copy, kept == copy.committed_at))
        done = []
        for name, live, copy, in_history in plans:
            if in_history:
                done.append(self._from_history(name, live, copy.version))
            else:
                done.append(self._from_backup(name, live, backup, copy))
        done += [self._merge_registry(name, backup) for name in MERGED if backup.table(name) is not None]
        if any(step.how == "backup" for step in done):
            self._maintenance.optimize()  # the indexes of what was written anew
        return RestoreReport(point=f"backup {backup.uri} (taken {backup.taken_at.isoformat()})",
                             since=backup.taken_at - ERASURE_SLACK, tables=tuple(done))  # fmt: skip

    def restore_history(self, moment: datetime) -> RestoreReport:
        """Bring ``chunks`` and ``sources`` back to their latest versions committed at or before
        ``moment``, as new versions. Refused, changing nothing, when a table has no such version
        still whole (an erasure since emptied it): the message names the restorable window."""
        if moment.tzinfo is None:
            raise InvalidRequestError(f"a restore time needs a time zone (UTC: {moment.isoformat()}Z), got {moment.isoformat()}")
        plans = []
        for name in ROLLED_BACK:
            live = self._dataset(name)
            versions = {int(v["version"]): _utc(v["timestamp"]) for v in live.versions()}
            chosen = max((v for v, at in versions.items() if at <= moment), default=None)
            intact = _intact_versions(live)
            if chosen is None or chosen not in intact:
                raise InvalidRequestError(_outside_window(name, moment, chosen, intact))
            plans.append((name, live, chosen))
        done = [self._from_history(name, live, chosen) for name, live, chosen in plans]
        return RestoreReport(point=f"the warehouse as of {moment.isoformat()}", since=moment - ERASURE_SLACK,
                             tables=tuple(done))  # fmt: skip

    def _from_history(self, name: str, live: Any, version: int) -> TableRestore:
        if version == live.version:
            return TableRestore(name=name, before=live.version, point=version, after=live.version, how="unchanged")
        retrying_conflicts(lambda: self._dataset(name).checkout_version(version).restore(), what=f"restoring {name}")
        return TableRestore(name=name, before=live.version, point=version, after=self._dataset(name).version, how="history")

    def _from_backup(self, name: str, live: Any, backup: Backup, copy: TableCopy) -> TableRestore:
        source = lance.dataset(table_uri(backup.uri, name), storage_options=dict(self._options) or None)
        rows = source.scanner().to_reader()
        written = lance.write_dataset(rows, table_uri(self.uri, name), schema=source.schema, mode="overwrite",
                                      storage_options=dict(self._options) or None)  # fmt: skip
        return TableRestore(name=name, before=live.version, point=copy.version, after=written.version, how="backup")

    def _merge_registry(self, name: str, backup: Backup) -> TableRestore:
        before = self._dataset(name).version
        rows = lance.dataset(table_uri(backup.uri, name), storage_options=dict(self._options) or None).to_table().to_pylist()
        if name == CLAUSES:
            self._registries.register_clauses({row["token"]: row["principals"] for row in rows})
        else:
            self._registries.register_labels(row["label"] for row in rows)
        copy = backup.table(name)
        after = self._dataset(name).version
        return TableRestore(name=name, before=before, point=copy.version if copy else 0, after=after,
                            how="merged" if after != before else "unchanged")  # fmt: skip


def _outside_window(name: str, moment: datetime, chosen: int | None, intact: Mapping[int, datetime]) -> str:
    """Why table ``name`` cannot be brought back to ``moment``, with the window it can be."""
    since = _window_start(intact)
    window = f"its history is restorable from {since.isoformat()}" if since else "it keeps no restorable history"
    if chosen is None:
        why = "it has no version kept from then"
    else:
        why = f"version {chosen}, its latest at that time, was emptied by an erasure's purge"
    return (f"cannot restore table {name!r} to {moment.isoformat()}: {why}; {window} (every erasure empties the "
            "versions before it). Restore a backup taken before then instead (`ragwarden restore --from BACKUP`), "
            "which applies the erasures made since again")  # fmt: skip


def _window_start(intact: Mapping[int, datetime]) -> datetime | None:
    """When the unbroken run of whole versions up to the latest begins."""
    run: list[int] = []
    for version in sorted(intact, reverse=True):
        if run and version != run[-1] - 1:
            break
        run.append(version)
    return intact[run[-1]] if run else None


def restore_new(uri: str, storage_options: Mapping[str, str], backup_uri: str) -> RestoreReport:
    """Copy every table of the backup at ``backup_uri`` into ``uri``, which must hold no warehouse,
    at the backup's versions (version numbers kept), and the lineage files beside them."""
    backup = read_backup(backup_uri, storage_options)
    if holds_warehouse(uri, storage_options):
        raise InvalidRequestError(f"{uri!r} holds a warehouse: restore into it in place, or name an empty location")
    options = dict(storage_options) or None
    done = []
    for copy in _ordered(backup.tables):
        source = lance.dataset(table_uri(backup.uri, copy.name), storage_options=options)
        clone = _clone(source, table_uri(uri, copy.name), storage_options, pin=False)
        done.append(TableRestore(name=copy.name, before=0, point=copy.version, after=clone.version, how="copied"))
    _copy_files(backup.uri, uri, storage_options)
    return RestoreReport(point=f"backup {backup.uri} (taken {backup.taken_at.isoformat()})",
                         since=backup.taken_at - ERASURE_SLACK, tables=tuple(done))  # fmt: skip


def _ordered(copies: Iterable[TableCopy]) -> list[TableCopy]:
    """``chunks`` last: its presence marks a complete warehouse (``Store``)."""
    return sorted(copies, key=lambda copy: copy.name == CHUNKS)


__all__ = [
    "BACKUP_FORMAT",
    "ERASURE_SLACK",
    "Backup",
    "Backups",
    "RestoreReport",
    "TableCopy",
    "TableRestore",
    "holds_warehouse",
    "read_backup",
    "restore_new",
]
