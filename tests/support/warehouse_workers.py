"""Bodies of spawned processes that work one warehouse at once: writers that ingest and rewrite
documents, and readers that search all the while and record what each answer looked like."""

from __future__ import annotations

import json
import re
import time
import traceback
from pathlib import Path
from typing import Any

ROUND = re.compile(r"Round (\d+) of ")
WORDS = ("ledger audit forecast payroll invoice budget quarterly review vendor contract renewal "
         "pricing margin revenue expense accrual variance headcount travel policy").split()  # fmt: skip


def document(doc_id: str, round_: int, *, tenant: str = "acme") -> dict[str, Any]:
    """A record of several chunks whose every sentence names its round: a torn read shows at once."""
    sentences = [f"Round {round_} of {doc_id}: {' '.join(WORDS[(i + j) % len(WORDS)] for j in range(12))}."
                 for i in range(40)]  # fmt: skip
    return {"id": doc_id, "text": " ".join(sentences), "tenant": tenant, "acl": {"allow": ["group:staff"]},
            "labels": [], "classification": "internal", "uri": f"test://{doc_id}"}  # fmt: skip


def writer(uri: str, prefix: str, documents: int, rounds: int, start: Any, result: str) -> None:
    """Ingest ``documents`` documents, then rewrite them all, ``rounds`` times in all."""
    from ragwarden.config import Settings
    from ragwarden.warehouse import Warehouse

    outcome: dict[str, Any] = {"errors": [], "rounds": 0}
    try:
        warehouse = Warehouse(Settings.from_env(warehouse=uri))
        start.wait(120)
        for round_ in range(rounds):
            report = warehouse.ingest_records([document(f"{prefix}-{i}", round_) for i in range(documents)])
            if not report.ok:
                outcome["errors"].append(f"round {round_}: rejected {report.rejected}")
            outcome["rounds"] += 1
    except Exception:
        outcome["errors"].append(traceback.format_exc())
    Path(result).write_text(json.dumps(outcome), encoding="utf-8")


def reader(uri: str, subject: str, stop: str, start: Any, result: str) -> None:
    """Search until ``stop`` exists; record errors, and every answer whose chunks of one document
    came from different versions of it (a torn read)."""
    from ragwarden.config import Settings
    from ragwarden.warehouse import Warehouse

    outcome: dict[str, Any] = {"errors": [], "torn": [], "searches": 0, "hits": 0}
    try:
        warehouse = Warehouse(Settings.from_env(warehouse=uri))
        start.wait(120)
        deadline = time.monotonic() + 600
        while not Path(stop).exists() and time.monotonic() < deadline:
            try:
                hits = warehouse.search("ledger budget forecast round", subject=subject, tenant="acme", k=50)
            except Exception:
                outcome["errors"].append(traceback.format_exc())
                continue
            outcome["searches"] += 1
            outcome["hits"] += len(hits)
            rounds: dict[str, set[str]] = {}
            versions: dict[str, set[str]] = {}
            for hit in hits:
                rounds.setdefault(hit.doc_id, set()).update(ROUND.findall(hit.text))
                versions.setdefault(hit.doc_id, set()).add(hit.doc_version)
            for doc_id in rounds:
                if len(rounds[doc_id]) > 1 or len(versions[doc_id]) > 1:
                    outcome["torn"].append({"doc": doc_id, "rounds": sorted(rounds[doc_id]), "versions": sorted(versions[doc_id])})
    except Exception:
        outcome["errors"].append(traceback.format_exc())
    Path(result).write_text(json.dumps(outcome), encoding="utf-8")
