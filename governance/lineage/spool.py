"""The durable spool: every lineage event is a file here until a transport has taken it.

``<spool>/<UTC time to the nanosecond>Z-<uuid>.json`` holds one event as it goes on the wire;
names sort in the order events were spooled (strictly, within a process). Files are written
atomically (a hidden temporary file, fsync, ``os.replace``), so a crash leaves either the whole
event or nothing. An event the backend refuses for its content (HTTP 400/413/415/422) or that
cannot be read back moves to ``<spool>/../rejected/`` for a person to look at, so that it does
not hold back the events behind it.
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
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from openlineage.client import event_v2

log = logging.getLogger(__name__)

_clock_lock = threading.Lock()
_last_ns = 0


def _sortable_now() -> str:
    """The UTC time to the nanosecond, fixed width, strictly increasing within this process."""
    global _last_ns
    with _clock_lock:
        _last_ns = max(time.time_ns(), _last_ns + 1)
        ns = _last_ns
    seconds, fraction = divmod(ns, 1_000_000_000)
    return f"{datetime.fromtimestamp(seconds, UTC):%Y%m%dT%H%M%S}.{fraction:09d}Z"


class Spool:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.rejected = folder.parent / "rejected"

    def put(self, event: dict[str, Any]) -> Path:
        """Write ``event`` durably; raises ``OSError`` when the folder cannot be written."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{_sortable_now()}-{uuid.uuid4()}.json"
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
        return path

    def pending(self) -> list[Path]:
        """The spooled events, oldest first."""
        return sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []

    def read(self, path: Path) -> event_v2.RunEvent:
        """The event in ``path``, rebuilt so that it serializes exactly as it was spooled."""
        return event_from_json(json.loads(path.read_text(encoding="utf-8")))

    def remove(self, path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:  # the event was sent: a leftover file only means a duplicate later
            log.warning("lineage event %s was sent but could not be removed from the spool: %s", path.name, exc)

    def reject(self, path: Path, reason: str) -> None:
        log.error("lineage event %s set aside in %s: %s", path.name, self.rejected, reason)
        try:
            self.rejected.mkdir(parents=True, exist_ok=True)
            os.replace(path, self.rejected / path.name)
        except OSError as exc:
            log.error("could not set aside lineage event %s: %s", path.name, exc)

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


def event_from_json(data: dict[str, Any]) -> event_v2.RunEvent:
    """A RunEvent whose facets are the spooled dictionaries, for transports that want an event
    object (the Kafka transport keys messages by job); it serializes back to ``data``."""
    run, job = data["run"], data["job"]
    event = event_v2.RunEvent(
        eventTime=data["eventTime"],
        producer=data["producer"],
        eventType=event_v2.RunState(data["eventType"]) if "eventType" in data else None,
        run=event_v2.Run(runId=run["runId"], facets=run.get("facets")),
        job=event_v2.Job(namespace=job["namespace"], name=job["name"], facets=job.get("facets")),
        inputs=_datasets(data, "inputs", event_v2.InputDataset, "inputFacets"),
        outputs=_datasets(data, "outputs", event_v2.OutputDataset, "outputFacets"),
    )
    event.schemaURL = data["schemaURL"]
    return event


def _datasets(data: dict[str, Any], key: str, kind: type, extra: str) -> list[Any] | None:
    if key not in data:
        return None
    return [
        kind(namespace=d["namespace"], name=d["name"], facets=d.get("facets"), **{extra: d.get(extra)})
        for d in data[key]
    ]
