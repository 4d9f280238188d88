"""The governance lifecycle after ingest: derive new rows, sync changed tags, forget a source.

Each keeps DESIGN §4 true at every commit: a derived row carries its parents' tags conjoined,
a tag change reaches every row derived from the source in the same commit, and an erased
source leaves no row, no old version and no index file holding its text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..embedder import Embedder
from ..errors import InvalidRequestError, InvalidSourceError, InvalidValueError, NotFoundError
from ..governance.compiler import SubjectView
from ..governance.propagation import propagate
from ..governance.tags import GovernanceTags
from ..state import ChunksSnapshot, ChunkWrite, DocumentKey, WriteDoors, row_metadata
from .records import MAX_ID_LENGTH, MAX_METADATA_BYTES, RECORD_FIELDS, parse_tags

DERIVED_KINDS = ("summary", "note", "memory")
MAX_DERIVED_CHARS = 32_768


@dataclass(frozen=True, kw_only=True)
class DerivedRow:
    """A row written by ``derive``: its id, its parents and the tags it got from them."""

    chunk_id: str
    kind: str
    parents: tuple[str, ...]
    tags: GovernanceTags
    table_version: int


@dataclass(frozen=True, kw_only=True)
class SyncReport:
    """What ``sync`` re-tagged: documents, their chunks and the rows derived from them."""

    keys: tuple[DocumentKey, ...]  # (tenant, doc id) of each document re-tagged
    tags: tuple[GovernanceTags, ...]  # the tags each got, in the same order
    chunks: int
    derived: int
    table_version: int

    @property
    def documents(self) -> tuple[str, ...]:
        """The ids of the documents re-tagged."""
        return tuple(doc_id for _, doc_id in self.keys)


@dataclass(frozen=True, kw_only=True)
class ForgetReport:
    """What ``forget`` erased (ids only, never content), and the purge's proof that it is gone.

    ``item_id`` is the document or derived row asked for; ``erased_chunks`` the document's
    chunks (none for a derived row); ``erased_derived`` every derived row that went with it
    (the row itself first, for a derived row). ``table_version`` is the commit that removed them;
    ``versions_purged`` how many old versions of each table the purge dropped or emptied of
    their files, and ``versions_left`` how many still hold rows (one each: no earlier version
    holds the erased rows; the earlier versions' commit records stay an hour, so that writers
    that planned before the purge are still checked against every commit since).
    """

    item_id: str
    tenant: str
    reason: str
    erased_chunks: tuple[str, ...]
    erased_derived: tuple[str, ...]
    table_version: int
    versions_purged: Mapping[str, int]
    versions_left: Mapping[str, int]

    @property
    def doc_id(self) -> str:
        return self.item_id

    @property
    def chunks(self) -> int:
        return len(self.erased_chunks)

    @property
    def derived(self) -> int:
        return len(self.erased_derived)

    def tombstone(self) -> dict[str, Any]:
        """What the audit log keeps of the erasure: ids, counts and the purge's proof, no content."""
        return {
            "item": self.item_id,
            "erased": {"chunks": list(self.erased_chunks), "derived": list(self.erased_derived)},
            "table_version": self.table_version,
            "versions_purged": dict(self.versions_purged),
            "versions_left": dict(self.versions_left),
        }


def derived_id(kind: str, parents: Sequence[str], text: str) -> str:
    digest = hashlib.sha256(json.dumps([kind, sorted(parents), text]).encode("utf-8"))
    return "d" + digest.hexdigest()[:31]


def lineage_metadata(parents: Sequence[Mapping[str, Any]]) -> str:
    """A derived row's metadata: where it comes from, each parent's citation and metadata. Lineage
    only: the row's tags come from its parents' tags by the propagation rule, never from this."""
    cited = [
        {"chunk_id": p["chunk_id"], "doc_id": p["doc_id"], "source_uri": p["source_uri"], "metadata": row_metadata(p)}
        for p in parents
    ]
    text = json.dumps({"derived_from": cited}, sort_keys=True, ensure_ascii=False)
    if len(text.encode("utf-8")) <= MAX_METADATA_BYTES:
        return text
    # too much to carry: the citations alone (each parent's metadata stays on the parent)
    cited = [{key: value for key, value in parent.items() if key != "metadata"} for parent in cited]
    return json.dumps({"derived_from": cited, "metadata_omitted": True}, sort_keys=True, ensure_ascii=False)


