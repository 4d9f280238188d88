"""Arrow schemas of the warehouse tables (DESIGN §3): the contract every part reads and writes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

CHUNKS = "chunks"
SOURCES = "sources"
CLAUSES = "acl_clauses"
POLICIES = "policies"
LABELS = "labels"
AUDIT = "audit"
AUDIT_CHECKPOINTS = "audit_checkpoints"
AUDIT_SEALS = "audit_seals"
API_KEYS = "api_keys"
DIRECTORY = "directory"
ERASURES = "erasures"

TAG_COLUMNS = ("tenant", "acl_allow", "acl_deny", "acl_clauses", "labels", "classification")

_strings = pa.list_(pa.string())
_timestamp = pa.timestamp("us", tz="UTC")


def chunks_schema(dimension: int) -> pa.Schema:
    """One row per retrievable item: a chunk now, a summary or agent memory later."""
    return pa.schema(
        [
            pa.field("chunk_id", pa.string(), nullable=False),
            pa.field("doc_id", pa.string(), nullable=False),
            pa.field("source_uri", pa.string()),
            pa.field("doc_version", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("position", pa.int32()),
            pa.field("text", pa.string(), nullable=False),
            pa.field("vector", pa.list_(pa.float32(), dimension)),
            pa.field("tenant", pa.string(), nullable=False),
            pa.field("acl_allow", _strings, nullable=False),
            pa.field("acl_deny", _strings, nullable=False),
            pa.field("acl_clauses", _strings, nullable=False),
            pa.field("labels", _strings, nullable=False),
            pa.field("classification", pa.int8(), nullable=False),
            pa.field("parents", _strings, nullable=False),
            pa.field("ingest_run_id", pa.string()),
            pa.field("embedding_model", pa.string()),
            pa.field("created_at", _timestamp),
            # Last, so a table from before it gains it in place (null: no metadata). Lance's JSON
            # type, so narrowing filters can read fields of it inside the prefilter.
            pa.field("metadata", pa.json_()),
        ]
    )


def row_metadata(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``chunks`` row's ``metadata`` (JSON text; null or absent: none) as a mapping."""
    stored = row.get("metadata")
    if not stored:
        return {}
    found = json.loads(stored)
    return found if isinstance(found, dict) else {}


SOURCES_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("uri", pa.string()),
        pa.field("doc_version", pa.string(), nullable=False),
        pa.field("tags_fingerprint", pa.string(), nullable=False),
        pa.field("acl_allow", _strings, nullable=False),
        pa.field("acl_deny", _strings, nullable=False),
        pa.field("acl_clauses", _strings, nullable=False),
        pa.field("labels", _strings, nullable=False),
        pa.field("classification", pa.int8(), nullable=False),
        pa.field("chunk_count", pa.int32(), nullable=False),
        pa.field("metadata", pa.string()),
        pa.field("ingest_run_id", pa.string()),
        pa.field("ingested_at", _timestamp),
        # The ``chunks`` version whose commit this row describes: a row is replaced only by one of a
        # later commit, so two writers finishing out of order leave the later commit's state.
        pa.field("chunks_version", pa.int64(), nullable=False),
    ]
)

CLAUSES_SCHEMA = pa.schema(
    [
        pa.field("token", pa.string(), nullable=False),
        pa.field("principals", _strings, nullable=False),
    ]
)

LABELS_SCHEMA = pa.schema([pa.field("label", pa.string(), nullable=False)])
"""Every label any row has carried: the compiled filter names the ones a caller is not cleared for."""

POLICIES_SCHEMA = pa.schema(
    [
        # Commit order: the policy in force is the one of the highest seq, whatever the clocks say.
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("version", pa.string(), nullable=False),
        pa.field("source", pa.string()),
        pa.field("text", pa.string(), nullable=False),
        pa.field("installed_at", _timestamp),
    ]
)

PRIMARY_KEY = b"lance-schema:unenforced-primary-key"

AUDIT_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("receipt_id", pa.string(), nullable=False),
        pa.field("time", _timestamp, nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("operation", pa.string(), nullable=False),
        pa.field("subject", pa.string(), nullable=False),
        pa.field("actor", pa.string()),
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("purpose", pa.string()),
        pa.field("query_fingerprint", pa.string()),
        pa.field("query", pa.string()),
        pa.field("chunk_ids", _strings, nullable=False),
        pa.field("doc_ids", _strings, nullable=False),
        pa.field("labels", _strings, nullable=False),
        pa.field("chunk_labels", pa.string(), nullable=False),
        pa.field("withheld", pa.int32(), nullable=False),
        pa.field("allowed", pa.bool_(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("policy_version", pa.string()),
        pa.field("table_version", pa.int64()),
        pa.field("details", pa.string(), nullable=False),
        pa.field("prev_hash", pa.string(), nullable=False),
        pa.field("hash", pa.string(), nullable=False),
        # Last, so a log from before per-writer chains gains it in place; null there: the one legacy chain.
        pa.field("chain", pa.string()),
    ]
)
"""One audit receipt per row, hash-chained by ``seq`` within its writer's ``chain``
(``governance.audit`` computes the chains)."""

CHECKPOINT_SCHEMA = pa.schema(
    [
        pa.field("root", pa.string(), nullable=False),
        pa.field("time", _timestamp, nullable=False),
        pa.field("receipts", pa.int64(), nullable=False),
        pa.field("heads", pa.string(), nullable=False),
        pa.field("hash", pa.string(), nullable=False),
    ]
)
"""One audit checkpoint per row: every chain's head at one moment, bound into a Merkle ``root``."""
