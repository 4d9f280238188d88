"""Bodies of spawned processes that emit lineage runs into one warehouse's spool at once."""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any


def emit_runs(warehouse: str, url: str, runs: int, start: Any, result: str) -> None:
    """Emit ``runs`` ingest runs (START and COMPLETE each) to the backend at ``url``; each event is
    spooled, then the spool is flushed, as every run does. Records the run ids, or the error."""
    from ragwarden.lineage_emitter import LineageEmitter

    outcome: dict[str, Any] = {"runs": [], "errors": []}
    try:
        env = {"OPENLINEAGE__TRANSPORT__TYPE": "http", "OPENLINEAGE__TRANSPORT__URL": url}
        with LineageEmitter(warehouse, Path(warehouse) / "_lineage", env) as emitter:
            start.wait(120)
            for n in range(runs):
                with emitter.run("ingest", [f"doc:{Path(result).stem}-{n}"]) as scope:
                    outcome["runs"].append(scope.run.run_id)
    except Exception:
        outcome["errors"].append(traceback.format_exc())
    Path(result).write_text(json.dumps(outcome), encoding="utf-8")


def flush_warehouse(env: dict[str, str], uri: str, start: Any, result: str) -> None:
    """Open the warehouse at ``uri`` (an object store's, ``env`` its settings and lineage backend)
    and flush its lineage spool, as any replica's next run does. Records the flush, or the error."""
    from ragwarden.config import Settings
    from ragwarden.warehouse import Warehouse

    outcome: dict[str, Any] = {"errors": []}
    try:
        start.wait(120)
        warehouse = Warehouse(Settings.from_env(env, warehouse=uri))
        report = warehouse.openlineage.flush()
        outcome.update(sent=report.sent, failed=report.failed, pending=report.pending)
    except Exception:
        outcome["errors"].append(traceback.format_exc())
    Path(result).write_text(json.dumps(outcome), encoding="utf-8")
