"""``python -m ragwarden.bench.brought``: records that bring their own vectors, written through
``ingest_records`` as a collection brought in is (nothing embedded), against a bare LanceDB
``add`` of the same rows as one Arrow table, in the same run; then governed search over what was
written, every caller's top 10 against an oracle.

The records: ``--rows`` synthetic unit vectors of the warehouse's model's dimension, each readable
by one of 40 groups of Zipf sizes (the churn world's shape), short texts. The rate is end to end
in process: validation, tags, one commit per ``write_batch_brought`` records, the source records,
lineage and the receipt; the warehouse's index upkeep after the write is timed apart. The oracle:
a caller in group g reads the rows of group g; its exact top 10 by inner product, checked on the
warehouse written by ``ingest_records`` and on the one imported. Targets: ``ingest_records``
>= 5,000 rows/s; the import of 1M rows >= 20,000 rows/s and >= 0.3x the bare add. Writes
``brought-ROWS.json``.

    python -m ragwarden.bench.brought [--rows 100000] [--callers 5] [--queries 5] [--no-optimize] [--import-only]
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
IMPORT_TARGET_ROWS_PER_SECOND = 20_000  # at 1M rows, on 2 cores
IMPORT_TARGET_RATIO = 0.3  # of a bare LanceDB add of the same rows, in the same run


def records(rows: int, seed: int = 35) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray]:
    """``rows`` records bringing their vectors, with the vectors and each row's group."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((rows, DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    groups = rng.choice(GROUPS, size=rows, p=zipf(GROUPS))
    made = [{"id": f"r{i:07d}", "text": f"imported row {i} of group {g}", "tenant": TENANT, "acl": {"allow": [group(int(g))]},
             "classification": "public", "vector": vectors[i], "model": MODEL_NAME}
            for i, g in enumerate(groups.tolist())]  # fmt: skip
    return made, vectors, groups


