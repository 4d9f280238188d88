"""A replica in a process of its own: it opens a warehouse, loads the stored serving index, and
answers one search per line of stdin (``SUBJECT TENANT v1,v2,...``) with the chunk ids it returns
and the plan that answered, as one JSON line on stdout; EOF ends it."""

from __future__ import annotations

import json
import sys

import numpy as np

from ragwarden.config import Settings
from ragwarden.governance.caller import Caller
from ragwarden.retrieval.search import Searcher
from ragwarden.warehouse import Warehouse


def main(uri: str) -> None:
    warehouse = Warehouse(Settings(warehouse=uri), embedder=None)  # type: ignore[arg-type]
    searcher = Searcher(warehouse.store.read_doors(), None, flat_max_rows=-1, resident_index_bytes=256 * 2**20, resident_min_rows=0)  # type: ignore[arg-type]
    loaded = searcher.serving.build_now()  # the artifact the writer stored, not a build of its own
    print(json.dumps({"loaded": loaded.version}), flush=True)
    for line in sys.stdin:
        subject, tenant, values = line.split()
        vector = np.array([float(x) for x in values.split(",")], dtype=np.float32)
        found = searcher.search("q", policy=warehouse.policy, caller=Caller(subject=subject, tenant=tenant), k=10, vector=vector)
        where = searcher.prefilter(searcher.view(warehouse.policy, Caller(subject=subject, tenant=tenant)))  # type: ignore[arg-type]
        plan = searcher.plan(where, warehouse.store.chunks.version)
        print(json.dumps({"ids": [hit.chunk_id for hit in found.hits], "plan": plan}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
