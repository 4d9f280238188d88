"""This replica's serving index of the ``chunks`` table: when to build the resident index, from
what, and how a search uses it.

The index is built on a thread of its own the first time a search could use it (from the newest
artifact ``optimize`` stored in the warehouse, else from the table), with every row's tags and
terms beside it (``resident_state``), and again once the rows written since its version outgrow
``REBUILD_SHARE`` of it; until then searches go through Lance as before. A search at a newer
table version first moves the resident state there by the commits' delta (once per version for
the whole process, on the state's own thread), then evaluates its caller's rule over the resident
tags. Where no state can be had (a version gone), a caller's visible set is read through its
compiled filter (ids and tags, once per filter and version) and becomes a mask over the index.
Nothing here can widen what a caller sees (SECURITY.md, guarantee 36): the mask is the rule over
the tags at that version, and every hit is still post-checked.
"""

from __future__ import annotations

import atexit
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Literal

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import ipc

from ..stages import work
from ..state import TAG_COLUMNS, ChunkReads, ReadDoors
from .hits import CONTENT_COLUMNS, CURRENT_COLUMNS, RESULT_COLUMNS
from .resident import ResidentIndex, Stopped, by_tags, resident_bytes
from .resident_lexical import TermPairs
from .resident_state import ResidentState, advanced, build_state, index_terms
from .visible_rows import unit_vectors

log = logging.getLogger(__name__)

REBUILD_SHARE = 0.05
"""Visible rows the index does not hold, as a share of its rows, past which it is rebuilt."""
FRESH_MAX_ROWS = 20_000
"""At most this many rows are scored beside the index; a search needing more goes through Lance."""
_ARTIFACT = re.compile(r"chunks-(\d{12})\.faiss")

State = Literal["off", "idle", "building", "ready", "over budget", "failed"]


@dataclass(frozen=True, kw_only=True)
class ServingStatus:
    """What ``/readyz`` says of the serving index."""

    state: State
    version: int | None = None
    rows: int = 0
    bytes: int = 0
    reason: str = ""
    warm: bool = False  # its vectors read in and coded for the exact scan (``ResidentIndex.warm``)


@dataclass(frozen=True, kw_only=True)
class ResidentView:
    """One filter's rows at one table version, as the index sees them: a mask of those it holds
    with their current tags, and the others whole, with their vectors."""

    index: ResidentIndex
    allowed: np.ndarray  # (index rows,) bool: the positions visible and rankable
    tags: pa.Table  # CURRENT_COLUMNS (tags, uri) of the visible rows the index holds
    tag_row: np.ndarray  # (index rows,) each position's row of ``tags``, -1 for none
    fresh: pa.Table  # RESULT_COLUMNS of the visible rows it does not hold
    fresh_vectors: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(
            self.allowed.nbytes + self.tags.nbytes + self.tag_row.nbytes + self.fresh.nbytes + self.fresh_vectors.nbytes
        )

    def narrowed(self, chunk_ids: pa.Array, positions: np.ndarray) -> ResidentView:
        """The rows of this view a narrowing filter matched at this view's version: ``chunk_ids``,
        of which the index holds those at ``positions``. A smaller mask over the same index and tags."""
        kept = positions[self.tag_row[positions] >= 0]  # held by the index and in this view
        fresh, fresh_vectors = self.fresh, self.fresh_vectors
        if fresh.num_rows:
            mask = pc.is_in(fresh.column("chunk_id"), value_set=chunk_ids)
            fresh, fresh_vectors = fresh.filter(mask), fresh_vectors[mask.to_numpy(zero_copy_only=False)]
        return ResidentView(index=self.index, allowed=self.index.allowed(kept), tags=self.tags, tag_row=self.tag_row,
                            fresh=fresh, fresh_vectors=fresh_vectors)  # fmt: skip

    def nearest(self, query: np.ndarray, k: int) -> list[tuple[dict[str, Any], float]]:
        """The ``k`` nearest visible rows with their cosine, best first (equal scores by id): what
        each says from the index, its tags from this version."""
        positions, scores = self.index.search(query, self.allowed, k)
        content = self.index.content.take(pa.array(positions)).to_pylist()
        tags = self.tags.take(pa.array(self.tag_row[positions])).to_pylist()
        ranked = [
            ({**said, **tagged}, score) for said, tagged, score in zip(content, tags, scores.tolist(), strict=True)
        ]
        if self.fresh.num_rows:
            work("rows_scored", self.fresh.num_rows)
            fresh = self.fresh_vectors @ query
            best = np.argsort(-fresh, kind="stable")[:k]
            ranked += list(zip(self.fresh.take(pa.array(best)).to_pylist(), fresh[best].tolist(), strict=True))
        return sorted(ranked, key=lambda item: (-item[1], item[0]["chunk_id"]))[:k]


