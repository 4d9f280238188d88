"""ragwarden: a governed retrieval data layer.

Every chunk carries its source's ACL and labels; search is filtered inside the data layer by a
Casbin policy compiled per caller, so a caller's top-k are the top-k of what it may read.
"""

from __future__ import annotations

from .config import Settings
from .errors import (
    AuthenticationError,
    ConfigurationError,
    DeadlineExceededError,
    InvalidPolicyError,
    InvalidRequestError,
    InvalidSourceError,
    InvalidValueError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    PermissionDeniedError,
    PolicyError,
    RagwardenError,
    StorageUnreachableError,
    WarehouseError,
    WarehouseFormatError,
)
from .governance.audit import ArchiveReport, ChainReport, Receipt, StoredReceipt
from .governance.caller import Caller, Identity
from .governance.explain import Explanation
from .governance.operations import Operation
from .governance.policy import Decision, Policy
from .governance.tags import Classification, GovernanceTags
from .ingest.importers import AclFromMetadata, AclManifest, Collected, CollectedBatch, ImportReport
from .ingest.lifecycle import DerivedRow, ForgetReport, SyncReport
from .ingest.pipeline import IngestReport
from .ingest.records import Rejected, Skipped
from .retrieval.hits import Hit
from .retrieval.manifest import ContextManifest
from .retrieval.review import AccessReview
from .state import Backup, IndexReport, RestoreReport
from .warehouse import Warehouse, open

__all__ = [
    "AccessReview",
    "AclFromMetadata",
    "AclManifest",
    "ArchiveReport",
    "AuthenticationError",
    "Backup",
    "Caller",
    "ChainReport",
    "Classification",
    "Collected",
    "CollectedBatch",
    "ConfigurationError",
    "ContextManifest",
    "DeadlineExceededError",
    "Decision",
    "DerivedRow",
    "Explanation",
    "ForgetReport",
    "GovernanceTags",
    "Hit",
    "Identity",
    "ImportReport",
    "IndexReport",
    "IngestReport",
    "InvalidPolicyError",
    "InvalidRequestError",
    "InvalidSourceError",
    "InvalidValueError",
    "NotFoundError",
    "Operation",
    "OverloadedError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Policy",
    "PolicyError",
    "RagwardenError",
    "Receipt",
    "Rejected",
    "RestoreReport",
    "Settings",
    "Skipped",
    "StoredReceipt",
    "SyncReport",
    "Warehouse",
    "StorageUnreachableError",
    "WarehouseError",
    "WarehouseFormatError",
    "open",
]