class Lifecycle:
    """derive, sync and forget over one warehouse's chunks and source records."""

    def __init__(self, doors: WriteDoors, embedder: Embedder) -> None:
        self.doors = doors
        self.embedder = embedder

    # -- derive -------------------------------------------------------------------------------

    def derive(
        self,
        text: str,
        *,
        parents: Sequence[str],
        reader: SubjectView | None,
        kind: str = "summary",
        run_id: str | None = None,
    ) -> DerivedRow:
        """Write ``text`` as a row derived from ``parents``, tagged by the propagation rule.

        ``reader`` is what the policy lets the caller read (None: no policy, nothing). A parent the
        caller may not read is refused exactly as a missing one is.
        """
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequestError("text is empty; pass the summary or note to save")
        if len(text) > MAX_DERIVED_CHARS:
            raise InvalidRequestError(f"text is {len(text)} characters; the limit is {MAX_DERIVED_CHARS}")
        if kind not in DERIVED_KINDS:
            raise InvalidRequestError(f"kind {kind!r} is not one of {', '.join(DERIVED_KINDS)}")
        if isinstance(parents, str) or not parents or not all(isinstance(p, str) and p for p in parents):
            raise InvalidRequestError("parents must be a non-empty list of chunk ids")
        vector = self.embedder.encode([text])[0].tolist()
        chunk_id = derived_id(kind, parents, text)
        wanted = sorted(set(parents))

        def plan(snapshot: ChunksSnapshot) -> tuple[ChunkWrite, GovernanceTags]:
            rows = snapshot.rows(wanted)
            registry = self.doors.registries.clauses()
            for parent in parents:
                row = rows.get(parent)
                if reader is None or row is None or not reader.check(row, registry).allowed:
                    raise NotFoundError(f"chunk {parent!r} not found")
            tags = propagate([GovernanceTags.from_row(rows[p], registry) for p in wanted])
            self.doors.registries.register_clauses(tags.clauses_by_token)
            row = {
                "chunk_id": chunk_id,
                "doc_id": chunk_id,
                "source_uri": f"derived:{chunk_id}",
                "doc_version": hashlib.sha256(text.encode("utf-8")).hexdigest()[:32],
                "kind": kind,
                "position": 0,
                "text": text,
                "vector": vector,
                **tags.row_columns(),
                "parents": wanted,
                "ingest_run_id": run_id,
                "embedding_model": self.embedder.name,
                "created_at": datetime.now(timezone.utc),
                "metadata": lineage_metadata([rows[p] for p in wanted]),
            }
            # The parents are rewritten unchanged: the commit then fails if any of them changed
            # or went since they were read, and the row is derived again from what they are now.
            return ChunkWrite(rows=[row, *(rows[p] for p in wanted)]), tags

        tags, version = self.doors.chunks.write(plan, what="deriving a row")
        return DerivedRow(chunk_id=chunk_id, kind=kind, parents=tuple(wanted), tags=tags, table_version=version)

    # -- sync ---------------------------------------------------------------------------------

    def sync(self, records: Iterable[Mapping[str, Any]]) -> SyncReport:
        """Re-tag documents, their chunks and every row derived from them, in one commit.

        Vectors and text are not touched; the next search sees the new tags on every row.
        """
        changes = [_sync_change(record, f"record {n}") for n, record in enumerate(records, start=1)]
        states = self.doors.sources.states((tags.tenant, doc_id) for doc_id, tags in changes)
        for doc_id, tags in changes:
            if (tags.tenant, doc_id) not in states:
                raise NotFoundError(f"document {doc_id!r} not found in tenant {tags.tenant!r}")
        for _, tags in changes:
            self.doors.registries.register_clauses(tags.clauses_by_token)
        new_tags = {(tags.tenant, doc_id): tags.row_columns() for doc_id, tags in changes}

        def plan(snapshot: ChunksSnapshot) -> tuple[ChunkWrite, tuple[int, int, list[dict[str, Any]]]]:
            stored = snapshot.rows(snapshot.chunk_ids_of_documents(new_tags))
            updated = {
                chunk_id: {**row, **new_tags[(row["tenant"], row["doc_id"])]} for chunk_id, row in stored.items()
            }
            registry = self.doors.registries.clauses()
            lineage = rederive(snapshot, registry, updated)
            write = ChunkWrite(rows=[*updated.values(), *lineage.rows], delete=lineage.orphans)
            return write, (len(updated), len(lineage.derived), source_records(updated.values(), registry))

        (chunks, derived, records), version = self.doors.chunks.write(plan, what="re-tagging documents")
        # A document erased since it was read has no chunks at this version: no record to write.
        self.doors.sources.record(records, chunks_version=version, insert=False)
        return SyncReport(
            keys=tuple((tags.tenant, doc_id) for doc_id, tags in changes),
            tags=tuple(tags for _, tags in changes),
            chunks=chunks,
            derived=derived,
            table_version=version,
        )

    # -- forget -------------------------------------------------------------------------------

    def erasure(self, item_id: str, tenant: str | None, reason: str) -> Callable[[], ForgetReport]:
        """How to erase ``item_id`` within ``tenant`` (None: the operator, any tenant): as a
        document if one of that id is there, else as a derived row; missing reads as not found
        (another tenant's item too: a caller is confined to its own)."""
        holders = self.doors.sources.document_tenants(item_id)
        if (tenant is None and holders) or tenant in holders:
            owner = self.doors.sources.tenant_of(item_id, tenant, holders)
            return lambda: self.forget(item_id, tenant=owner, reason=reason)
        row_tenant = self.doors.chunks.row_tenant(item_id)
        if row_tenant is not None and tenant in (None, row_tenant):
            return lambda: self.forget_row(item_id, tenant=row_tenant, reason=reason)
        raise NotFoundError(f"document or derived row {item_id!r} not found")

    def forget(self, doc_id: str, *, tenant: str, reason: str) -> ForgetReport:
        """Erase a source of ``tenant`` and everything derived from it, then purge old versions
        and index files. Its tombstone stays: ingest refuses it from then on unless asked to
        restore it."""
        state = self.doors.sources.states([(tenant, doc_id)]).get((tenant, doc_id))
        if state is None and not self.doors.chunks.chunk_ids_of(doc_id, tenant):
            raise NotFoundError(f"document {doc_id!r} not found")
        # The tombstone first: an erasure cut short still keeps a later ingest from bringing it back.
        self.doors.erasures.record((tenant, doc_id), source_uri=state.uri if state is not None else None)

        def plan(snapshot: ChunksSnapshot) -> tuple[ChunkWrite, tuple[list[str], list[str]]]:
            chunk_ids = snapshot.chunk_ids_of_documents([(tenant, doc_id)])
            derived = sorted(snapshot.derived_from(chunk_ids))
            return ChunkWrite(delete=[*chunk_ids, *derived]), (chunk_ids, derived)

        (chunks, derived), version = self.doors.chunks.write(plan, what="erasing a document")
        self.doors.sources.forget((tenant, doc_id), chunks_version=version)
        return self._purged(doc_id, tenant, reason, chunks, derived, version)

    def forget_row(self, chunk_id: str, *, tenant: str, reason: str) -> ForgetReport:
        """Erase a derived row of ``tenant`` (a summary, note or agent memory) by its own id, and
        every row derived from it, then purge as ``forget`` does. A source chunk is not a row to
        forget alone: its document is."""

        def plan(snapshot: ChunksSnapshot) -> tuple[ChunkWrite, list[str]]:
            row = snapshot.rows([chunk_id], ["chunk_id", "tenant", "kind"]).get(chunk_id)
            if row is None or row["tenant"] != tenant or row["kind"] == "chunk":
                raise NotFoundError(f"no document or derived row {chunk_id!r}")
            doomed = [chunk_id, *sorted(snapshot.derived_from([chunk_id]))]
            return ChunkWrite(delete=doomed), doomed

        derived, version = self.doors.chunks.write(plan, what="erasing a derived row")
        return self._purged(chunk_id, tenant, reason, [], derived, version)

    def _purged(
        self, item_id: str, tenant: str, reason: str, chunks: Sequence[str], derived: Sequence[str], version: int
    ) -> ForgetReport:
        purged = self.doors.maintenance.purge_history()
        return ForgetReport(
            item_id=item_id,
            tenant=tenant,
            reason=reason,
            erased_chunks=tuple(chunks),
            erased_derived=tuple(derived),
            table_version=version,
            versions_purged=purged,
            versions_left=self.doors.maintenance.versions_left(),
        )


