"""Bodies of spawned processes that emit lineage runs into one warehouse's spool at once."""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any


def emit_runs(warehouse: str, url: str, runs: int, start: Any, result: str) -> None:
    """Emit ``runs`` ingest runs (START and COMPLETE each) to the backend at ``url``; each event is
    spooled, then the spool is flushed, as every run does. Records the run ids, or the error."""
    from ragwarden.governance.lineage import LineageEmitter

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
