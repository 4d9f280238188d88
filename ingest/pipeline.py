"""Ingest orchestration: read sources, validate, write in batches, report what happened."""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tqdm import tqdm

from ..embedder import Embedder
from ..governance.tags import GovernanceTags
from ..state import WriteDoors
from ..wording import plural
from .files import RECORD_SUFFIXES, distinct_inputs, iter_file_sources, walk_documents
from .records import Outcome, Rejected, Skipped, SourceRecord, open_jsonl, read_jsonl
from .writer import BatchResult, DocumentWriter, Overrides


class IngestEngine(Protocol):
    """Where documents are chunked and embedded: ``write_many`` writes decided batches through
    ``writer`` (one commit each, whole documents only), ``window_docs`` documents at a time."""

    window_docs: int

    def write_many(self, writer: DocumentWriter, batches: Sequence[Sequence[SourceRecord]]) -> list[BatchResult]: ...


EMBED_WINDOW_DOCS = 512
"""Documents whose new text is embedded in one call, written in commits of ``batch_docs``: enough
for the model to see full, length-sorted batches; few enough to keep memory and latency small."""


@dataclass(frozen=True, kw_only=True)
class IngestReport:
    """What one ingest run did: documents written or unchanged, chunks, and every refusal."""

    run_id: str
    written_documents: tuple[tuple[str, str], ...]  # (tenant, doc id) of each written document
    written_tags: tuple[GovernanceTags, ...] = ()  # the tags each written document got, in the same order
    unchanged: int
    chunks: int
    skipped: tuple[Skipped, ...]
    rejected: tuple[Rejected, ...]
    seconds: float
    restored: tuple[tuple[str, str], ...] = ()  # (tenant, doc id) of each erased document ingested again
    overrides: tuple[str, ...] = ()  # what the operator allowed that ingest refuses by default

    @property
    def written(self) -> tuple[str, ...]:
        """The ids of the documents written."""
        return tuple(doc_id for _, doc_id in self.written_documents)

    @property
    def documents(self) -> int:
        """How many documents were written."""
        return len(self.written_documents)

    @property
    def ok(self) -> bool:
        return not self.rejected

    def summary(self) -> str:
        return (
            f"{plural(self.documents, 'document')} written, {self.unchanged} unchanged, {plural(self.chunks, 'chunk')}, "
            f"{len(self.skipped)} skipped, {len(self.rejected)} rejected"
            + (f", {len(self.restored)} restored after erasure" if self.restored else "")
            + f" in {self.seconds:.1f} s"
        )


def _is_jsonl(path: Path) -> bool:
    return path.name.lower().endswith(RECORD_SUFFIXES)


def iter_sources(
    paths: Sequence[Path | str],
    *,
    manifest: Path | None,
    acl_from: str | None,
    default_tenant: str | None,
    max_bytes: int,
) -> Iterator[Outcome]:
    """Every outcome of every input: JSONL files record by record, other paths as documents."""
    files: list[Path] = []
    for path in distinct_inputs(paths):
        if not path.exists():
            yield Rejected(source=str(path), reason="no such file or folder")
        elif path.is_file() and _is_jsonl(path):
            yield from read_jsonl(path, max_line_bytes=max_bytes)
        else:
            files.append(path)
    if files:
        yield from iter_file_sources(
            files, manifest=manifest, acl_from=acl_from, default_tenant=default_tenant, max_bytes=max_bytes
        )


def count_inputs(paths: Sequence[Path | str], *, manifest: Path | None = None) -> int:
    """How many outcomes ``iter_sources`` will give for ``paths``, near enough for a progress bar:
    one per non-blank line of a JSONL file, one per other file a folder holds (hidden entries,
    sidecars and the manifest left out). Reading is cheap beside embedding what is read."""
    excluded = Path(os.path.abspath(manifest)) if manifest is not None else None
    found = 0
    for path in distinct_inputs(paths):
        if path.is_dir():  # the walk the loader takes (a folder it cannot list counts one, as its refusal)
            for candidate in walk_documents(path, excluded):
                file = None if isinstance(candidate, Rejected) else candidate[0]
                found += _records_in(file) if file is not None and file.name.lower().endswith(RECORD_SUFFIXES) else 1
        elif path.is_file() and path != excluded:
            found += _records_in(path) if _is_jsonl(path) else 1
    return found


def _records_in(path: Path) -> int:
    """The non-blank lines of a JSONL file (gzipped or not); 1 if it cannot be read (its outcome says why)."""
    try:
        with open_jsonl(path) as handle:
            return sum(1 for line in handle if line.strip())
    except (OSError, EOFError, zlib.error):
        return 1


