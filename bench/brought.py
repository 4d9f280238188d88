"""``python -m ragwarden.bench.brought``: records that bring their own vectors, written through
``ingest_records`` as a collection brought in is (nothing embedded), against a bare LanceDB
``add`` of the same rows as one Arrow table, in the same run; then governed search over what was
written, every caller's top 10 against an oracle.

The records: ``--rows`` synthetic unit vectors of the warehouse's model's dimension, each readable
by one of 40 groups of Zipf sizes (the churn world's shape), short texts. The rate is end to end
in process: validation, tags, one commit per ``write_batch_brought`` records, the source records,
lineage and the receipt; the warehouse's index upkeep after the write is timed apart. The oracle:
a caller in group g reads the rows of group g; its exact top 10 by inner product. Target (#35):
>= 5,000 rows/s. Writes ``brought-ROWS.json``.

    python -m ragwarden.bench.brought [--rows 100000] [--callers 5] [--queries 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..config import Settings
from ..embedder import MODEL_NAME
from ..governance.policy import Policy
from ..ingest.importers import AclFromMetadata, lancedb_rows
from ..state import add_bare
from ..warehouse import Warehouse
from .churn import GROUPS, RESULTS, group, zipf
from .world import DIMENSION

TENANT = "acme"
TARGET_ROWS_PER_SECOND = 5_000


def records(rows: int, seed: int = 35) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray]:
    """``rows`` records bringing their vectors, with the vectors and each row's group."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((rows, DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    groups = rng.choice(GROUPS, size=rows, p=zipf(GROUPS))
    made = [{"id": f"r{i:07d}", "text": f"imported row {i} of group {g}", "tenant": TENANT, "acl": {"allow": [group(int(g))]},
             "classification": "public", "vector": vectors[i].tolist(), "model": MODEL_NAME}
            for i, g in enumerate(groups.tolist())]  # fmt: skip
    return made, vectors, groups


def bare_add(folder: Path, made: list[dict[str, Any]]) -> float:
    """Seconds for LanceDB to ``add`` the same rows (id, text, vector, the group) as one Arrow table,
    the table built from the same records first (as any importer must)."""
    began = time.perf_counter()
    table = pa.table({"id": [r["id"] for r in made], "text": [r["text"] for r in made],
                      "acl_allow": [r["acl"]["allow"] for r in made],
                      "vector": pa.array([r["vector"] for r in made], pa.list_(pa.float32(), DIMENSION))})  # fmt: skip
    add_bare(str(folder), "bare", table)
    return time.perf_counter() - began


def lancedb_import(folder: Path, rows: int) -> float:
    """Seconds for ``Warehouse.import_collection`` (what ``ragwarden import lancedb`` runs) to bring
    the bare LanceDB table in, each row's ACL from its ``acl_allow`` column, into a new warehouse."""
    total, collected = lancedb_rows(str(folder / "bare"), "bare")
    with Warehouse(Settings(warehouse=str(folder / "imported"), ingest_maintenance=False)) as warehouse:
        began = time.perf_counter()
        report = warehouse.import_collection(collected, tags=AclFromMetadata.parse("allow=acl_allow"), model=MODEL_NAME,
                                             origin="lancedb:bare", tenant=TENANT, classification="public", total=total,
                                             progress=False)  # fmt: skip
        took = time.perf_counter() - began
    if report.documents != rows:
        raise RuntimeError(f"the import wrote {report.documents} of {rows} rows: {report.summary()}")
    return took


def recall(warehouse: Warehouse, vectors: np.ndarray, groups: np.ndarray, callers: int, queries: int, seed: int = 7) -> dict[str, Any]:
    """Each of ``callers`` groups' users' top 10 for ``queries`` random queries against the oracle."""
    rng = np.random.default_rng(seed)
    found = wanted = leaks = 0
    for g in rng.choice(GROUPS, size=callers, replace=False).tolist():
        mine = np.flatnonzero(groups == g)
        readable = {f"r{i:07d}" for i in mine.tolist()}
        for _ in range(queries):
            query = rng.standard_normal(DIMENSION).astype(np.float32)
            query /= np.linalg.norm(query)
            truth = {f"r{i:07d}" for i in mine[np.argsort(-(vectors[mine] @ query), kind="stable")[:10]]}
            hits = warehouse.search("imported row", subject=f"user:u{g:02d}", tenant=TENANT, k=10, vector=query.tolist(), vector_model=MODEL_NAME)
            got = {hit.doc_id for hit in hits}
            found, wanted = found + len(got & truth), wanted + len(truth)
            leaks += sum(hit.doc_id not in readable for hit in hits)
    return {"callers": callers, "queries": queries, "recall_at_10": round(found / max(1, wanted), 4), "leaks": leaks}


def run(rows: int, callers: int, queries: int, folder: Path) -> dict[str, Any]:
    made, vectors, groups = records(rows)
    with Warehouse(Settings(warehouse=str(folder / "warehouse"), ingest_maintenance=False)) as warehouse:
        return _measured(warehouse, made, vectors, groups, callers, queries, folder)


def _measured(warehouse: Warehouse, made: list[dict[str, Any]], vectors: np.ndarray, groups: np.ndarray, callers: int,
              queries: int, folder: Path) -> dict[str, Any]:  # fmt: skip
    rows = len(made)
    policy = "\n".join(f"g, user:u{g:02d}, {group(g)}, {TENANT}" for g in range(GROUPS))
    warehouse.store.policies.install(Policy.from_text(policy, source="brought world"))  # as the operator, before serving
    began = time.perf_counter()
    report = warehouse.ingest_records(made)
    took = time.perf_counter() - began
    if not report.ok or report.documents != rows:
        raise RuntimeError(f"the ingest wrote {report.documents} of {rows} rows: {report.summary()}")
    began = time.perf_counter()
    warehouse.optimize()
    upkeep = time.perf_counter() - began
    bare = bare_add(folder / "bare", made)
    imported = lancedb_import(folder, rows)
    return {"rows": rows, "seconds": round(took, 2), "rows_per_second": round(rows / took),
            "import_lancedb_seconds": round(imported, 2), "import_lancedb_rows_per_second": round(rows / imported),
            "bare_lancedb_add_seconds": round(bare, 2), "bare_rows_per_second": round(rows / bare),
            "ratio_to_bare": round(bare / took, 3), "commits_of": warehouse.settings.write_batch_brought,
            "optimize_seconds": round(upkeep, 1), "search": recall(warehouse, vectors, groups, callers, queries),
            "target_rows_per_second": TARGET_ROWS_PER_SECOND, "met": rows / took >= TARGET_ROWS_PER_SECOND,
            "machine": {"cpus": os.cpu_count(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--callers", type=int, default=5, help="groups whose user searches, each against the oracle")
    parser.add_argument("--queries", type=int, default=5, help="queries per caller")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        record = run(args.rows, args.callers, args.queries, Path(folder))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"brought-{args.rows}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"{record['rows']:,} rows brought in {record['seconds']} s: {record['rows_per_second']:,} rows/s "
          f"(target {TARGET_ROWS_PER_SECOND:,}); a bare LanceDB add {record['bare_rows_per_second']:,} rows/s "
          f"({record['ratio_to_bare']}x of it); imported from that table {record['import_lancedb_rows_per_second']:,} rows/s; recall@10 {record['search']['recall_at_10']}, "
          f"{record['search']['leaks']} leaks")  # fmt: skip
    return 0 if record["met"] and record["search"]["leaks"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
