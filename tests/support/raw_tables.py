"""The Lance tables behind a store, for tests that must reach past the state layer: to damage or
forge rows, or to read what the product never returns. Product code never does this."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import lancedb


def raw_table(store: Any, name: str = "chunks") -> Any:
    """Table ``name`` of ``store``'s warehouse, opened as every process opens it (latest commit)."""
    db = lancedb.connect(
        store.uri, read_consistency_interval=timedelta(0), storage_options=dict(store.storage_options) or None
    )
    return db.open_table(name)
