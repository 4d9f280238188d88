"""What the framework vector stores share: the governance a text they write gets, the records they
write, and reading and erasing by id, all as their one caller.

A vector store writes as well as reads, so it must say who may read what it writes. ``tags`` does:
the same tags for every text (``{"allow": [...], "labels": [...], "classification": ...}``), or
each text's own from its metadata (``AclFromMetadata``, as ``ragwarden import`` reads them). A
store with no ``tags`` refuses to write, and a text whose metadata names no ACL is refused: nothing
is written open. The warehouse embeds what is written (one vector per chunk, the text cut where it
is longer than its model reads) unless the framework's own embedding model is given, named, and
the warehouse's (it checks the name).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigurationError, InvalidRequestError
from ..ingest.importers import TAG_FIELDS, AclFromMetadata, json_ready, tag_fields
from ..retrieval.search import MAX_K
from .binding import Binding, with_options

LOOKUP_IDS = 100
"""Ids looked up (or sought for erasure) per search: a filter's values are bounded (``FilterLimits``)."""
ERASED_BY_STORE = "deleted through a vector store"


@dataclass(frozen=True, kw_only=True)
class WriteTags:
    """Who may read what a store writes: the same tags for every text, or each text's from its
    metadata."""

    fixed: Mapping[str, Any] | None = None
    from_metadata: AclFromMetadata | None = None

    @classmethod
    def of(cls, tags: Mapping[str, Any] | AclFromMetadata | str | None) -> WriteTags | None:
        """The tags a store is given (a text: an ``--acl-from-metadata`` mapping); None if none."""
        if tags is None:
            return None
        if isinstance(tags, str):
            tags = AclFromMetadata.parse(tags)
        if isinstance(tags, AclFromMetadata):
            return cls(from_metadata=tags)
        if not isinstance(tags, Mapping):
            raise ConfigurationError(f"tags must be a mapping of {', '.join(TAG_FIELDS)}, or an AclFromMetadata; "
                                     f"not {type(tags).__name__}")  # fmt: skip
        unknown = sorted(set(tags) - set(TAG_FIELDS) | ({"tenant"} & set(tags)))
        if unknown:
            raise ConfigurationError(f"tags {unknown} are not understood: give allow, deny, labels and classification "
                                     "(the tenant is the caller's)")  # fmt: skip
        missing = [name for name in ("allow", "classification") if name not in tags]
        if missing:
            raise ConfigurationError(f"tags must name {' and '.join(missing)}: who may read what this store writes")
        return cls(fixed=dict(tags))

    def of_text(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        return dict(self.fixed) if self.fixed is not None else self.from_metadata.of_metadata(metadata)  # type: ignore[union-attr]


def write_texts(
    binding: Binding,
    tags: WriteTags | None,
    texts: Sequence[str],
    metadatas: Sequence[Mapping[str, Any]] | None = None,
    ids: Sequence[str | None] | None = None,
    *,
    vectors: Sequence[Sequence[float]] | None = None,
    model: str | None = None,
    restore_erased: bool = False,
) -> list[str]:
    """Write ``texts`` (each with its metadata and id; an id made where none is given) as the
    binding's caller, one document each; their ids, in order. A refused text raises, naming it and
    why (the others are written); writing an id again replaces that document."""
    if tags is None:
        raise ConfigurationError("this store was given no tags, so it cannot say who may read what it writes: "
                                 "give tags={'allow': [...], 'classification': ...} or an AclFromMetadata")  # fmt: skip
    metadatas = list(metadatas) if metadatas is not None else [{} for _ in texts]
    ids = [i if i is not None else uuid.uuid4().hex for i in (ids if ids is not None else [None] * len(texts))]
    if not len(texts) == len(metadatas) == len(ids) or (vectors is not None and len(vectors) != len(texts)):
        raise InvalidRequestError(f"{len(texts)} texts need as many metadatas and ids; given {len(metadatas)} and {len(ids)}")
    records = []
    for number, (text, metadata, doc_id) in enumerate(zip(texts, metadatas, ids, strict=True)):
        record = {"id": doc_id, "text": text, "metadata": json_ready(metadata or {}), **tag_fields(tags.of_text(metadata or {}))}
        if vectors is not None:
            record |= {"vector": np.asarray(vectors[number], dtype=np.float64), "model": model}
        records.append(record)
    if not records:
        return []
    written = binding.ingest(records, restore_erased=restore_erased)
    if written.refused:
        refused = "; ".join(f"{source}: {reason}" for source, reason in written.refused)
        raise InvalidRequestError(f"{len(written.refused)} of {len(records)} texts refused (the others are written): {refused}")
    return ids


def by_ids(binding: Binding, ids: Sequence[str], field: str = "doc_id") -> list[dict[str, Any]]:
    """The chunks the caller may read whose ``field`` is one of ``ids``, in the order of ``ids``
    (a missing or forbidden id gives nothing, alike). Found by a governed search narrowed to them."""
    found: list[dict[str, Any]] = []
    for start in range(0, len(ids), LOOKUP_IDS):
        wanted = [str(i) for i in ids[start : start + LOOKUP_IDS]]
        found += with_options(binding, filter={field: {"$in": wanted}}).search(" ".join(wanted)[:1000], MAX_K)
    order = {doc_id: n for n, doc_id in enumerate(str(i) for i in ids)}
    return sorted(found, key=lambda hit: (order[_field(hit, field)], hit["position"] or 0))


def erase(binding: Binding, ids: Iterable[str], *, reason: str = ERASED_BY_STORE) -> int:
    """Erase each document of ``ids`` the caller may erase; how many were (a missing id is no error)."""
    return sum(binding.forget(str(doc_id), reason=reason) for doc_id in ids)


def _field(hit: Mapping[str, Any], field: str) -> str:
    return str(hit[field] if field in hit else hit["metadata"].get(field))