def bare_add(folder: Path, made: list[dict[str, Any]], vectors: np.ndarray) -> float:
    """Seconds for LanceDB to ``add`` the same rows (id, text, vector, the group) as one Arrow table,
    the table built from the same records first (as any importer must; the vectors from their one
    array, as a bulk load holds them)."""
    began = time.perf_counter()
    table = pa.table({"id": [r["id"] for r in made], "text": [r["text"] for r in made],
                      "acl_allow": [r["acl"]["allow"] for r in made],
                      "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIMENSION)})  # fmt: skip
    add_bare(str(folder), "bare", table)
    return time.perf_counter() - began


def lancedb_import(folder: Path, rows: int, vectors: np.ndarray, groups: np.ndarray, callers: int,
                   queries: int) -> tuple[float, dict[str, Any]]:  # fmt: skip
    """Seconds for ``Warehouse.import_collection`` (what ``ragwarden import lancedb`` runs) to bring
    the bare LanceDB table in, each row's ACL from its ``acl_allow`` column, into a new warehouse;
    and that warehouse's answers against the oracle."""
    total, collected = lancedb_rows(str(folder / "bare"), "bare")
    with Warehouse(Settings(warehouse=str(folder / "imported"), ingest_maintenance=False)) as warehouse:
        install_groups(warehouse)
        began = time.perf_counter()
        report = warehouse.import_collection(collected, tags=AclFromMetadata.parse("allow=acl_allow"), model=MODEL_NAME,
                                             origin="lancedb:bare", tenant=TENANT, classification="public", total=total,
                                             progress=False)  # fmt: skip
        took = time.perf_counter() - began
        if report.documents != rows:
            raise RuntimeError(f"the import wrote {report.documents} of {rows} rows: {report.summary()}")
        return took, recall(warehouse, vectors, groups, callers, queries)


def install_groups(warehouse: Warehouse) -> None:
    """User uNN in group NN, as the operator, before serving."""
    policy = "\n".join(f"g, user:u{g:02d}, {group(g)}, {TENANT}" for g in range(GROUPS))
    warehouse.store.policies.install(Policy.from_text(policy, source="brought world"))


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


def run(rows: int, callers: int, queries: int, folder: Path, optimize: bool = True, import_only: bool = False) -> dict[str, Any]:
    made, vectors, groups = records(rows)
    ingested = {} if import_only else _ingested(folder, made, vectors, groups, callers, queries, optimize)
    bare = bare_add(folder / "bare", made, vectors)
    del made  # the import reads the bare table
    imported, imported_search = lancedb_import(folder, rows, vectors, groups, callers, queries)
    return {"rows": rows, **ingested,
            "import_lancedb_seconds": round(imported, 2), "import_lancedb_rows_per_second": round(rows / imported),
            "import_ratio_to_bare": round(bare / imported, 3), "import_search": imported_search,
            "import_commits_of": Settings().import_batch_rows,
            "import_target_rows_per_second": IMPORT_TARGET_ROWS_PER_SECOND, "import_target_ratio": IMPORT_TARGET_RATIO,
            "import_met": rows / imported >= IMPORT_TARGET_ROWS_PER_SECOND and bare / imported >= IMPORT_TARGET_RATIO,
            "bare_lancedb_add_seconds": round(bare, 2), "bare_rows_per_second": round(rows / bare),
            **({"ratio_to_bare": round(bare / ingested["seconds"], 3)} if ingested else {}),
            "machine": {"cpus": os.cpu_count(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}}  # fmt: skip


def _ingested(folder: Path, made: list[dict[str, Any]], vectors: np.ndarray, groups: np.ndarray, callers: int,
              queries: int, optimize: bool) -> dict[str, Any]:  # fmt: skip
    """``ingest_records`` of the records into a new warehouse: its rate, upkeep and answers."""
    rows = len(made)
    with Warehouse(Settings(warehouse=str(folder / "warehouse"), ingest_maintenance=False)) as warehouse:
        install_groups(warehouse)
        began = time.perf_counter()
        report = warehouse.ingest_records(made)
        took = time.perf_counter() - began
        if not report.ok or report.documents != rows:
            raise RuntimeError(f"the ingest wrote {report.documents} of {rows} rows: {report.summary()}")
        began = time.perf_counter()
        if optimize:
            warehouse.optimize()
        upkeep = time.perf_counter() - began
        return {"seconds": round(took, 2), "rows_per_second": round(rows / took), "commits_of": warehouse.settings.write_batch_brought,
                "optimize_seconds": round(upkeep, 1) if optimize else None,
                "search": recall(warehouse, vectors, groups, callers, queries),
                "target_rows_per_second": TARGET_ROWS_PER_SECOND, "met": rows / took >= TARGET_ROWS_PER_SECOND}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--callers", type=int, default=5, help="groups whose user searches, each against the oracle")
    parser.add_argument("--queries", type=int, default=5, help="queries per caller")
    parser.add_argument("--no-optimize", action="store_true", help="skip the index upkeep after the ingest (at 1M it "
                        "builds the ANN index, minutes; the searches are exact either way)")
    parser.add_argument("--import-only", action="store_true", help="measure only the import (and the bare add): "
                        "at 1M, ingest_records' records of lists take most of the machine's memory")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        record = run(args.rows, args.callers, args.queries, Path(folder), optimize=not args.no_optimize,
                     import_only=args.import_only)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"brought-{args.rows}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    searched = [record[name] for name in ("search", "import_search") if name in record]
    if "rows_per_second" in record:
        print(f"{record['rows']:,} records through ingest_records in {record['seconds']} s: {record['rows_per_second']:,} "
              f"rows/s (target {TARGET_ROWS_PER_SECOND:,}), {record['ratio_to_bare']}x a bare LanceDB add")  # fmt: skip
    print(f"{record['rows']:,} rows imported from a LanceDB table in {record['import_lancedb_seconds']} s: "
          f"{record['import_lancedb_rows_per_second']:,} rows/s, {record['import_ratio_to_bare']}x a bare LanceDB add of them "
          f"({record['bare_rows_per_second']:,} rows/s); target {IMPORT_TARGET_ROWS_PER_SECOND:,} rows/s and "
          f"{IMPORT_TARGET_RATIO}x at 1M; recall@10 {', '.join(str(s['recall_at_10']) for s in searched)}, "
          f"{sum(s['leaks'] for s in searched)} leaks")  # fmt: skip
    return 0 if record.get("met", True) and not sum(s["leaks"] for s in searched) else 1

if __name__ == "__main__":
    sys.exit(main())
