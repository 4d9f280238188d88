"""A collection's rows written as Arrow columns, a commit at a time (``ragwarden import``).

An import brings hundreds of thousands of rows that already hold their vectors, nearly all of them
documents the warehouse has never seen. Made into one record object each and written through the
document writer, they cost about 95 microseconds a row, most of it Python doing one row's work at
a time. Here every row is checked as ``ingest_records`` checks a record (id, text, metadata, tags,
and the vectors all at once), the tags are parsed once per distinct tag set, and a commit's new
documents become one Arrow table of chunks and one of source records, their tag columns taken
from those few tag sets. Rows whose document the warehouse holds or has erased are left to the
document writer, which decides what changed, what is unchanged (an import run again) and what an
erasure refuses, exactly as for any ingest.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa

from ..governance.tags import GovernanceTags
from ..state import ChunkWrite, DocumentKey, WriteDoors
from .importers import AclFromMetadata, AclManifest, CollectedBatch, json_ready, tag_fields
from .pipeline import IngestReport, repeated_id, run_ingest, vector_refusal
from .records import (
    Rejected,
    Skipped,
    SourceRecord,
    check_metadata,
    checked_vector,
    document_version,
    id_problem,
    parse_tags,
    text_problem,
)
from .writer import DocumentWriter, Overrides, chunk_id


@dataclass(kw_only=True)
class Checked:
    """A chunk of rows, checked: those that may be written (their fields, in parallel lists, and
    their vectors as one array), and those refused or skipped."""

    ids: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    tags: list[GovernanceTags] = field(default_factory=list)
    metadata: list[dict[str, Any]] = field(default_factory=list)
    metadata_json: list[str] = field(default_factory=list)
    uris: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)  # each row's place in the chunk, to take its vector
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    asked: list[str] = field(default_factory=list)  # every row's id, as given: the sources the run reads
    rejected: list[Rejected] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def keys(self) -> list[DocumentKey]:
        return [(tags.tenant, doc_id) for tags, doc_id in zip(self.tags, self.ids, strict=True)]

    def record(self, n: int, model: str) -> SourceRecord:
        """Row ``n`` as the document writer's record."""
        vector = self.vectors[self.positions[n]]
        vector.flags.writeable = False
        made = SourceRecord(doc_id=self.ids[n], text=self.texts[n], tags=self.tags[n], uri=self.uris[n],
                            origin=_where(self.positions[n], self.ids[n]), metadata=self.metadata[n], vector=vector, model=model)  # fmt: skip
        made.__dict__["metadata_json"] = self.metadata_json[n]  # the cached property, from the check that made it
        return made


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """What holds for every row of a collection: the model that made its vectors, where it came
    from (each row's uri is ``origin#id``), and the tenant and classification of rows whose tags
    name none."""

    model: str
    origin: str
    tenant: str | None = None
    classification: str | None = None


