"""Search results with what a caller needs to cite them and to label what it makes from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..governance.tags import Classification
from ..state import TAG_COLUMNS, row_metadata

RESULT_COLUMNS = [
    "chunk_id", "doc_id", "source_uri", "text", "kind", "parents", "tenant", "acl_allow", "acl_deny",
    "acl_clauses", "labels", "classification", "doc_version", "position", "metadata",
]  # fmt: skip
"""The columns a hit is made from."""
CURRENT_COLUMNS = ("source_uri", "metadata", *TAG_COLUMNS)
"""What is read anew at every table version rather than held: who may read a row (its tags, which
every sync changes), where its document lives and what its record says of it (a re-ingest under a
new uri or with new metadata keeps the chunk ids, which hash the text)."""
CONTENT_COLUMNS = [name for name in RESULT_COLUMNS if name not in CURRENT_COLUMNS]
"""What a row says, fixed for a ``chunk_id`` (ids name the text and version they were made from):
held by the serving index and by held scans across versions."""


@dataclass(frozen=True, kw_only=True, slots=True)  # slots: built once per result, on the hot path
class Hit:
    """One retrieved chunk, with its citation, its governance and why the caller could see it."""

    chunk_id: str
    doc_id: str
    source_uri: str
    text: str
    score: float
    labels: tuple[str, ...]
    classification: Classification
    doc_version: str
    position: int | None
    reason: str
    kind: str = "chunk"
    parents: tuple[str, ...] = ()
    table_version: int = 0
    policy_version: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """The source record's metadata (a derived row's: ``derived_from``, its parents' citations)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "chunk_id": self.chunk_id,
            "doc_id": self.doc_id,
            "source_uri": self.source_uri,
            "text": self.text,
            "score": self.score,
            "labels": list(self.labels),
            "classification": self.classification.label,
            "doc_version": self.doc_version,
            "position": self.position,
            "reason": self.reason,
            "kind": self.kind,
            "parents": list(self.parents),
            "table_version": self.table_version,
            "policy_version": self.policy_version,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def of_row(
        cls, row: Mapping[str, Any], *, score: float, reason: str, table_version: int, policy_version: str
    ) -> Hit:
        """The hit for a ``chunks`` row the caller was admitted to, at ``table_version``."""
        return cls(
            chunk_id=row["chunk_id"],
            doc_id=row["doc_id"],
            source_uri=row["source_uri"],
            text=row["text"],
            score=score,
            labels=tuple(row["labels"]),
            classification=Classification(row["classification"]),
            kind=row["kind"],
            parents=tuple(row["parents"]),
            doc_version=row["doc_version"],
            position=row["position"],
            reason=reason,
            table_version=table_version,
            policy_version=policy_version,
            metadata=row_metadata(row),
        )
