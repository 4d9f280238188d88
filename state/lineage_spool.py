"""The lineage spool: every OpenLineage event waits here until a transport has taken it.

Two homes, one behaviour (``LineageSpool``). A local warehouse keeps its events as files of its own
``_lineage/spool`` folder (``FolderSpool``; or the folder ``lineage_dir`` names). A warehouse on
object storage keeps them in a table of its own, ``lineage_spool`` (``TableSpool``), so that no
host holds an event a crash or a replaced disk could lose: whichever replica flushes next delivers
what any replica spooled.

Either way an event is written whole or not at all, events are named so that they sort in the
order they were spooled, one flush at a time delivers (a folder's lock, or a lease row of the
table that a conditional commit takes), and an event the backend refuses for its content, or that
cannot be read back, is set aside for a person to look at rather than hold back those behind it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from ..governance.sql import sql_string
from .commit_retry import is_commit_conflict
from .tables import conditional_merge, declare_primary_key, names_storage_failures, open_table

log = logging.getLogger(__name__)

LINEAGE_SPOOL = "lineage_spool"
LINEAGE_SPOOL_SCHEMA = pa.schema(
    [
        pa.field("name", pa.string(), nullable=False),  # sortable time, then a uuid; LEASE for the lease
        pa.field("event", pa.string(), nullable=False),  # the event as it goes on the wire (JSON)
        pa.field("rejected", pa.string()),  # why it was set aside (null: waiting)
    ]
)
LEASE = "~lease"
"""The row of the table's flush lease (it sorts after every event's name)."""
LEASE_SECONDS = 60.0
"""How long a flush holds the lease: a flusher that dies leaves it to the next after this long."""

_clock_lock = threading.Lock()
_last_ns = 0


def sortable_now() -> str:
    """The UTC time to the nanosecond, fixed width, strictly increasing within this process."""
    global _last_ns
    with _clock_lock:
        _last_ns = max(time.time_ns(), _last_ns + 1)
        ns = _last_ns
    seconds, fraction = divmod(ns, 1_000_000_000)
    return f"{datetime.fromtimestamp(seconds, UTC):%Y%m%dT%H%M%S}.{fraction:09d}Z"


class LineageSpool(Protocol):
    """Where events wait: ``put`` returns the event's name; ``pending`` the waiting ones, oldest
    first; ``exclusive`` whether this flush may deliver (no other holds the spool)."""

    @property
    def where(self) -> str: ...
    def put(self, event: dict[str, Any]) -> str: ...
    def pending(self) -> list[str]: ...
    def read(self, name: str) -> dict[str, Any]: ...
    def remove(self, name: str) -> None: ...
    def reject(self, name: str, reason: str) -> None: ...
    def exclusive(self) -> AbstractContextManager[bool]: ...


class FolderSpool:
    """Events as files of a local folder: ``<time>Z-<uuid>.json``, written atomically (a hidden
    temporary file, fsync, ``os.replace``); those set aside go to ``../rejected/``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.rejected = folder.parent / "rejected"

    @property
    def where(self) -> str:
        return str(self.folder)

    def put(self, event: dict[str, Any]) -> str:
        """Write ``event`` durably; raises ``OSError`` when the folder cannot be written."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{sortable_now()}-{uuid.uuid4()}.json"
        temporary = self.folder / f".{path.name}.tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as handle:
                json.dump(event, handle, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
        _fsync_folder(self.folder)
        return path.name

    def pending(self) -> list[str]:
        return sorted(path.name for path in self.folder.glob("*.json")) if self.folder.is_dir() else []

    def read(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads((self.folder / name).read_text(encoding="utf-8"))
        return found

    def remove(self, name: str) -> None:
        try:
            (self.folder / name).unlink(missing_ok=True)
        except OSError as exc:  # the event was sent: a leftover file only means a duplicate later
            log.warning("lineage event %s was sent but could not be removed from the spool: %s", name, exc)

    def reject(self, name: str, reason: str) -> None:
        log.error("lineage event %s set aside in %s: %s", name, self.rejected, reason)
        try:
            self.rejected.mkdir(parents=True, exist_ok=True)
            os.replace(self.folder / name, self.rejected / name)
        except OSError as exc:
            log.error("could not set aside lineage event %s: %s", name, exc)

    @contextmanager
    def exclusive(self) -> Iterator[bool]:
        """Hold the spool's lock if no other flush (any process) holds it; yields whether it does."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder / ".flush.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            log.warning("cannot lock the lineage spool %s: %s", self.folder, exc)
            yield False
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # closing releases the lock


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@names_storage_failures
class TableSpool:
    """Events as rows of the warehouse's ``lineage_spool`` table (``db``: its LanceDB connection;
    the table is made on first use). A put is one commit; a flush first takes the lease row with a
    commit conditioned on the version it read (Lance refuses it when another flush took it since),
    and gives it back when done; a lease whose holder died expires after ``LEASE_SECONDS``."""

    def __init__(self, db: Any, uri: str) -> None:
        self._db = db
        self.uri = uri
        self._opened: Any = None

    @property
    def _table(self) -> Any:
        """The table, made on first use (a replica that never emits lineage never writes it)."""
        if self._opened is None:
            table = open_table(self._db, LINEAGE_SPOOL, LINEAGE_SPOOL_SCHEMA)
            declare_primary_key(table, "name")
            self._opened = table
        return self._opened

    @property
    def where(self) -> str:
        return f"{self.uri} ({LINEAGE_SPOOL})"

    def damaged_files(self) -> list[str]:
        """(What a storage failure names: the spool's own files are not checked one by one.)"""
        return []

    def put(self, event: dict[str, Any]) -> str:
        name = f"{sortable_now()}-{uuid.uuid4()}"
        row = {"name": name, "event": json.dumps(event, sort_keys=True), "rejected": None}
        self._table.add(pa.Table.from_pylist([row], schema=LINEAGE_SPOOL_SCHEMA))
        return name

    def pending(self) -> list[str]:
        found = self._table.to_lance().to_table(
            columns=["name"], filter=f"rejected IS NULL AND name <> {sql_string(LEASE)}"
        )
        return sorted(found.column("name").to_pylist())

    def read(self, name: str) -> dict[str, Any]:
        found = self._table.to_lance().to_table(columns=["event"], filter=f"name = {sql_string(name)}")
        if not found.num_rows:
            raise KeyError(f"lineage event {name} is no longer spooled")
        event: dict[str, Any] = json.loads(found.column("event")[0].as_py())
        return event

    def remove(self, name: str) -> None:
        self._table.delete(f"name = {sql_string(name)}")

    def reject(self, name: str, reason: str) -> None:
        log.error("lineage event %s set aside in %s: %s", name, self.where, reason)
        self._table.update(where=f"name = {sql_string(name)}", values={"rejected": reason[:2000]})

    @contextmanager
    def exclusive(self) -> Iterator[bool]:
        """Take the lease if no live flush holds it; yields whether this flush holds it."""
        holder = uuid.uuid4().hex
        if not self._lease(holder, until=time.time() + LEASE_SECONDS, taking=True):
            yield False
            return
        try:
            yield True
        finally:
            self._lease(holder, until=0.0, taking=False)

    def _lease(self, holder: str, *, until: float, taking: bool) -> bool:
        """Write the lease as ``holder``'s until ``until`` on the version read, if it is free (or
        ours, giving it back); False when another holds it or took it meanwhile."""
        planned = time.monotonic()
        dataset = self._table.to_lance()
        found = dataset.to_table(columns=["event"], filter=f"name = {sql_string(LEASE)}")
        if found.num_rows:
            held = json.loads(found.column("event")[0].as_py())
            if held["holder"] != holder and held["until"] > time.time():
                return False
            if not taking and held["holder"] != holder:
                return False
        lease = {"name": LEASE, "event": json.dumps({"holder": holder, "until": until}), "rejected": None}
        try:
            conditional_merge(dataset, "name", planned_at=planned, what="the lineage spool's lease").execute(
                pa.Table.from_pylist([lease], schema=LINEAGE_SPOOL_SCHEMA)
            )
        except Exception as exc:
            if is_commit_conflict(exc):
                return False
            raise
        return True