def checked_rows(
    batch: CollectedBatch, tags: AclFromMetadata | AclManifest, came: Provenance, *, warehouse_model: str, dimension: int
) -> Checked:
    """``batch``'s rows (each with the tags ``tags`` gives it) checked as ``ingest_records`` checks
    the records ``importers.as_record`` makes of them: every fault of a row named at once, a second
    row of one id refused, empty text skipped. The vectors are checked together, and each
    distinct tag set is parsed once."""
    checked = Checked()
    vectors, vector_faults = _vectors(batch.vectors, came.model, warehouse_model=warehouse_model, dimension=dimension)
    given, which = tags.grouped(batch)
    governed = [_tags_or_fault(fields, came) for fields in given]
    plain = batch.columns is not None and all(_plain_json(kind) for kind in batch.columns.schema.types)
    first_seen: dict[DocumentKey, int] = {}
    for n, (row_id, text, raw, place) in enumerate(zip(batch.ids, batch.texts, batch.metadata_rows, which, strict=True)):
        problems = [problem for problem in (id_problem(row_id), text_problem(text)) if problem]
        metadata = raw if plain else json_ready(raw)  # what Arrow gives of plain columns is JSON as it is
        try:
            stored = check_metadata(metadata)
        except ValueError as exc:
            problems.append(str(exc))
        governance = governed[place]
        if isinstance(governance, str):
            problems.append(governance)
        if vector_faults[n]:
            problems.append(vector_faults[n])
        if problems:
            checked.rejected.append(Rejected(source=_where(n, row_id), reason="; ".join(problems)))
            continue
        if not text.strip():
            checked.skipped.append(Skipped(source=_where(n, row_id), reason="empty text"))
            continue
        key = (governance.tenant, row_id)  # type: ignore[union-attr]
        if key in first_seen:
            checked.rejected.append(Rejected(source=_where(n, row_id), reason=repeated_id(row_id, _where(first_seen[key], row_id))))
            continue
        first_seen[key] = n
        checked.ids.append(row_id)
        checked.texts.append(text)
        checked.tags.append(governance)  # type: ignore[arg-type]
        checked.metadata.append(metadata)
        checked.metadata_json.append(stored)
        checked.uris.append(f"{came.origin}#{row_id}")
        checked.positions.append(n)
    checked.vectors = vectors
    checked.asked = [str(row_id) for row_id in batch.ids]
    return checked


def _where(n: int, row_id: object) -> str:
    """How a row is named in a refusal, as ``ingest_records`` names the record it makes."""
    return f"record {n + 1} (id {row_id!r})"


def _plain_json(kind: pa.DataType) -> bool:
    """Whether what Arrow gives of a column of ``kind`` is already as JSON holds it (text,
    numbers, truth values, lists of them): then a row's metadata needs no walk."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _plain_json(kind.value_type)
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)
            or pa.types.is_floating(kind) or pa.types.is_boolean(kind) or pa.types.is_null(kind))  # fmt: skip


def _vectors(given: np.ndarray | Sequence[Any], model: str, *, warehouse_model: str, dimension: int) -> tuple[np.ndarray, list[str | None]]:
    """Every row's vector as one float32 array, and each row's fault (None: none). The model, the
    dimension, finite numbers and a direction are checked for all rows at once; a row that fails
    is checked alone, so its fault is named as a record's would be."""
    faults: list[str | None] = [None] * len(given)
    shared = vector_refusal(model, dimension, warehouse_model=warehouse_model, dimension=dimension)
    if isinstance(given, np.ndarray) and given.ndim == 2:
        stacked: np.ndarray | None = given
    else:
        try:
            stacked = np.stack([np.asarray(vector) for vector in given]) if len(given) else np.zeros((0, dimension), np.float32)
        except ValueError:  # rows of different lengths
            stacked = None
    if stacked is not None and stacked.ndim == 2 and stacked.dtype.kind in "fiu":
        with np.errstate(over="ignore", invalid="ignore"):
            kept = stacked.astype(np.float32)
        fine = np.isfinite(stacked).all(axis=1) & np.isfinite(kept).all(axis=1) & kept.any(axis=1)
        if stacked.shape[1] != dimension:
            shared = vector_refusal(model, stacked.shape[1], warehouse_model=warehouse_model, dimension=dimension)
    else:
        kept, fine = np.zeros((len(given), dimension), np.float32), np.zeros(len(given), dtype=bool)
    for n in np.flatnonzero(~fine).tolist():
        try:
            vector = checked_vector(given[n], model)
        except ValueError as exc:
            faults[n] = str(exc)
            continue
        faults[n] = vector_refusal(model, len(vector), warehouse_model=warehouse_model, dimension=dimension)
        if faults[n] is None:
            kept[n] = vector
    if shared is not None:
        faults = [fault or shared for fault in faults]
    return kept, faults