class ServingIndex:
    """The resident index of one warehouse's ``chunks`` table, for one process."""

    def __init__(self, doors: ReadDoors, *, budget_bytes: int, min_rows: int) -> None:
        self._doors = doors
        self._chunks = doors.chunks
        self._budget = budget_bytes
        self._min_rows = min_rows
        self._index: ResidentIndex | None = None
        self._lock = threading.Lock()
        self._building = False
        self._status = ServingStatus(state="off" if budget_bytes <= 0 else "idle")
        self._state: ResidentState | None = None
        self._state_lock = threading.Lock()
        self._follower = ThreadPoolExecutor(max_workers=1, thread_name_prefix="resident-state")
        self._threads: list[threading.Thread] = []  # building and warming: stopped and joined by ``close``
        self._stop = threading.Event()
        _open.add(self)

    def close(self, timeout: float) -> bool:
        """Stop the index being built or warmed, at its next block, and wait for it: a process that
        exits while one is inside faiss is aborted, not ended. Whether none still runs after
        ``timeout`` seconds. A later search builds again."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        try:
            while alive := [thread for thread in self._threads if thread.is_alive()]:
                if time.monotonic() >= deadline:
                    return False
                alive[0].join(max(0.0, deadline - time.monotonic()))
            return True
        finally:
            if not any(thread.is_alive() for thread in self._threads):
                self._stop.clear()

    def _started(self, target: Callable[[], object], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def status(self) -> ServingStatus:
        index = self._index
        return replace(self._status, warm=index is not None and index.codes.ready)

    def wanted(self, dimension: int) -> bool:
        """Whether this process may build an index at all (a budget, and room for one row)."""
        return self._budget >= resident_bytes(1, dimension)

    def applies(self, table_rows: int) -> bool:
        """Whether a table of ``table_rows`` is one the index serves (large enough, a budget)."""
        return self._budget > 0 and table_rows >= self._min_rows

    def usable(self, table_rows: int) -> ResidentIndex | None:
        """The index if one is ready for a table of ``table_rows``; else None, and a build starts
        (in the background) if the table is large enough and the index would fit."""
        if not self.applies(table_rows):
            return None
        index = self._index
        if index is None:
            self._start_build(table_rows)
        return index

    def state(self, version: int) -> ResidentState | None:
        """The index with every row's tags at ``version`` or later (moved there by the commits
        since, once per version for the whole process); None until the index and its tags are
        built, or when a version they need is gone (they are then built again)."""
        state = self._state
        if state is None or state.version >= version:
            return state
        with self._state_lock:
            state = self._state
            if state is None or state.version >= version:
                return state
            # On this process's own thread: the work is the commit's, not the search's that came first
            # (its counted work stays a function of its caller's rows), and is done once for all.
            target = max(version, self._chunks.latest_version())
            moved = self._follower.submit(advanced, state, self._chunks, target).result()
            self._state = moved
        if moved is None:
            self._start_build(self._chunks.count(), replace=True)
        elif moved.fresh_rows > max(1, REBUILD_SHARE * moved.index.rows):
            self._start_build(moved.index.rows + moved.fresh_rows, replace=True)
        return moved

    def view(self, index: ResidentIndex, where: str, version: int) -> ResidentView | None:
        """The rows ``where`` admits at ``version`` as ``index`` sees them; None when that version is
        gone, or too many visible rows are missing from the index (a rebuild then starts)."""
        visible = self._chunks.read_at(version, where, ["chunk_id", *CURRENT_COLUMNS])
        if visible is None:
            return None
        positions = index.positions(visible.column("chunk_id"))
        held = positions >= 0
        missing = pc.filter(visible.column("chunk_id"), pa.array(~held)).to_pylist()
        if len(missing) > max(1, REBUILD_SHARE * index.rows):
            self._start_build(index.rows + len(missing), replace=True)
        if len(missing) > FRESH_MAX_ROWS:
            return None
        fresh, fresh_vectors = pa.table({}), np.empty((0, index.graph.d), dtype=np.float32)
        if missing:
            rows = self._chunks.read_rows_at(version, where, missing, [*RESULT_COLUMNS, "vector"])
            if rows is None:
                return None
            vectors, usable = unit_vectors(rows.column("vector"), index.graph.d)
            fresh, fresh_vectors = rows.select(RESULT_COLUMNS).filter(pa.array(usable)), vectors[usable]
        tags = visible.filter(pa.array(held)).select(list(CURRENT_COLUMNS)).combine_chunks()
        tag_row = np.full(index.rows, -1, dtype=np.int64)
        tag_row[positions[held]] = np.arange(tags.num_rows)
        return ResidentView(index=index, allowed=index.allowed(positions[held]), tags=tags, tag_row=tag_row,
                            fresh=fresh, fresh_vectors=fresh_vectors)  # fmt: skip

    # -- building ---------------------------------------------------------------------------

    def _start_build(self, rows: int, *, replace: bool = False) -> None:
        needed = resident_bytes(rows, self._chunks.dimension)
        if needed > self._budget:
            self._status = ServingStatus(
                state="over budget", rows=rows, bytes=needed,
                reason=f"an index of {rows} rows needs {needed // 2**20} MiB, over resident_index_mb "
                       f"({self._budget // 2**20} MiB): searching through Lance",
            )  # fmt: skip
            return
        with self._lock:
            if self._building or (self._index is not None and not replace):
                return
            self._building = True
        if self._index is None:
            self._status = ServingStatus(state="building", rows=rows, bytes=needed)
        self._started(self._build, "resident-index")

    def _build(self) -> None:
        try:
            self.build_now()
        except Stopped:  # the process closes the warehouse: a later search builds again
            self._status = ServingStatus(state="idle")
        except Exception as exc:  # searches go on through Lance; the next one that could use it tries again
            log.warning("building the resident index failed (searching through Lance): %s", exc)
            self._status = ServingStatus(state="failed", reason=str(exc).splitlines()[0] if str(exc) else repr(exc))
        finally:
            with self._lock:
                self._building = False

    def build_now(self) -> ResidentIndex:
        """Load the newest artifact the warehouse holds (unless it is further behind the table than
        a rebuild would allow), else build from the table; install and return it."""
        def from_table() -> ResidentIndex:
            return table_index(self._chunks, stop=self._stop)

        index = load_artifact(self._doors)
        latest = self._chunks.latest_version()
        if (
            index is None
            or (self._chunks.count() - index.rows) > REBUILD_SHARE * max(1, index.rows)
            or index.version > latest
        ):
            index = from_table()
        state = build_state(self._chunks, index, load_terms(self._doors, index))
        if state is None:  # the artifact's version is gone: the table's latest rows
            index = from_table()
            state = build_state(self._chunks, index)
        self._index = index
        self._state = state
        held = index.nbytes + (state.nbytes if state is not None else 0)
        self._status = ServingStatus(state="ready", version=index.version, rows=index.rows, bytes=held)
        self._started(lambda: index.warm(self._stop), "resident-index-warm")
        return index


def table_index(chunks: ChunkReads, stop: threading.Event | None = None) -> ResidentIndex:
    """The index of the table's latest rows, laid out by their tags (``by_tags``)."""
    version, rows = chunks.read_latest([*CONTENT_COLUMNS, "vector", *TAG_COLUMNS])
    return ResidentIndex.build(by_tags(rows), version=version, dimension=chunks.dimension, stop=stop)


