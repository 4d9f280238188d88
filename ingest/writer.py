"""The idempotent, per-document-atomic writer.

A batch of documents is written in one commit of the ``chunks`` table: unchanged documents are
left alone, changed ones have their old chunks replaced in the same commit, and text already
embedded (same chunk id) keeps its stored vector, so re-tagging never re-embeds.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from ..embedder import Embedder
from ..state import ChunksSnapshot, ChunkWrite, DocumentKey, Erasure, SourceState, WriteDoors, is_missing_file
from .chunking import Chunk, TokenSpans, chunk_text
from .lifecycle import rederive, source_records
from .records import Rejected, SourceRecord, document_version


def chunk_document(
    text: str, *, tenant: str, doc_id: str, tokenizer: TokenSpans, window: int, overlap: int
) -> list[tuple[Chunk, str]]:
    """A document's chunks, each with its chunk id: the same wherever it runs."""
    version = document_version(text)
    return [
        (c, chunk_id(tenant, doc_id, version, c.position, c.text))
        for c in chunk_text(text, tokenizer, window=window, overlap=overlap)
    ]


def whole_document(record: SourceRecord) -> list[tuple[Chunk, str]]:
    """A record that brought its own vector: one chunk, its whole text (the vector is the text's)."""
    chunk = Chunk(position=0, text=record.text, start=0, end=len(record.text))
    return [(chunk, chunk_id(record.tags.tenant, record.doc_id, record.version, 0, record.text))]


def _same_vector(stored: list[float] | None, brought: np.ndarray) -> bool:
    """Whether the vector kept for a record's chunk is the one it brings (as float32 keeps it)."""
    return stored is not None and np.array_equal(np.asarray(stored, dtype=np.float32), np.asarray(brought, dtype=np.float32))


def chunk_id(tenant: str, doc_id: str, doc_version: str, position: int, text: str) -> str:
    """Deterministic: the same document version always yields the same chunk ids. The tenant is
    hashed in too, since two tenants may each hold a document of the same id and text."""
    joined = f"{tenant}\x1f{doc_id}\x1f{doc_version}\x1f{position}\x1f{text}\x1f"  # each part, then the separator
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True, kw_only=True)
class Overrides:
    """What ingest refuses unless the operator asks for it, each said in the ingest's receipt."""

    allow_move: bool = False
    """An id may move to another source, replacing the document (content and permissions) it held."""
    restore_erased: bool = False
    """An erased document may be ingested again; its tombstone is lifted."""

    def asked(self) -> list[str]:
        """The overrides asked for, by name (for the receipt)."""
        return [name for name, on in (("allow_move", self.allow_move), ("restore_erased", self.restore_erased)) if on]


@dataclass(frozen=True, kw_only=True)
class BatchResult:
    written: list[DocumentKey]
    unchanged: list[str]
    chunks: int
    refused: list[Rejected] = field(default_factory=list)
    restored: list[DocumentKey] = field(default_factory=list)


@dataclass(kw_only=True)
class BatchPlan:
    """One batch decided but not yet written: embedding happens between planning and commit."""

    changed: list[SourceRecord]
    unchanged: list[str]
    existing: set[DocumentKey]
    refused: list[Rejected] = field(default_factory=list)
    restoring: list[DocumentKey] = field(default_factory=list)
    chunked: list[tuple[SourceRecord, list[tuple[Chunk, str]]]] = field(default_factory=list)
    whole: dict[DocumentKey, list[tuple[Chunk, str]]] = field(default_factory=dict)  # records that bring their vector: their one chunk
    vectors: dict[str, list[float]] = field(default_factory=dict)
    to_embed: dict[str, str] = field(default_factory=dict)


