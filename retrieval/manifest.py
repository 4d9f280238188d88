"""The context manifest: what a caller needs to label whatever it makes from retrieved chunks.

Every search answer carries one, and an MCP session keeps the running union of all it returned,
so an agent's output can be classified at least as high as anything that went into it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..governance.tags import Classification
from .hits import Hit


@dataclass(frozen=True, kw_only=True)
class ContextManifest:
    """Chunk ids, the union of their labels, the highest classification, and the versions they came from."""

    chunk_ids: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    classification: Classification = Classification.PUBLIC
    table_versions: tuple[int, ...] = ()
    policy_versions: tuple[str, ...] = ()
    doc_versions: tuple[str, ...] = ()

    @classmethod
    def of(cls, hits: Iterable[Hit]) -> ContextManifest:
        return cls().including(hits)

    def including(self, hits: Iterable[Hit]) -> ContextManifest:
        """This manifest widened by ``hits``: ids in first-seen order, labels and versions as sorted sets."""
        hits = list(hits)
        return ContextManifest(
            chunk_ids=tuple(dict.fromkeys([*self.chunk_ids, *(h.chunk_id for h in hits)])),
            labels=tuple(sorted({*self.labels, *(label for h in hits for label in h.labels)})),
            classification=max([self.classification, *(h.classification for h in hits)]),
            table_versions=tuple(sorted({*self.table_versions, *(h.table_version for h in hits)})),
            policy_versions=tuple(sorted({*self.policy_versions, *(h.policy_version for h in hits)})),
            doc_versions=tuple(sorted({*self.doc_versions, *(f"{h.doc_id}@{h.doc_version}" for h in hits)})),
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "chunk_ids": list(self.chunk_ids),
            "labels": list(self.labels),
            "classification": self.classification.label,
            "table_versions": list(self.table_versions),
            "policy_versions": list(self.policy_versions),
            "doc_versions": list(self.doc_versions),
        }