class IngestProgress:
    """The ingest's bar: inputs done of the total, the time left, and chunks and documents a
    second. Inputs refused or skipped count at once; a window of documents counts as its chunks
    are embedded (so the bar moves between commits) and exactly once it is committed."""

    FORMAT = "ingest {percentage:3.0f}%|{bar}| {n:.0f}/{total_fmt} inputs [{elapsed}<{remaining}{postfix}]"

    def __init__(self, *, total: int | None, show: bool) -> None:
        bar_format = self.FORMAT if total else "ingest {n:.0f} inputs [{elapsed}{postfix}]"
        self._bar = tqdm(total=total, disable=not show, file=sys.stderr, bar_format=bar_format, unit="doc")
        self._total = total
        self._started = time.perf_counter()
        self._done = 0  # inputs refused, skipped or committed
        self._ahead = 0.0  # of the window being embedded, the part already shown
        self._documents = 0
        self._chunks = 0

    def __enter__(self) -> IngestProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.close()

    def _show(self) -> None:
        shown = self._done + self._ahead
        self._bar.n = min(shown, self._total) if self._total else shown  # a total counted short never overflows
        self._bar.update(0)  # tqdm redraws when its interval has passed

    def passed(self) -> None:
        self._done += 1
        self._show()

    def embedding(self, documents: int) -> Callable[[int, int], None] | None:
        """What the writer tells as a window of ``documents`` is embedded: ``done`` of ``of`` chunks
        (nothing when no bar is shown)."""
        if self._bar.disable:
            return None

        def told(done: int, of: int) -> None:
            self._ahead = documents * done / of * 0.99  # the last part waits for the commit
            self._rates(self._chunks + done)
            self._show()

        return told

    def committed(self, documents: int, chunks: int) -> None:
        """A batch of ``documents`` committed, with ``chunks`` new chunks."""
        self._ahead = max(0.0, self._ahead - documents)
        self._done += documents
        self._documents += documents
        self._chunks += chunks
        self._rates(self._chunks)
        self._show()

    def _rates(self, chunks: int) -> None:
        seconds = max(time.perf_counter() - self._started, 1e-9)
        self._bar.set_postfix_str(
            f"{chunks} chunks, {chunks / seconds:.1f} chunks/s, {self._documents / seconds:.1f} docs/s", refresh=False
        )


def dedupe_ids(outcomes: Iterable[Outcome]) -> Iterator[Outcome]:
    """Refuse a second record with an id already seen in this run: which one wins would be arbitrary."""
    first_seen: dict[tuple[str, str], str] = {}
    for outcome in outcomes:
        if isinstance(outcome, SourceRecord):
            if outcome.key in first_seen:
                yield Rejected(source=outcome.origin, reason=repeated_id(outcome.doc_id, first_seen[outcome.key]))
                continue
            first_seen[outcome.key] = outcome.origin
        yield outcome


def repeated_id(doc_id: str, first: str) -> str:
    """Why a second record of one id in one run is refused."""
    return f"id {doc_id!r} already appeared in this run at {first}"


def vector_refusal(model: str | None, length: int, *, warehouse_model: str, dimension: int) -> str | None:
    """Why a vector ``model`` made, of ``length`` numbers, cannot be the warehouse's; None if it can."""
    if model != warehouse_model:
        return f"vector was made by {model!r}; this warehouse's vectors are {warehouse_model!r}'s, and the two do not compare"
    if length != dimension:
        return f"vector has {length} numbers; {warehouse_model!r} makes {dimension}"
    return None


def brought_vectors(
    outcomes: Iterable[Outcome], *, model: str, dimension: int, engine: IngestEngine | None
) -> Iterator[Outcome]:
    """Refuse a record whose own vector is another model's or another dimension's than the
    warehouse's, naming both: its neighbours would be meaningless. The Ray engine embeds in its
    actors, so records bringing vectors are written by the local engine only."""
    for outcome in outcomes:
        if isinstance(outcome, SourceRecord) and outcome.vector is not None:
            reason = None
            if engine is not None:
                reason = "a record that brings its vector is written by the local engine; ingest it with engine='local'"
            else:
                reason = vector_refusal(outcome.model, len(outcome.vector), warehouse_model=model, dimension=dimension)
            if reason is not None:
                yield Rejected(source=outcome.origin, reason=reason)
                continue
        yield outcome


_apart = threading.Lock()
_apart_depth = 0