def _tags_or_fault(given: Mapping[str, Any], came: Provenance) -> GovernanceTags | str:
    """A row's tags, as its record's would be, or the fault that refuses them."""
    try:
        return _tags(given, tenant=came.tenant, classification=came.classification)
    except ValueError as exc:
        return str(exc)


def _tags(given: Mapping[str, Any], *, tenant: str | None, classification: str | None) -> GovernanceTags:
    """A row's tags, as its record's would be (``parse_tags`` keeps each distinct set parsed once);
    ValueError naming the fault."""
    fields = {"tenant": tenant, **tag_fields(given, classification=classification)}
    return parse_tags(tenant=fields["tenant"], acl=fields.get("acl"), labels=fields.get("labels"),
                      classification=fields.get("classification"))  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Written:
    """What the columnar commits wrote: each document's key and tags, and the chunks (one each)."""

    keys: tuple[DocumentKey, ...]
    tags: tuple[GovernanceTags, ...]


def write_new(checked: Checked, rows: Sequence[int], *, doors: WriteDoors, writer: DocumentWriter, model: str,
              run_id: str, batch: int) -> Written:  # fmt: skip
    """Rows ``rows`` of ``checked`` (documents the warehouse neither holds nor has erased) written
    ``batch`` at a time, each commit one Arrow table of chunks and one of source records."""
    keys: list[DocumentKey] = []
    tags: list[GovernanceTags] = []
    for start in range(0, len(rows), batch):
        part = list(rows[start : start + batch])
        written = _commit_new(checked, part, doors=doors, writer=writer, model=model, run_id=run_id)
        keys += [(checked.tags[n].tenant, checked.ids[n]) for n in written]
        tags += [checked.tags[n] for n in written]
    return Written(keys=tuple(keys), tags=tuple(tags))


def _commit_new(checked: Checked, part: list[int], *, doors: WriteDoors, writer: DocumentWriter, model: str,
                run_id: str) -> list[int]:  # fmt: skip
    """One commit of rows ``part``; the rows written (an erasure that came after they were
    decided keeps its document out, as the writer's commits do)."""
    now = datetime.now(timezone.utc)
    distinct: dict[int, int] = {}  # id(tags) -> its place among the commit's tag sets
    sets: list[GovernanceTags] = []
    for n in part:
        if id(checked.tags[n]) not in distinct:
            distinct[id(checked.tags[n])] = len(sets)
            sets.append(checked.tags[n])
    which = pa.array([distinct[id(checked.tags[n])] for n in part], pa.int32())
    doors.registries.register_clauses({t: c for tags in sets for t, c in tags.clauses_by_token.items()})
    ids = [checked.ids[n] for n in part]
    texts = [checked.texts[n] for n in part]
    versions = [document_version(text) for text in texts]
    tenants = [checked.tags[n].tenant for n in part]
    chunk_ids = [chunk_id(*fields, 0, text) for *fields, text in zip(tenants, ids, versions, texts, strict=True)]
    columns = [tags.row_columns() for tags in sets]
    schema = doors.chunks.schema

    def tag_column(name: str, target: pa.Schema) -> pa.Array:
        return pa.array([c[name] for c in columns], target.field(name).type).take(which)

    count = len(part)
    vectors = np.ascontiguousarray(checked.vectors[[checked.positions[n] for n in part]], dtype=np.float32)
    constant = {"kind": "chunk", "ingest_run_id": run_id, "embedding_model": model}
    chunks = {
        "chunk_id": chunk_ids, "doc_id": ids, "source_uri": [checked.uris[n] for n in part], "doc_version": versions,
        "position": pa.array(np.zeros(count, np.int32)), "text": texts,
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1]),
        **{name: tag_column(name, schema) for name in columns[0] if name in schema.names},
        "parents": pa.ListArray.from_arrays(pa.array(np.arange(count + 1, dtype=np.int32)), pa.array(ids, pa.string())),
        "created_at": pa.repeat(pa.scalar(now, schema.field("created_at").type), count),
        "metadata": [checked.metadata_json[n] for n in part],
        **{name: pa.repeat(pa.scalar(value, schema.field(name).type), count) for name, value in constant.items()},
    }  # fmt: skip
    table = pa.table({name: chunks[name] for name in schema.names if name in chunks}).cast(
        pa.schema([schema.field(name) for name in schema.names if name in chunks])
    )
    keys = [(tenant, doc_id) for tenant, doc_id in zip(tenants, ids, strict=True)]
    kept: list[int] = []

    def insert(snapshot: Any) -> tuple[Any, int]:
        """The rows, less any document erased since they were decided (read again at each attempt)."""
        erased = doors.erasures.of(keys)
        mask = [key not in erased for key in keys]
        kept[:] = [n for n, keep in zip(part, mask, strict=True) if keep]
        return ChunkWrite(table=table.filter(pa.array(mask)) if erased else table), snapshot.version

    planned, version = doors.chunks.write(insert, what="writing imported documents")
    held = set(kept)
    mask = pa.array([n in held for n in part]) if len(kept) != count else None
    if version > planned + 1:  # other commits landed between this plan and its commit
        writer.drop_strays([key for n, key in zip(part, keys, strict=True) if n in held], set(chunk_ids), version)
    sources = {
        "doc_id": ids, "tenant": tenants, "uri": [checked.uris[n] for n in part], "doc_version": versions,
        "tags_fingerprint": pa.array([tags.fingerprint() for tags in sets], pa.string()).take(which),
        **{name: tag_column(name, schema) for name in columns[0] if name != "tenant"},  # (the sources' own types: cast there)
        "chunk_count": pa.array(np.ones(count, np.int32)), "metadata": [checked.metadata_json[n] for n in part],
        "ingest_run_id": pa.repeat(pa.scalar(run_id, pa.string()), count),
        "ingested_at": pa.repeat(pa.scalar(now, schema.field("created_at").type), count),
    }  # fmt: skip
    written = pa.table(sources)
    doors.sources.record(written.filter(mask) if mask is not None else written, chunks_version=version, insert=True)
    return kept



