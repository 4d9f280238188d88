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
    PolicyError,
    RagwardenError,
    WarehouseError,
)
from .governance.policy import Decision, Policy
from .governance.tags import Classification, GovernanceTags
from .ingest.pipeline import IngestReport
from .ingest.records import Rejected, Skipped
from .retrieval.hits import Hit
from .warehouse import Warehouse, open

__all__ = [
    "Classification",
    "ConfigurationError",
    "Decision",
    "GovernanceTags",
    "Hit",
    "IngestReport",
    "InvalidPolicyError",
    "InvalidRequestError",
    "InvalidSourceError",
    "Policy",
    "PolicyError",
    "RagwardenError",
    "Rejected",
    "Settings",
    "Skipped",
    "Warehouse",
    "WarehouseError",
    "open",
]