@contextmanager
def held_apart() -> Iterator[None]:
    """Leave every object alive now out of the garbage collector's passes until the block ends
    (``gc.freeze``; the outermost of overlapping blocks unfreezes).

    Why: records brought with their vectors hold hundreds of numbers each, and every full
    collection during an ingest traversed all of them again: 43% of a 50,000-record
    ``ingest_records`` (6,540 rows/s, 11,418 with collection off). Objects made inside the block are
    collected as usual; those frozen are freed by reference counting as ever, and only a cycle
    among them waits for the block's end."""
    global _apart_depth
    with _apart:
        _apart_depth += 1
        if _apart_depth == 1:
            gc.freeze()
    try:
        yield
    finally:
        with _apart:
            _apart_depth -= 1
            if _apart_depth == 0:
                gc.unfreeze()


def run_ingest(
    outcomes: Iterable[Outcome],
    *,
    doors: WriteDoors,
    embedder: Embedder,
    overlap: int,
    batch_docs: int,
    progress: bool | None = None,
    engine: IngestEngine | None = None,
    window_docs: int = EMBED_WINDOW_DOCS,
    total: Callable[[], int] | None = None,
    overrides: Overrides = Overrides(),
    maintain: bool = True,
    brought_batch: int = 10_000,
) -> IngestReport:
    """Write every valid record, batch by batch; each batch is one commit.

    Batches are written a window at a time (about ``window_docs`` documents, or the engine's
    window) so the window's text is embedded in one call; commits stay one per batch.
    ``engine`` chunks and embeds elsewhere (``ray_engine.RayEngine``); by default, in this process.
    With ``progress`` (by default, on a terminal) a bar counts inputs against ``total()`` (asked
    only then), with chunks and documents a second and the time left, moving as chunks are
    embedded (``IngestProgress``). A record whose id another source holds, or an erased one, is
    rejected unless ``overrides`` allows it. ``maintain``: fold the rows into the indexes and merge
    small fragments once enough is due (else ``optimize`` does it when run). Records that bring
    their own vectors have nothing to embed: they are committed ``brought_batch`` at a time.
    """
    started = time.perf_counter()
    run_id = str(uuid.uuid4())
    writer = DocumentWriter(doors, embedder, overlap=overlap, run_id=run_id, overrides=overrides)
    skipped: list[Skipped] = []
    rejected: list[Rejected] = []
    written: list[tuple[str, str]] = []
    written_tags: list[GovernanceTags] = []
    restored: list[tuple[str, str]] = []
    unchanged = chunks = 0
    batch: list[SourceRecord] = []
    brought: list[SourceRecord] = []  # records bringing their vectors: nothing to embed, committed in bulk
    window: list[list[SourceRecord]] = []
    window_batches = max(1, (engine.window_docs if engine else window_docs) // batch_docs)
    show = sys.stderr.isatty() if progress is None else progress
    bar = IngestProgress(total=total() if show and total is not None else None, show=show)

    def write_many(batches: list[list[SourceRecord]]) -> list[BatchResult]:
        if engine is not None:
            return engine.write_many(writer, batches)
        return writer.write_many(batches, bar.embedding(sum(len(records) for records in batches)))

    def commit(batches: list[list[SourceRecord]]) -> None:
        nonlocal unchanged, chunks
        for records, result in zip(batches, write_many(batches), strict=True):
            written.extend(result.written)
            tags_of = {record.key: record.tags for record in records}
            written_tags.extend(tags_of[key] for key in result.written)
            rejected.extend(result.refused)
            restored.extend(result.restored)
            unchanged += len(result.unchanged)
            chunks += result.chunks
            bar.committed(len(records), result.chunks)

    def flush(*, final: bool = False) -> None:
        if batch:
            window.append(batch.copy())
            batch.clear()
        if len(window) < window_batches and not final:
            return
        commit(window)
        window.clear()

    with bar:
        checked = brought_vectors(outcomes, model=embedder.model_id, dimension=doors.chunks.dimension, engine=engine)
        for outcome in dedupe_ids(checked):
            if isinstance(outcome, Skipped):
                skipped.append(outcome)
                bar.passed()
            elif isinstance(outcome, Rejected):
                rejected.append(outcome)
                bar.passed()
            elif outcome.vector is not None:
                brought.append(outcome)
                if len(brought) >= brought_batch:
                    commit([brought.copy()])
                    brought.clear()
            else:
                batch.append(outcome)
                if len(batch) >= batch_docs:
                    flush()
        flush(final=True)
        if brought:
            commit([brought])
    if written and maintain:
        doors.maintenance.optimize(batched=True)
    return IngestReport(
        run_id=run_id,
        written_documents=tuple(written),
        written_tags=tuple(written_tags),
        restored=tuple(restored),
        overrides=tuple(overrides.asked()),
        unchanged=unchanged,
        chunks=chunks,
        skipped=tuple(skipped),
        rejected=tuple(rejected),
        seconds=time.perf_counter() - started,
    )
