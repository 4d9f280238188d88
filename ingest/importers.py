"""Collections another store holds, read as records that bring their vectors (``ragwarden import``).

A team's prototype already has its rows embedded: ids, texts, vectors and metadata. They come in
as they are, never embedded again, with the model that made them checked against the
warehouse's. What they never had is an ACL: each row's governance comes from its own metadata
(``AclFromMetadata``: which metadata key holds the allow list, the labels, the level...) or from a
manifest by id or by source (``AclManifest``). A row with no ACL is refused and counted, never
imported open. An import is resumable: a row already written with the same text, tags and vector
is found unchanged and skipped, so running it again after a kill writes only what is missing.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, datetime
from datetime import time as dt_time
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from ..errors import InvalidValueError
from ..state import open_foreign
from .records import NO_ACL

T = TypeVar("T")

TAG_FIELDS = ("allow", "deny", "labels", "classification", "tenant")
"""What a row's governance is made of, each read from a metadata key or given by a manifest."""


@dataclass(frozen=True, kw_only=True)
class Collected:
    """One row of a collection, as its store keeps it."""

    id: str
    text: str | None
    vector: np.ndarray
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class CollectedBatch:
    """Rows of a collection read together: ids and texts in parallel lists, the vectors as one
    array when the store holds them so, and the metadata either row by row or, as a columnar
    store keeps it, as one Arrow table (a column per key). From the columns a mapping finds the
    few distinct tag sets of a batch without reading each row's values in Python; each row's
    metadata is made from those same columns, so the two never disagree."""

    ids: Sequence[Any]
    texts: Sequence[Any]
    vectors: np.ndarray | Sequence[Any]
    metadata: Sequence[Mapping[str, Any]] | pa.Table

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def columns(self) -> pa.Table | None:
        """The metadata as Arrow columns, when it came so."""
        return self.metadata if isinstance(self.metadata, pa.Table) else None

    @cached_property
    def metadata_rows(self) -> Sequence[Mapping[str, Any]]:
        """Each row's metadata."""
        return self.metadata.to_pylist() if isinstance(self.metadata, pa.Table) else self.metadata

    def row(self, n: int) -> Collected:
        return Collected(id=self.ids[n], text=self.texts[n], vector=self.vectors[n], metadata=self.metadata_rows[n])

    def rows(self) -> list[Collected]:
        return [self.row(n) for n in range(len(self))]

    def part(self, start: int, stop: int) -> CollectedBatch:
        """Rows ``start`` to ``stop`` (not included)."""
        metadata = self.metadata.slice(start, stop - start) if isinstance(self.metadata, pa.Table) else self.metadata[start:stop]
        return CollectedBatch(ids=self.ids[start:stop], texts=self.texts[start:stop], vectors=self.vectors[start:stop],
                              metadata=metadata)  # fmt: skip

    @classmethod
    def of_rows(cls, rows: Sequence[Collected]) -> CollectedBatch:
        """Rows read one at a time, as a batch."""
        return cls(ids=[row.id for row in rows], texts=[row.text for row in rows], vectors=[row.vector for row in rows],
                   metadata=[row.metadata for row in rows])  # fmt: skip

    @classmethod
    def joined(cls, batches: Sequence[CollectedBatch]) -> CollectedBatch:
        """``batches`` as one (the metadata kept as columns when every batch has columns of one schema)."""
        if len(batches) == 1:
            return batches[0]
        vectors = [batch.vectors for batch in batches]
        arrays = all(isinstance(v, np.ndarray) and v.ndim == 2 for v in vectors) and len({v.shape[1] for v in vectors}) == 1  # type: ignore[union-attr]
        tables = [batch.columns for batch in batches]
        same = all(t is not None and t.schema == tables[0].schema for t in tables)  # type: ignore[union-attr]
        return cls(ids=[i for batch in batches for i in batch.ids], texts=[t for batch in batches for t in batch.texts],
                   vectors=np.concatenate(vectors) if arrays else [v for part in vectors for v in part],
                   metadata=pa.concat_tables(tables) if same else [m for batch in batches for m in batch.metadata_rows])  # type: ignore[arg-type]  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class AclFromMetadata:
    """Which metadata key holds each tag: ``allow=owner_groups,labels=tags,classification=level``.
    A list value is taken as it is; a text value is split at commas (Chroma keeps scalars)."""

    keys: Mapping[str, str]

    @classmethod
    def parse(cls, spec: str) -> AclFromMetadata:
        keys: dict[str, str] = {}
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            tag, _, key = part.partition("=")
            if tag not in TAG_FIELDS or not key.strip():
                raise InvalidValueError(f"--acl-from-metadata part {part!r} must be TAG=KEY with TAG one of {', '.join(TAG_FIELDS)}")
            if tag in keys:
                raise InvalidValueError(f"--acl-from-metadata names {tag!r} twice")
            keys[tag] = key.strip()
        if "allow" not in keys:
            raise InvalidValueError("--acl-from-metadata must say which metadata key holds the allow list (allow=KEY)")
        return cls(keys=keys)

    def tags_of(self, row: Collected) -> dict[str, Any]:
        """The tag fields ``row``'s metadata gives (a missing key gives none: the row is then refused)."""
        return self.of_metadata(row.metadata)

    def grouped(self, batch: CollectedBatch) -> tuple[list[dict[str, Any]], list[int]]:
        """The distinct tag fields of ``batch``'s rows, and each row's place among them. A batch
        with Arrow columns is grouped by the values of the keys this mapping reads, when each is
        text or a list of text (equal values there give equal tags); otherwise each row is its own."""
        keys = _column_keys(batch.columns, list(self.keys.values()))
        if keys is None:
            return [self.of_metadata(metadata) for metadata in batch.metadata_rows], list(range(len(batch)))
        places: dict[Hashable, int] = {}
        found: list[dict[str, Any]] = []
        which: list[int] = []
        for n, key in enumerate(keys if keys else [()] * len(batch)):
            place = places.get(key)
            if place is None:
                place = places[key] = len(found)
                found.append(self.of_metadata(batch.metadata_rows[n]))
            which.append(place)
        return found, which

    def of_metadata(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """The tag fields ``metadata`` gives, read from the keys this mapping names."""
        found: dict[str, Any] = {}
        for tag, key in self.keys.items():
            value = metadata.get(key)
            if value is None:
                continue
            if tag in ("allow", "deny", "labels"):
                found[tag] = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
            else:
                found[tag] = value
        return found


@dataclass(frozen=True, kw_only=True)
class AclManifest:
    """Tags given by row id or by source (the metadata's ``source``): a JSONL file of
    ``{"id": ...}`` or ``{"source": ...}`` lines, each with any of ``allow``, ``deny``,
    ``labels``, ``classification``, ``tenant``. A row's id line wins over its source's."""

    by_id: Mapping[str, Mapping[str, Any]]
    by_source: Mapping[str, Mapping[str, Any]]

    @classmethod
    def read(cls, path: Path) -> AclManifest:
        by_id: dict[str, Mapping[str, Any]] = {}
        by_source: dict[str, Mapping[str, Any]] = {}
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidValueError(f"{path} line {number}: not valid JSON ({exc.msg})") from None
            unknown = set(entry) - {"id", "source", *TAG_FIELDS} if isinstance(entry, dict) else {"?"}
            if unknown or ("id" in entry) == ("source" in entry):
                raise InvalidValueError(f"{path} line {number}: an object with id or source (one of them) and any of "
                                        f"{', '.join(TAG_FIELDS)}; found {sorted(entry) if isinstance(entry, dict) else entry!r}")  # fmt: skip
            tags = {k: v for k, v in entry.items() if k in TAG_FIELDS}
            (by_id if "id" in entry else by_source)[str(entry.get("id", entry.get("source")))] = tags
        return cls(by_id=by_id, by_source=by_source)

    def tags_of(self, row: Collected) -> dict[str, Any]:
        source = row.metadata.get("source")
        return dict(self.by_id.get(row.id) or (self.by_source.get(str(source), {}) if source is not None else {}))

    def grouped(self, batch: CollectedBatch) -> tuple[list[dict[str, Any]], list[int]]:
        """Each row's tag fields (by its id or its source), each row its own place."""
        return [self.tags_of(batch.row(n)) for n in range(len(batch))], list(range(len(batch)))


def _column_keys(columns: pa.Table | None, names: Sequence[str]) -> list[tuple[Any, ...]] | None:
    """Each row's values of the columns ``names`` as one key, when every one holds text or lists
    of text (one Arrow type per column: equal keys are equal values, never 1 and True); None
    otherwise. A column the table lacks is a key no row has."""
    if columns is None:
        return None
    values: list[list[Any]] = []
    for name in dict.fromkeys(names):
        if name not in columns.column_names:
            continue
        column = columns.column(name)
        if _is_text(column.type):
            values.append(column.to_pylist())
        elif (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) and _is_text(column.type.value_type):
            values.append([None if v is None else tuple(v) for v in column.to_pylist()])
        else:
            return None
    return list(zip(*values, strict=True))


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def as_record(row: Collected, tags: Mapping[str, Any], *, tenant: str | None, classification: str | None, model: str,
              origin: str) -> dict[str, Any]:  # fmt: skip
    """``row`` as an ``ingest_records`` record bringing its vector (its metadata kept)."""
    record: dict[str, Any] = {"id": row.id, "text": row.text, "tenant": tenant, "vector": row.vector, "model": model,
                              "uri": f"{origin}#{row.id}", **tag_fields(tags, classification=classification)}  # fmt: skip
    metadata = json_ready(row.metadata)
    if metadata:
        record["metadata"] = metadata
    return record


def tag_fields(tags: Mapping[str, Any], *, classification: str | None = None) -> dict[str, Any]:
    """A record's governance fields from ``tags`` (``TAG_FIELDS``). Nothing about access is made
    up: tags with no ``allow`` give no ``acl``, and with no classification (from the tags, else
    ``classification`` given for all) none, so ingest refuses the record, naming why."""
    fields: dict[str, Any] = {}
    if "tenant" in tags:
        fields["tenant"] = tags["tenant"]
    if tags.get("classification", classification) is not None:
        fields["classification"] = tags.get("classification", classification)
    if "allow" in tags:
        fields["acl"] = {"allow": tags["allow"], **({"deny": tags["deny"]} if "deny" in tags else {})}
    if "labels" in tags:
        fields["labels"] = tags["labels"]
    return fields


def json_ready(metadata: Mapping[Any, Any]) -> dict[str, Any]:
    """Metadata as a record keeps it: text keys only, each value as JSON holds it (``_as_json``)."""
    return {k: _as_json(v) for k, v in metadata.items() if isinstance(k, str)}


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _as_json(value: Any) -> Any:
    """A metadata value as JSON holds it: a time as ISO 8601 text, lists and objects within; any
    other value as it was (the record check then refuses it, naming why)."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, (datetime, date, dt_time)):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_json(v) for v in value]
    return value


@dataclass(frozen=True, kw_only=True)
class ImportReport:
    """What an import did: rows written, found unchanged (written before: a resumed import), and
    refused (each with its reason; ``without_acl`` of them for want of an ACL)."""

    documents: int
    unchanged: int
    rejected: tuple[tuple[str, str], ...]  # (source, reason)
    without_acl: int
    seconds: float

    def summary(self) -> str:
        rate = (self.documents + self.unchanged) / self.seconds if self.seconds else 0.0
        return (f"imported {self.documents} rows ({self.unchanged} unchanged, {len(self.rejected)} refused, "
                f"{self.without_acl} of them with no ACL) in {self.seconds:.1f} s ({rate:,.0f} rows/s)")  # fmt: skip


def run_import(
    prepare: Callable[[CollectedBatch], T],
    ingest: Callable[[T], Any],
    rows: Iterable[Collected] | Iterable[CollectedBatch],
    *,
    total: int | None,
    progress: bool | None,
    chunk_rows: int,
) -> ImportReport:
    """``rows`` (one at a time, or in batches), ``chunk_rows`` at a time: each chunk ``prepare``d
    (read and checked), then ``ingest``ed (one ingest run), as ``Warehouse.import_collection``
    says. The next chunk is read and prepared on a worker thread while one is ingested: checking
    is Python, and a commit spends much of its time in storage, which lets the Python run beside it."""
    started = time.perf_counter()
    documents = unchanged = without_acl = 0
    rejected: list[tuple[str, str]] = []
    chunks = _chunked(rows, chunk_rows)
    show = sys.stderr.isatty() if progress is None else progress

    def ahead() -> tuple[int, T] | None:
        chunk = next(chunks, None)
        return None if chunk is None else (len(chunk), prepare(chunk))

    with tqdm(total=total, unit="row", disable=not show, desc="import") as bar, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="import-ahead") as worker:  # fmt: skip
        coming = worker.submit(ahead)
        while (ready := coming.result()) is not None:
            coming = worker.submit(ahead)
            count, prepared = ready
            report = ingest(prepared)
            documents, unchanged = documents + report.documents, unchanged + report.unchanged
            rejected += [(r.source, r.reason) for r in report.rejected]
            without_acl += sum(NO_ACL in r.reason for r in report.rejected)
            bar.update(count)
    return ImportReport(documents=documents, unchanged=unchanged, rejected=tuple(rejected), without_acl=without_acl,
                        seconds=time.perf_counter() - started)  # fmt: skip


def _chunked(items: Iterable[Collected] | Iterable[CollectedBatch], size: int) -> Iterator[CollectedBatch]:
    """``items`` (rows, or batches of them) as batches of ``size`` rows (the last shorter)."""
    held: list[CollectedBatch] = []
    count = 0
    for batch in _batches(items, size):
        held.append(batch)
        count += len(batch)
        while count >= size:
            whole = CollectedBatch.joined(held)
            yield whole.part(0, size)
            rest = whole.part(size, len(whole))
            held, count = [rest] if len(rest) else [], len(rest)
    if held:
        yield CollectedBatch.joined(held)


def _batches(items: Iterable[Collected] | Iterable[CollectedBatch], size: int) -> Iterator[CollectedBatch]:
    """``items`` as batches: batches as they come, rows gathered ``size`` at a time."""
    rows: list[Collected] = []
    for item in items:
        if isinstance(item, CollectedBatch):
            if rows:
                yield CollectedBatch.of_rows(rows)
                rows = []
            yield item
            continue
        rows.append(item)
        if len(rows) >= size:
            yield CollectedBatch.of_rows(rows)
            rows = []
    if rows:
        yield CollectedBatch.of_rows(rows)


# -- LanceDB ---------------------------------------------------------------------------------


def lancedb_rows(uri: str, table: str, *, id_column: str = "id", text_column: str = "text", vector_column: str = "vector",
                 batch_rows: int = 10_000) -> tuple[int, Iterator[CollectedBatch]]:  # fmt: skip
    """The rows of LanceDB table ``table`` at ``uri``: their count, and the rows ``batch_rows`` at
    a time, as Arrow holds them; every other column is the row's metadata."""
    found = open_foreign(uri, table)
    missing = [c for c in (id_column, vector_column) if c not in found.columns]
    if missing:
        raise InvalidValueError(f"table {table!r} at {uri} has no column {', '.join(map(repr, missing))}; "
                                f"it has {', '.join(found.columns)} (name them with --id-column, --vector-column)")  # fmt: skip

    def rows() -> Iterator[CollectedBatch]:
        for batch in found.batches(batch_rows):
            ids = batch.column(id_column).cast(pa.string()).to_pylist()
            rest = batch.drop_columns([c for c in (id_column, text_column, vector_column) if c in batch.schema.names])
            yield CollectedBatch(ids=ids, vectors=_vectors(batch.column(vector_column), f"column {vector_column!r}"),
                                 texts=batch.column(text_column).to_pylist() if text_column in batch.schema.names else [None] * len(ids),
                                 metadata=pa.Table.from_batches([rest]))  # fmt: skip

    return found.rows, rows()


def lancedb_model(uri: str, table: str) -> str | None:
    """The embedding model a LanceDB table records (its embedding function's model), if any."""
    try:
        functions = json.loads(open_foreign(uri, table).metadata.get(b"embedding_functions", b"[]"))
    except json.JSONDecodeError:
        return None
    for function in functions if isinstance(functions, list) else []:
        model = (function.get("model") or {}).get("name") if isinstance(function, dict) else None
        if isinstance(model, str) and model:
            family = function.get("name")
            return f"{family}/{model}" if "/" not in model and family == "sentence-transformers" else model
    return None


# -- Chroma ----------------------------------------------------------------------------------


def chroma_rows(path: str, collection: str, *, batch_rows: int = 10_000) -> tuple[int, Iterator[Collected]]:
    """The rows of Chroma collection ``collection`` in the persistent database at ``path`` (its
    ``chromadb`` reads it: the ``import`` extra): their count, and the rows a page at a time."""
    found = _chroma_collection(path, collection)

    def rows() -> Iterator[Collected]:
        for offset in range(0, found.count(), batch_rows):
            page = found.get(include=["embeddings", "documents", "metadatas"], limit=batch_rows, offset=offset)
            vectors = np.asarray(page["embeddings"], dtype=np.float32)
            for number, row_id in enumerate(page["ids"]):
                yield Collected(id=row_id, text=page["documents"][number], vector=vectors[number],
                                metadata=dict(page["metadatas"][number] or {}))  # fmt: skip

    return found.count(), rows()


def chroma_model(path: str, collection: str) -> str | None:
    """The model a Chroma collection's embedding function records, if any (a sentence-transformers
    model by its Hugging Face name)."""
    configuration = getattr(_chroma_collection(path, collection), "configuration_json", None) or {}
    function = configuration.get("embedding_function") or {}
    model = (function.get("config") or {}).get("model_name") if isinstance(function, dict) else None
    if not isinstance(model, str) or not model:
        return None
    return f"sentence-transformers/{model}" if "/" not in model and function.get("name") == "sentence_transformer" else model


def _chroma_collection(path: str, collection: str) -> Any:
    try:
        import chromadb
        from chromadb.config import Settings as ChromaSettings
    except ImportError:
        raise InvalidValueError("importing from Chroma needs chromadb: pip install 'ragwarden-datalayer[import]'") from None
    if not Path(path).is_dir():
        raise InvalidValueError(f"no Chroma database at {path}: name the folder its PersistentClient was given")
    client = chromadb.PersistentClient(path=path, settings=ChromaSettings(anonymized_telemetry=False))  # nothing leaves
    held = [c.name if hasattr(c, "name") else str(c) for c in client.list_collections()]
    if collection not in held:
        raise InvalidValueError(f"no collection {collection!r} in the Chroma database at {path} (its collections: {', '.join(held) or 'none'})")
    return client.get_collection(collection, embedding_function=None)


# -- Qdrant ----------------------------------------------------------------------------------


def qdrant_rows(path: str, collection: str, *, text_key: str = "page_content", vector_name: str | None = None,
                batch_rows: int = 10_000) -> tuple[int, Iterator[Collected]]:  # fmt: skip
    """The points of Qdrant collection ``collection`` in the local storage at ``path``
    (``qdrant-client``'s local mode reads it): their count, and the points a page at a time. A
    point's text is its payload's ``text_key``; its metadata the payload's ``metadata`` object
    (LangChain's layout) or else the rest of the payload; its vector the one named
    ``vector_name`` when it has several."""
    client, count = _qdrant_collection(path, collection)

    def rows() -> Iterator[Collected]:
        try:
            offset = None
            while True:
                points, offset = client.scroll(collection, limit=batch_rows, offset=offset, with_vectors=True, with_payload=True)
                for point in points:
                    payload = dict(point.payload or {})
                    text = payload.pop(text_key, None)
                    metadata = payload["metadata"] if isinstance(payload.get("metadata"), dict) else payload
                    yield Collected(id=str(point.id), text=text, vector=_qdrant_vector(point.vector, vector_name, point.id),
                                    metadata=metadata)  # fmt: skip
                if offset is None:
                    return
        finally:
            client.close()

    return count, rows()


def _qdrant_collection(path: str, collection: str) -> tuple[Any, int]:
    try:
        from qdrant_client import QdrantClient
    except ImportError:
        raise InvalidValueError("importing from Qdrant needs qdrant-client: pip install 'ragwarden-datalayer[import]'") from None
    if not Path(path).is_dir():
        raise InvalidValueError(f"no Qdrant storage at {path}: name the folder its local client was given (path=...)")
    client = QdrantClient(path=path)
    held = [c.name for c in client.get_collections().collections]
    if collection not in held:
        client.close()
        raise InvalidValueError(f"no collection {collection!r} in the Qdrant storage at {path} (its collections: {', '.join(held) or 'none'})")
    return client, client.count(collection, exact=True).count


def _qdrant_vector(vector: Any, name: str | None, point: object) -> np.ndarray:
    """A point's vector: the one it has, or the one named ``name`` of its named vectors."""
    if isinstance(vector, dict):
        if name is None and len(vector) == 1:
            name = next(iter(vector))
        if name not in vector:
            raise InvalidValueError(f"point {point} has the vectors {sorted(vector)}: name the one to import with --vector-name")
        vector = vector[name]
    return np.asarray(vector if vector is not None else [np.nan], dtype=np.float32)


def _vectors(column: pa.Array | pa.ChunkedArray, what: str) -> np.ndarray:
    """A vector column as (rows, d) float32 (rows with no vector: NaN, which the record check refuses)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not (pa.types.is_fixed_size_list(array.type) or pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        raise InvalidValueError(f"{what} holds {array.type}, not vectors")
    lengths = {len(v) for v in array.to_pylist() if v is not None} if not pa.types.is_fixed_size_list(array.type) else {array.type.list_size}
    if len(lengths) > 1:
        raise InvalidValueError(f"{what} holds vectors of {sorted(lengths)} numbers; one collection, one dimension")
    size = lengths.pop() if lengths else 0
    out = np.full((len(array), size), np.nan, dtype=np.float32)
    valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if valid.any():
        out[valid] = np.asarray(array.filter(pa.array(valid)).flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, size)
    return out
