"""OpenLineage for ragwarden's runs: the events of each ingest, derive, sync and forget, with
ragwarden's own facets. Pure: what an event says. Delivering them (the spool, the transports) is
``lineage_emitter``'s, ``lineage_transport``'s and ``state.lineage_spool``'s."""

from .events import MAX_LISTED_INPUTS, LineageRun, event_from_json, location_dataset, source_dataset
from .facets import Chunking, ChunksOutput, Embedding, GovernanceSummary

__all__ = [
    "MAX_LISTED_INPUTS",
    "Chunking",
    "ChunksOutput",
    "Embedding",
    "GovernanceSummary",
    "LineageRun",
    "event_from_json",
    "location_dataset",
    "source_dataset",
]