def write_checked(checked: Checked, came: Provenance, *, doors: WriteDoors, embedder: Any, overlap: int, batch: int,
                  maintain: bool) -> IngestReport:  # fmt: skip
    """One ingest run of rows checked by ``checked_rows``: documents new to the warehouse written
    as columns (``write_new``), those it holds or has erased through the document writer
    (``run_ingest``: changed, unchanged or refused as any ingest decides). Which are new is read
    here, at the write, so rows checked while another batch was being written see its documents."""
    started = time.perf_counter()
    model = came.model
    keys = checked.keys()
    held, erased = doors.sources.states(keys), doors.erasures.of(keys)
    known = [n for n, key in enumerate(keys) if key in held or key in erased]
    new = [n for n, key in enumerate(keys) if key not in held and key not in erased]
    report = run_ingest((checked.record(n, model) for n in known), doors=doors, embedder=embedder, overlap=overlap,
                        batch_docs=batch, progress=False, maintain=False, brought_batch=batch)  # fmt: skip
    writer = DocumentWriter(doors, embedder, overlap=overlap, run_id=report.run_id, overrides=Overrides())
    written = write_new(checked, new, doors=doors, writer=writer, model=model, run_id=report.run_id, batch=batch)
    if (written.keys or report.written_documents) and maintain:
        doors.maintenance.optimize(batched=True)
    return IngestReport(
        run_id=report.run_id,
        written_documents=(*report.written_documents, *written.keys),
        written_tags=(*report.written_tags, *written.tags),
        restored=report.restored,
        overrides=report.overrides,
        unchanged=report.unchanged,
        chunks=report.chunks + len(written.keys),
        skipped=(*checked.skipped, *report.skipped),
        rejected=(*checked.rejected, *report.rejected),
        seconds=time.perf_counter() - started,
    )
