"""OpenLineage for ragwarden's runs: the events of each ingest, derive, sync and forget, with
ragwarden's own facets, delivered through a durable spool to where the environment says."""

from .emitter import FlushReport, LineageEmitter, RunScope
from .events import MAX_LISTED_INPUTS, LineageRun, location_dataset, source_dataset
from .facets import Chunking, ChunksOutput, Embedding, GovernanceSummary

__all__ = [
    "MAX_LISTED_INPUTS",
    "Chunking",
    "ChunksOutput",
    "Embedding",
    "FlushReport",
    "GovernanceSummary",
    "LineageEmitter",
    "LineageRun",
    "RunScope",
    "location_dataset",
    "source_dataset",
]