def _sync_change(record: Mapping[str, Any], origin: str) -> tuple[str, GovernanceTags]:
    """(doc id, new tags) of one sync record, in the JSONL shape; text, if present, is ignored."""
    try:
        if not isinstance(record, Mapping):
            raise InvalidValueError(f"a sync record must be an object, not {type(record).__name__}")
        doc_id = record.get("id")
        if not isinstance(doc_id, str) or not doc_id or len(doc_id) > MAX_ID_LENGTH:
            raise InvalidValueError(f"id {doc_id!r} must be text of 1 to {MAX_ID_LENGTH} characters")
        unknown = set(record) - RECORD_FIELDS
        if unknown:
            raise InvalidValueError(f"unknown fields {sorted(unknown)}")
        tags = parse_tags(
            tenant=record.get("tenant"),
            acl=record.get("acl"),
            labels=record.get("labels"),
            classification=record.get("classification"),
        )
    except ValueError as exc:
        raise InvalidSourceError(origin, str(exc)) from None
    return doc_id, tags


@dataclass(frozen=True, kw_only=True)
class Rederived:
    """The rows derived from changed parents, as one write needs them.

    ``derived``: re-tagged derived rows; ``orphans``: ids of derived rows that lose a parent (they
    go too: a row whose lineage is broken can no longer be evaluated); ``read``: rows whose tags
    were read but do not change (other parents of a derived row), rewritten unchanged so that the
    commit depends on them.
    """

    derived: list[dict[str, Any]]
    orphans: list[str]
    read: list[dict[str, Any]]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every row the write must carry: the re-tagged and the read."""
        return [*self.derived, *self.read]


def rederive(
    snapshot: ChunksSnapshot, registry: Mapping[str, Sequence[str]], parents: Mapping[str, Mapping[str, Any] | None]
) -> Rederived:
    """Rows derived (transitively) from ``parents``, re-tagged from their parents' tags as they will be.

    ``parents`` maps chunk id -> its row with its new tags, or None for a row about to disappear;
    every other row is read from ``snapshot``.
    """
    derived = snapshot.derived_from(parents)
    current: dict[str, Mapping[str, Any] | None] = dict(parents)
    others = {p for row in derived.values() for p in row["parents"]} - current.keys() - derived.keys()
    read = snapshot.rows(others)
    updated: list[dict[str, Any]] = []
    orphans: list[str] = []
    for chunk_id in _parents_first(derived):
        row = derived[chunk_id]
        parent_rows = [current[p] if p in current else read.get(p) for p in row["parents"]]
        if any(parent is None for parent in parent_rows):
            current[chunk_id] = None
            orphans.append(chunk_id)
            continue
        tags = propagate([GovernanceTags.from_row(parent, registry) for parent in parent_rows if parent is not None])
        current[chunk_id] = new = {**row, **tags.row_columns()}
        updated.append(new)
    return Rederived(derived=updated, orphans=orphans, read=list(read.values()))


def source_records(rows: Iterable[Mapping[str, Any]], registry: Mapping[str, Sequence[str]]) -> list[dict[str, Any]]:
    """The source record of each document whose chunks are among ``rows`` (one snapshot's), read
    off those chunks: tags, content version, uri, metadata, count.

    Why: a record is stamped with the ``chunks`` version it describes, and a later stamp wins. A
    writer that stamps a record later than an ingest's commit must therefore say what the chunks
    hold at its own stamp, content included, or the ingest's record (earlier stamp, later arrival)
    is refused and the record keeps the content the chunks no longer have. While two ingests of one
    document briefly both hold chunks, the later-made chunks are taken; the ingest that removes
    the other's records the document again.
    """
    by_document: dict[DocumentKey, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row["kind"] == "chunk":
            by_document.setdefault((row["tenant"], row["doc_id"]), []).append(row)
    records: list[dict[str, Any]] = []
    for chunks in by_document.values():
        latest = max(chunks, key=lambda row: (row["created_at"], row["doc_version"]))
        tags = GovernanceTags.from_row(latest, registry)
        records.append({
            "doc_id": latest["doc_id"],
            "uri": latest["source_uri"],
            "doc_version": latest["doc_version"],
            "tags_fingerprint": tags.fingerprint(),
            **tags.row_columns(),
            "chunk_count": sum(row["doc_version"] == latest["doc_version"] for row in chunks),
            "metadata": latest["metadata"],
            "ingest_run_id": latest["ingest_run_id"],
            "ingested_at": latest["created_at"],
        })  # fmt: skip
    return records


def _parents_first(rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Derived row ids ordered so every row comes after those of its parents that are derived too."""
    ordered: list[str] = []
    seen: set[str] = set()

    def visit(chunk_id: str) -> None:
        if chunk_id in seen:
            return
        seen.add(chunk_id)
        for parent in rows[chunk_id]["parents"]:
            if parent in rows:
                visit(parent)
        ordered.append(chunk_id)

    for chunk_id in sorted(rows):
        visit(chunk_id)
    return ordered


def read_sync_file(path: Path) -> list[dict[str, Any]]:
    """Sync records of a JSONL file; a malformed line stops the sync before anything changes."""
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSourceError(str(path), f"cannot read: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise InvalidSourceError(f"{path}:{number}", f"not valid JSON ({exc.msg})") from None
    return records