_open: weakref.WeakSet[ServingIndex] = weakref.WeakSet()
"""Every serving index of this process, stopped at exit: a short-lived process (one ``ragwarden
search``) that started a build and never closed its warehouse ends cleanly."""


@atexit.register
def _stop_at_exit() -> None:
    for serving in list(_open):
        serving.close(EXIT_WAIT_SECONDS)


EXIT_WAIT_SECONDS = 30.0


def store_artifact(doors: ReadDoors) -> ResidentIndex | None:
    """Build the index of the table's latest version and keep it in the warehouse (replacing older
    ones) for replicas to load; None where the warehouse keeps no files (not a folder nor S3)."""
    files = doors.artifacts
    if files is None:
        return None
    index = table_index(doors.chunks)
    version = index.version
    sink = pa.BufferOutputStream()
    rows = index.stored_rows()
    with ipc.new_file(sink, rows.schema) as out:
        out.write_table(rows)
    stem = f"chunks-{version:012d}"
    files.put(f"{stem}.rows", sink.getvalue().to_pybytes())
    files.put(f"{stem}.terms", index_terms(index).to_bytes())
    files.put(f"{stem}.faiss", index.to_bytes())  # last: its presence marks a whole artifact
    for name in files.names():
        if not name.startswith(stem):
            files.remove(name)
    return index


def load_terms(doors: ReadDoors, index: ResidentIndex) -> TermPairs | None:
    """The terms stored beside ``index``'s artifact (its rows analysed when it was stored), or
    None: an index built here, an artifact of an earlier release, or one unreadable (the rows are
    then analysed at load)."""
    files = doors.artifacts
    stored = None if files is None else files.get(f"chunks-{index.version:012d}.terms")
    if stored is None:
        return None
    try:
        terms = TermPairs.from_bytes(stored)
    except (pa.ArrowException, ValueError) as exc:
        log.warning("the terms stored beside the serving index are unreadable (analysing the rows): %s", exc)
        return None
    return terms if len(terms.lengths) == index.rows else None


def load_artifact(doors: ReadDoors) -> ResidentIndex | None:
    """The newest whole artifact in the warehouse, or None."""
    files = doors.artifacts
    if files is None:
        return None
    versions = sorted(int(found[1]) for name in files.names() if (found := _ARTIFACT.fullmatch(name)))
    for version in reversed(versions):
        stem = f"chunks-{version:012d}"
        content = files.get(f"{stem}.rows")
        if content is None:
            continue
        try:
            rows = ipc.open_file(pa.BufferReader(content)).read_all()
            mapped = files.local(f"{stem}.faiss")
            if mapped is not None:  # the vectors mapped from the file, not copied (a replica starts faster)
                graph = faiss.read_index(str(mapped), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
            else:
                stored = files.get(f"{stem}.faiss")
                if stored is None:
                    continue
                graph = faiss.deserialize_index(np.frombuffer(stored, dtype=np.uint8))
            return ResidentIndex.loaded(graph, rows, version=version)
        except (pa.ArrowException, ValueError, RuntimeError) as exc:
            log.warning("resident index artifact %s is unreadable (building from the table): %s", stem, exc)
    return None
