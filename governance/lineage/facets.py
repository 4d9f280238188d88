"""Ragwarden's own OpenLineage facets, and the plain data a caller hands over to fill them.

Every facet here is a run facet named ``ragwarden_<topic>``. Its JSON schema ships beside this
module as ``facet_schemas/<ClassName>.json``; the schema's ``$id`` is the facet's ``_schemaURL`` without
the ``#/$defs/<ClassName>`` fragment, so a validator can register the file offline under that id.
A change to a facet's fields is a new schema version (a new URL), never an edit of 1-0-0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import attr
from openlineage.client.facet_v2 import RunFacet

from ...errors import InvalidValueError
from ...release import version

if TYPE_CHECKING:
    import pyarrow as pa

    from ..tags import GovernanceTags

SCHEMA_BASE = "https://ragwarden.dev/spec/facets/1-0-0/"


VERSION = version()
PRODUCER = f"https://ragwarden.dev/ragwarden/{VERSION}"
"""The ``producer`` of our events and the ``_producer`` of every facet ragwarden builds."""


def schema_url(facet_class: str) -> str:
    return f"{SCHEMA_BASE}{facet_class}.json#/$defs/{facet_class}"


@attr.define
class RagwardenChunkingRunFacet(RunFacet):
    """``ragwarden_chunking``: how source text was cut into chunks."""

    tokenizer: str
    window: int
    overlap: int
    chunkCount: int

    @staticmethod
    def _get_schema() -> str:
        return schema_url("RagwardenChunkingRunFacet")


@attr.define
class RagwardenEmbeddingRunFacet(RunFacet):
    """``ragwarden_embedding``: the model that embedded the chunks' text."""

    model: str
    dimension: int

    @staticmethod
    def _get_schema() -> str:
        return schema_url("RagwardenEmbeddingRunFacet")


@attr.define
class RagwardenGovernanceRunFacet(RunFacet):
    """``ragwarden_governance``: counts of the governance tags written (never principals)."""

    tenants: list[str]
    labelCounts: dict[str, int]
    classificationCounts: dict[str, int]
    aclClauses: int
    documents: int
    derivedRows: int

    @staticmethod
    def _get_schema() -> str:
        return schema_url("RagwardenGovernanceRunFacet")


@attr.define
class RagwardenSourcesRunFacet(RunFacet):
    """``ragwarden_sources``: how many sources were read, and how many the event lists."""

    sourceCount: int
    listedInputs: int

    @staticmethod
    def _get_schema() -> str:
        return schema_url("RagwardenSourcesRunFacet")


def _non_negative(**counts: int) -> None:
    _non_negative_counts(counts)


def _non_negative_counts(counts: Mapping[str, int]) -> None:
    for name, value in counts.items():
        if value < 0:
            raise InvalidValueError(f"{name} must be zero or more, not {value}")


@dataclass(frozen=True)
class Chunking:
    """How a run chunked: ``window`` tokens of ``tokenizer`` per chunk, ``overlap`` shared."""

    tokenizer: str
    window: int
    overlap: int
    chunk_count: int

    def __post_init__(self) -> None:
        if self.window < 1 or not 0 <= self.overlap < self.window:
            raise InvalidValueError(f"need window >= 1 and 0 <= overlap < window, got {self.window}/{self.overlap}")
        _non_negative(chunk_count=self.chunk_count)

    def facet(self) -> RagwardenChunkingRunFacet:
        return RagwardenChunkingRunFacet(self.tokenizer, self.window, self.overlap, self.chunk_count, producer=PRODUCER)


@dataclass(frozen=True)
class Embedding:
    """The embedding model and the length of its vectors."""

    model: str
    dimension: int

    def __post_init__(self) -> None:
        if self.dimension < 1:
            raise InvalidValueError(f"dimension must be at least 1, not {self.dimension}")

    def facet(self) -> RagwardenEmbeddingRunFacet:
        return RagwardenEmbeddingRunFacet(self.model, self.dimension, producer=PRODUCER)


@dataclass(frozen=True)
class GovernanceSummary:
    """Counts of the governance tags a run wrote: rows per label and per classification level,
    distinct ACL clauses, tenants, documents and derived rows. Build it with :meth:`of`."""

    tenants: frozenset[str]
    label_counts: Mapping[str, int]
    classification_counts: Mapping[str, int]
    acl_clauses: int
    documents: int
    derived_rows: int = 0

    def __post_init__(self) -> None:
        _non_negative(acl_clauses=self.acl_clauses, documents=self.documents, derived_rows=self.derived_rows)
        _non_negative_counts(self.label_counts)
        _non_negative_counts(self.classification_counts)
        object.__setattr__(self, "tenants", frozenset(self.tenants))
        object.__setattr__(self, "label_counts", MappingProxyType(dict(sorted(self.label_counts.items()))))
        object.__setattr__(
            self, "classification_counts", MappingProxyType(dict(sorted(self.classification_counts.items())))
        )

    @classmethod
    def of(cls, rows: Iterable[GovernanceTags], *, documents: int, derived_rows: int = 0) -> GovernanceSummary:
        """Summarise the tags of the rows written (one ``GovernanceTags`` per row)."""
        tenants: set[str] = set()
        labels: Counter[str] = Counter()
        levels: Counter[str] = Counter()
        clauses: set[frozenset[str]] = set()
        rows = list(rows)
        held = dict(zip(map(id, rows), rows, strict=True))  # a run's rows share a few tag sets: each summed once
        for place, times in Counter(map(id, rows)).items():
            tags = held[place]
            tenants.add(tags.tenant)
            labels.update(dict.fromkeys(tags.labels, times))
            levels[tags.classification.label] += times
            clauses.update(tags.acl_clauses)
        return cls(frozenset(tenants), labels, levels, len(clauses), documents, derived_rows)

    def facet(self) -> RagwardenGovernanceRunFacet:
        return RagwardenGovernanceRunFacet(
            sorted(self.tenants),
            dict(self.label_counts),
            dict(self.classification_counts),
            self.acl_clauses,
            self.documents,
            self.derived_rows,
            producer=PRODUCER,
        )


@dataclass(frozen=True)
class ChunksOutput:
    """The ``chunks`` table as a run left it, for the run's COMPLETE event.

    ``version``: the table version after the run's commit. ``schema``: the table's Arrow schema.
    ``rows``: rows the run wrote. The rest fill ragwarden's facets and the column lineage:
    ``text`` comes from the sources' ``text`` when ``chunking`` is given, ``vector`` from the
    chunk ``text`` when ``embedding`` is given.
    """

    version: int | str
    schema: pa.Schema | None = None
    rows: int | None = None
    chunking: Chunking | None = None
    embedding: Embedding | None = None
    governance: GovernanceSummary | None = None
