"""ragwarden: a governed retrieval data layer.

Every chunk carries its source's ACL and labels; search is filtered inside the data layer by a
Casbin policy compiled per caller, so a caller's top-k are the top-k of what it may read.
"""

from __future__ import annotations

from .config import Settings
from .errors import (
    ConfigurationError,
    InvalidPolicyError,
    InvalidRequestError,
    InvalidSourceError,
    NotFoundError,
    PermissionDeniedError,
    PolicyError,
    RagwardenError,
    WarehouseError,
)
from .governance.explain import Explanation
from .governance.policy import Decision, Policy
from .governance.tags import Classification, GovernanceTags
from .ingest.lifecycle import DerivedRow, ForgetReport, SyncReport
from .ingest.pipeline import IngestReport
from .ingest.records import Rejected, Skipped
from .retrieval.hits import Hit
from .warehouse import Warehouse, open

__all__ = [
    "Classification",
    "ConfigurationError",
    "Decision",
    "DerivedRow",
    "Explanation",
    "ForgetReport",
    "GovernanceTags",
    "Hit",
    "IngestReport",
    "InvalidPolicyError",
    "InvalidRequestError",
    "InvalidSourceError",
    "NotFoundError",
    "PermissionDeniedError",
    "Policy",
    "PolicyError",
    "RagwardenError",
    "Rejected",
    "Settings",
    "Skipped",
    "SyncReport",
    "Warehouse",
    "WarehouseError",
    "open",
]
