"""State: the only door to the warehouse's LanceDB tables, and one door per table.

``Store`` opens the warehouse, checks its format and pins one freshness check per request; each
table is reached through its door (``Store.chunks``, ``.sources``, ``.registries``, ``.policies``,
``.maintenance``, ``.erasures``, the audit log's, API keys', directory's and lineage spool's tables). Schemas,
indexes, commit retries, version pruning and damage checks live here, and so does the one place
a Lance failure becomes a ``WarehouseError``. What leaves is rows, counts and versions, never a
Lance table, and nothing outside ``state`` imports its modules but through this one.
"""

from __future__ import annotations

from .api_keys import ApiKeyRow, ApiKeysTable
from .audit_log import AuditLog
from .audit_table import AuditTable
from .backup import Backup, Backups, RestoreReport, TableCopy, TableRestore, holds_warehouse, read_backup, restore_new
from .chunks import IN_LIST_MAX_IDS, ChunkReads, Chunks
from .commit_retry import is_missing_file, retrying_conflicts
from .directory import DirectoryRow, DirectorySnapshot, DirectoryTable
from .erasures import Erasure, Erasures
from .files import LINEAGE_EVENTS, RESIDENT_INDEX, WarehouseFiles
from .foreign import ForeignTable, add_bare, open_foreign
from .indexing import VECTOR_INDEX_MIN_ROWS, IndexReport, vector_index_partitions
from .lineage_spool import FolderSpool, LineageSpool, TableSpool, sortable_now
from .maintenance import Maintenance
from .policies import InstalledPolicy, Policies
from .registries import Registries, RegistryReads, RegistryTables
from .schema import TAG_COLUMNS, chunks_schema, row_metadata
from .snapshot import ChunksSnapshot, ChunkWrite, DocumentKey
from .sources import Sources, SourceState
from .store import ReadDoors, Store, WriteDoors
from .tables import operation_named
from .text_analysis import ANALYZER, terms_of_words
from .warehouse_format import FORMAT_KEY, READS, WRITES, Migration

__all__ = [
    "add_bare",
    "ANALYZER",
    "ApiKeyRow",
    "ApiKeysTable",
    "AuditLog",
    "AuditTable",
    "Backup",
    "Backups",
    "ChunkReads",
    "Chunks",
    "chunks_schema",
    "ChunksSnapshot",
    "ChunkWrite",
    "DirectoryRow",
    "DirectorySnapshot",
    "DirectoryTable",
    "DocumentKey",
    "Erasure",
    "Erasures",
    "FolderSpool",
    "ForeignTable",
    "FORMAT_KEY",
    "holds_warehouse",
    "IN_LIST_MAX_IDS",
    "IndexReport",
    "InstalledPolicy",
    "is_missing_file",
    "LINEAGE_EVENTS",
    "LineageSpool",
    "Maintenance",
    "Migration",
    "open_foreign",
    "operation_named",
    "Policies",
    "read_backup",
    "ReadDoors",
    "READS",
    "Registries",
    "RegistryReads",
    "RegistryTables",
    "RESIDENT_INDEX",
    "restore_new",
    "RestoreReport",
    "retrying_conflicts",
    "row_metadata",
    "sortable_now",
    "Sources",
    "SourceState",
    "Store",
    "TableCopy",
    "TableRestore",
    "TableSpool",
    "TAG_COLUMNS",
    "terms_of_words",
    "VECTOR_INDEX_MIN_ROWS",
    "vector_index_partitions",
    "WarehouseFiles",
    "WriteDoors",
    "WRITES",
]
