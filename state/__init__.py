"""State: the only door to the warehouse's LanceDB tables.

Every table (chunks, sources, the clause and label registries, policies, audit, api_keys, the
directory of provisioned users and groups), its schema and indexes, commit retries, version
pruning and damage checks live here, and so does the one place a Lance failure becomes a
``WarehouseError``. What leaves is rows, counts and versions, never a Lance table: the layers
above (ingest, retrieval, the face) ask typed questions.
"""

from __future__ import annotations

from .api_keys import ApiKeyRow, ApiKeysTable
from .audit_log import AuditLog
from .audit_table import AuditTable
from .directory import DirectoryRow, DirectorySnapshot, DirectoryTable
from .files import LINEAGE_EVENTS, WarehouseFiles
from .indexing import VECTOR_INDEX_MIN_ROWS, IndexReport, vector_index_partitions
from .lineage_spool import FolderSpool, LineageSpool, TableSpool, sortable_now
from .schema import TAG_COLUMNS, chunks_schema
from .snapshot import ChunksSnapshot, ChunkWrite
from .store import DocumentKey, InstalledPolicy, Registries, SourceState, Store
from .tables import operation_named
from .text_analysis import ANALYZER, terms_of_words

__all__ = [
    "ANALYZER",
    "LINEAGE_EVENTS",
    "TAG_COLUMNS",
    "VECTOR_INDEX_MIN_ROWS",
    "ApiKeyRow",
    "ApiKeysTable",
    "AuditLog",
    "AuditTable",
    "ChunkWrite",
    "ChunksSnapshot",
    "DirectoryRow",
    "DirectorySnapshot",
    "DirectoryTable",
    "DocumentKey",
    "FolderSpool",
    "IndexReport",
    "InstalledPolicy",
    "LineageSpool",
    "Registries",
    "SourceState",
    "Store",
    "TableSpool",
    "WarehouseFiles",
    "chunks_schema",
    "operation_named",
    "sortable_now",
    "terms_of_words",
    "vector_index_partitions",
]