class DocumentWriter:
    """Writes batches of validated source records into one warehouse."""

    def __init__(
        self, doors: WriteDoors, embedder: Embedder, *, overlap: int, run_id: str, overrides: Overrides = Overrides()
    ) -> None:
        self.doors = doors
        self.embedder = embedder
        self.overlap = overlap
        self.run_id = run_id
        self.overrides = overrides

    def write(self, records: Sequence[SourceRecord]) -> BatchResult:
        """Write one batch in one commit."""
        return self.write_many([records])[0]

    def write_many(
        self, batches: Sequence[Sequence[SourceRecord]], progress: Callable[[int, int], None] | None = None
    ) -> list[BatchResult]:
        """Write several batches, each in its own commit, embedding all their new text in one call.

        One call gives the model full, length-sorted batches instead of a ragged tail per commit.
        If it fails, the batches are written one by one, so those before the failing one still
        land, exactly as if each had been written alone. ``progress(done, of)`` hears how many of
        the ``of`` new chunk texts are embedded, as they are.
        """
        plans = [self._plan(records) for records in batches]
        texts = {cid: text for plan in plans for cid, text in plan.to_embed.items()}
        fresh: dict[str, list[float]] = {}
        if texts:
            try:
                if progress is None or not _takes_progress(self.embedder):
                    embedded = self.embedder.encode(list(texts.values()))
                else:
                    embedded = self.embedder.encode(list(texts.values()), progress=lambda done: progress(done, len(texts)))
            except Exception:
                if len(plans) == 1:
                    raise
                return [self.write(records) for records in batches]
            fresh = dict(zip(texts, (v.tolist() for v in embedded), strict=True))
        return [self._commit(plan, fresh) for plan in plans]

    def _plan(self, records: Sequence[SourceRecord]) -> BatchPlan:
        """What one batch will write: its changed records chunked, and the chunk texts not yet embedded."""
        plan = self.decide(records)
        if not plan.changed:
            return plan
        plan.chunked = [
            (r, plan.whole[r.key] if r.vector is not None else chunk_document(
                r.text, tenant=r.tags.tenant, doc_id=r.doc_id, tokenizer=self.embedder.tokenizer,
                window=self.embedder.max_tokens, overlap=self.overlap))
            for r in plan.changed
        ]  # fmt: skip (the tokenizer is loaded only for a record to chunk: an import brings its chunks)
        plan.vectors = self.doors.chunks.vectors_of(cid for r, chunks in plan.chunked if r.vector is None for _, cid in chunks)
        plan.vectors |= {chunks[0][1]: r.vector for r, chunks in plan.chunked if r.vector is not None}
        plan.to_embed = {
            cid: chunk.text for _, chunks in plan.chunked for chunk, cid in chunks if cid not in plan.vectors
        }
        return plan

    def decide(self, records: Sequence[SourceRecord]) -> BatchPlan:
        """Which records of one batch changed (and will be written), which are unchanged, and
        which are refused (an id held by another source, an erased document)."""
        states = self.doors.sources.states(r.key for r in records)
        erased = self.doors.erasures.of(r.key for r in records)
        whole = {r.key: whole_document(r) for r in records if r.vector is not None}
        brought = {key: chunks[0][1] for key, chunks in whole.items()}  # its one chunk id
        stored = self.doors.chunks.vectors_of(brought.values()) if brought else {}
        changed: list[SourceRecord] = []
        unchanged: list[str] = []
        refused: list[Rejected] = []
        for record in records:
            state = states.get(record.key)
            refusal = self._refusal(record, state, erased.get(record.key))
            if refusal is not None:
                refused.append(Rejected(source=record.origin, reason=refusal))
                continue
            same_vector = record.vector is None or _same_vector(stored.get(brought[record.key]), record.vector)
            if state is not None and same_vector and (state.doc_version, state.tags_fingerprint, state.uri, state.metadata) == (
                record.version,
                record.tags.fingerprint(),
                record.uri,
                record.metadata_json,
            ):
                unchanged.append(record.doc_id)
            else:
                changed.append(record)
        existing = {r.key for r in changed if r.key in states}
        restoring = [r.key for r in changed if r.key in erased]
        return BatchPlan(changed=changed, unchanged=unchanged, existing=existing, refused=refused, restoring=restoring, whole=whole)

    def _refusal(self, record: SourceRecord, state: SourceState | None, erasure: Erasure | None) -> str | None:
        """Why ``record`` may not be written without an override, or None."""
        if erasure is not None and not self.overrides.restore_erased:
            return _erased(record, erasure)
        if state is not None and state.uri is not None and state.uri != record.uri and not self.overrides.allow_move:
            return (f"id {record.doc_id!r} of tenant {record.tags.tenant!r} already holds {state.uri}; writing {record.uri} "
                    "would replace that document, content and permissions. Give one of them another id (an 'id' in "
                    "its sidecar or manifest), or pass --allow-move (allow_move=True) to replace it")  # fmt: skip
        return None

    def commit_embedded(
        self, plan: BatchPlan, chunked: Sequence[Sequence[tuple[Chunk, str]]], vectors: dict[str, list[float]]
    ) -> BatchResult:
        """Commit a decided batch whose changed records were chunked and embedded elsewhere (a Ray
        actor): ``chunked`` holds each changed record's chunks with their ids, in order."""
        plan.chunked = list(zip(plan.changed, (list(c) for c in chunked), strict=True))
        plan.vectors = vectors
        return self._commit(plan, {})

    def _commit(self, plan: BatchPlan, fresh: dict[str, list[float]]) -> BatchResult:
        """Write one planned batch, with the vectors embedded for it, in one commit."""
        if not plan.changed:
            return BatchResult(written=[], unchanged=plan.unchanged, chunks=0, refused=plan.refused)
        vectors = plan.vectors | {cid: fresh[cid] for cid in plan.to_embed}
        now = datetime.now(timezone.utc)
        chunk_rows = [
            self._chunk_row(record, chunk, cid, vectors, now)
            for record, chunks in plan.chunked
            for chunk, cid in chunks
        ]
        self.doors.registries.register_clauses({t: c for r in plan.changed for t, c in r.tags.clauses_by_token.items()})
        erased: dict[DocumentKey, Erasure] = {}

        def replace(snapshot: ChunksSnapshot) -> tuple[ChunkWrite, int]:
            """The documents' chunks become ``chunk_rows`` in one commit: old chunks go in the commit
            that adds the new ones, and rows derived from them are re-tagged (or, when their parent
            chunk goes, removed) in it too, all read from the snapshot the commit is made on.

            The erasure marks are read again at each attempt: an erasure whose mark came after the
            batch was decided (its rows gone in this snapshot, or in a commit this one will conflict
            with) keeps its document out, as it would have had the batch been decided after it."""
            erased.clear()
            if not self.overrides.restore_erased:
                erased.update(self.doors.erasures.of(r.key for r in plan.changed))
            rows = {str(row["chunk_id"]): row for row in chunk_rows if _document_of(row) not in erased}
            old_ids = snapshot.chunk_ids_of_documents(r.key for r in plan.changed if r.key not in erased)
            lineage = rederive(snapshot, self.doors.registries.clauses(), {cid: rows.get(cid) for cid in old_ids})
            gone = [cid for cid in old_ids if cid not in rows]
            return ChunkWrite(rows=[*rows.values(), *lineage.rows], delete=[*gone, *lineage.orphans]), snapshot.version

        planned, version = self.doors.chunks.write(replace, what="writing documents")
        written = [(record, chunks) for record, chunks in plan.chunked if record.key not in erased]
        keys = [record.key for record, _ in written]
        if version > planned + 1:  # other commits landed between this plan and its commit
            self.drop_strays(keys, {str(row["chunk_id"]) for row in chunk_rows}, version)
        source_rows = [self._source_row(record, len(chunks), now) for record, chunks in written]
        self.doors.sources.record(source_rows, chunks_version=version, insert=True)
        self.doors.erasures.lift(plan.restoring)
        refused = [*plan.refused, *(Rejected(source=r.origin, reason=_erased(r, erased[r.key])) for r in plan.changed if r.key in erased)]
        return BatchResult(written=keys, unchanged=plan.unchanged, chunks=sum(len(chunks) for _, chunks in written),
                           refused=refused, restored=plan.restoring)  # fmt: skip

    def drop_strays(self, keys: Sequence[DocumentKey], written: Collection[str], version: int) -> None:
        """Delete the chunks of ``keys`` that another ingest committed between this one's plan and
        its commit at ``version``, with the rows derived from them.

        Why: two ingests of a document that has no chunks (new, or just erased) each find nothing to
        replace and insert their own text's chunks. The ids differ (they hash the text), so Lance
        sees no conflict and both commit. The later commit stands, as its source record does (it is
        stamped later), so the chunks of the earlier, there at the later's version beside its own,
        go as they would have had the later seen them. Only a commit made on top of others can be
        that later one: a lone writer never pays this read.
        """
        try:
            strays = set(self.doors.chunks.snapshot(version).chunk_ids_of_documents(keys)) - set(written)
        except Exception as exc:
            if not is_missing_file(exc):
                raise
            return  # that version's files were purged already (rewritten since): nothing to read it by
        if not strays:
            return

        def drop(snapshot: ChunksSnapshot) -> tuple[ChunkWrite, list[dict[str, Any]]]:
            held = snapshot.chunk_ids_of_documents(keys)
            present = sorted(strays.intersection(held))
            registry = self.doors.registries.clauses()
            lineage = rederive(snapshot, registry, dict.fromkeys(present))
            kept = snapshot.rows(set(held) - strays).values()
            return ChunkWrite(rows=lineage.rows, delete=[*present, *lineage.orphans]), source_records(kept, registry)

        records, dropped_at = self.doors.chunks.write(drop, what="removing chunks a concurrent ingest wrote")
        # The documents' records say what stays, stamped by this commit (a re-tag may have come between).
        self.doors.sources.record(records, chunks_version=dropped_at, insert=True)

    def _chunk_row(
        self, record: SourceRecord, chunk: Chunk, cid: str, vectors: dict[str, list[float]], now: datetime
    ) -> dict[str, object]:
        return {
            "chunk_id": cid,
            "doc_id": record.doc_id,
            "source_uri": record.uri,
            "doc_version": record.version,
            "kind": "chunk",
            "position": chunk.position,
            "text": chunk.text,
            "vector": vectors[cid],
            **record.tags.row_columns(),
            "parents": [record.doc_id],
            "ingest_run_id": self.run_id,
            "embedding_model": record.model if record.vector is not None else self.embedder.name,
            "created_at": now,
            "metadata": record.metadata_json,
        }

    def _source_row(self, record: SourceRecord, chunk_count: int, now: datetime) -> dict[str, object]:
        return {
            "doc_id": record.doc_id,
            "uri": record.uri,
            "doc_version": record.version,
            "tags_fingerprint": record.tags.fingerprint(),
            **record.tags.row_columns(),
            "chunk_count": chunk_count,
            "metadata": record.metadata_json,
            "ingest_run_id": self.run_id,
            "ingested_at": now,
        }



def _erased(record: SourceRecord, erasure: Erasure) -> str:
    """Why an erased document is refused, and how to restore it."""
    return (f"{record.doc_id!r} of tenant {record.tags.tenant!r} was erased on {erasure.erased_at:%Y-%m-%d %H:%M} UTC "
            f"(it came from {erasure.source_uri}); an erasure holds: pass --restore-erased "
            "(restore_erased=True) to ingest it again, which the receipt records")  # fmt: skip


def _document_of(row: dict[str, object]) -> DocumentKey:
    return (str(row["tenant"]), str(row["doc_id"]))


def _takes_progress(embedder: object) -> bool:
    """Whether ``embedder.encode`` hears progress (``Embedder`` does; one made elsewhere may not)."""
    try:
        return "progress" in inspect.signature(embedder.encode).parameters  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return False
