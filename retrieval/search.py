"""Governed search: the top-k among the rows a subject may read, never "k, then drop".

The compiled filter runs inside LanceDB as a prefilter, so ranking happens over visible rows
only; every row is then re-checked by the Casbin enforcer before it leaves (defence in depth).
"""

from __future__ import annotations

import contextvars
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..caches import LruCache
from ..config import Settings
from ..deadline import check_deadline
from ..embedder import Embedder
from ..errors import InvalidRequestError, InvalidValueError
from ..governance.caller import Caller
from ..governance.compiler import SubjectView, compile_filter, compile_prefilter
from ..governance.policy import Decision, Policy
from ..governance.visibility import check_row
from ..group_commit import GroupCommit
from ..stages import stage, work
from ..state import IN_LIST_MAX_IDS, TAG_COLUMNS, VECTOR_INDEX_MIN_ROWS, ReadDoors, Registries, vector_index_partitions
from .collapse import NO_COLLAPSE, Collapse
from .fusion import reciprocal_rank_fusion
from .hits import CURRENT_COLUMNS, RESULT_COLUMNS, Hit
from .lexical import LexicalRows, query_terms
from .narrowing import Narrow, Narrowing, narrowed
from .resident_state import Ranked, ResidentState
from .serving import ServingIndex
from .visible_fields import FIELD_COLUMNS, VisibleFields, VisibleIds
from .visible_rows import Held, VisibleRowCache, VisibleRows

log = logging.getLogger(__name__)

Mode = Literal["vector", "fts", "hybrid"]
MODES: tuple[str, ...] = get_args(Mode)
MAX_K = 1000
MAX_QUERY_CHARS = 8192
HYBRID_CANDIDATES = 50
HYBRID_HALVES = 4
"""Threads ranking hybrid's exact vector half beside its BM25 half (searches at once beyond this wait)."""
FLAT_SEARCH_MIN_ROWS = 500
FLAT_SEARCH_SHARE = 0.02
"""Up to max(FLAT_SEARCH_MIN_ROWS, FLAT_SEARCH_SHARE x table rows) visible rows the planner scans
them exactly; above, it searches the prefiltered vector index. Recall sets the threshold more than
speed: for a selective caller the prefiltered index misses most of the true top-10 even with many
partitions probed, while the flat scan is exact in about the same time; for a broad one the index
is exact and much faster (figures: ``docs/performance.md``, the constants table)."""
INDEX_NPROBES = 20
PROBED_VISIBLE_ROWS = 1_000
INDEX_REFINE_FACTOR = 10
VIEWS_KEPT = 4096
FLAT_FILTERS_KEPT = 4096  # filters whose newest read version is remembered (to re-tag their rows after a commit)
QUERY_BATCH = 64
POST_CHECK_BLOCK = 16  # rows the post-check decides (and hits it makes) between two looks at the deadline
FIELD_ROW_BYTES = 256  # what a row's filterable fields take held (ids, columns, a few metadata fields), about
DEFAULT_FLAT_CACHE_BYTES = Settings().flat_cache_bytes  # the setting's default

H = TypeVar("H", bound=Held)


def _tags(
    tenant: Any, acl_allow: Any, acl_deny: Any, acl_clauses: Any, labels: Any, classification: Any
) -> tuple[Any, ...]:
    """A row's tags (the ``TAG_COLUMNS``, in that order) as one hashable key; TypeError for a null list."""
    return (tenant, tuple(acl_allow), tuple(acl_deny), tuple(acl_clauses), tuple(labels), classification)


class DecisionMemo:
    """Post-check decisions by (policy version, subject, tenant) and a row's tags: a decision is a
    pure function of those and the clause registry, so rows tagged alike are decided once. A memo
    is kept only with the very registry object it was decided against (a new registry version is a
    new object, and empties it)."""

    def __init__(self, size: int = 1024, per_caller: int = 4096) -> None:
        self._size, self._per_caller = size, per_caller
        self._items: OrderedDict[tuple[str, str, str], tuple[object, dict[tuple[Any, ...], Decision]]] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, view: SubjectView, row: Mapping[str, Any], registry: Mapping[str, Sequence[str]]) -> Decision:
        """``check_row``'s decision, remembered for rows tagged alike."""
        return self.decider(view, registry)(row)

    def decider(
        self, view: SubjectView, registry: Mapping[str, Sequence[str]]
    ) -> Callable[[Mapping[str, Any]], Decision]:
        """``check`` for one caller: the caller's memo is looked up once, for all the rows of a search."""
        policy, subject, tenant = view.policy, view.subject, view.tenant
        key = (policy.version, subject, tenant)
        with self._lock:
            held = self._items.get(key)
            if held is None or held[0] is not registry:
                held = (registry, {})
                self._items[key] = held
                while len(self._items) > self._size:
                    self._items.popitem(last=False)
            else:
                self._items.move_to_end(key)
        decided = held[1]

        def decide(row: Mapping[str, Any]) -> Decision:
            try:
                tags = _tags(*(row[name] for name in TAG_COLUMNS))
                decision = decided.get(tags)
            except (KeyError, TypeError):
                return check_row(policy, subject, tenant, row, registry)  # not memoisable: decided (and refused) afresh
            if decision is None:
                decision = check_row(policy, subject, tenant, row, registry)
                if len(decided) < self._per_caller:
                    decided[tags] = decision  # one dict store: atomic, so no lock is needed
            return decision

        return decide

    def verdicts(self, view: SubjectView, registry: Mapping[str, Sequence[str]], rows: pa.Table) -> np.ndarray:
        """Whether the post-check admits each of ``rows`` (a table holding the tag columns), each
        distinct tagging decided once. Read column by column rather than as a dict per row, which
        builds no object per row."""
        decide = self.decider(view, registry)
        columns = [rows.column(name).to_pylist() for name in TAG_COLUMNS]
        decided: dict[tuple[Any, ...], bool] = {}
        admitted = np.empty(rows.num_rows, dtype=bool)
        for index, values in enumerate(zip(*columns, strict=True)):
            try:
                tags = _tags(*values)
            except TypeError:  # a null list: decided (and refused) afresh
                admitted[index] = decide(dict(zip(TAG_COLUMNS, values, strict=True))).allowed
                continue
            if tags not in decided:
                decided[tags] = decide(dict(zip(TAG_COLUMNS, values, strict=True))).allowed
            admitted[index] = decided[tags]
        return admitted


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """What one search found, and what its receipt records besides: ``withheld`` counts candidates
    the post-check refused (kept for the audit, never shown to the caller)."""

    hits: list[Hit]
    withheld: int
    table_version: int
    policy_version: str | None


@dataclass(frozen=True, kw_only=True)
class Reader:
    """The caller a search ranks for, as full-text statistics need it: the post-check's verdicts on
    a table's rows (the rows the statistics count) and a key naming whose verdicts they are (policy
    version, subject, tenant, registries version), under which a caller's analysed rows are held."""

    key: tuple[str, ...]
    counts: Callable[[pa.Table], np.ndarray]
    view: SubjectView | None = None
    """The caller's view, for the resident tags to evaluate (None: read through Lance only)."""
    satisfied: frozenset[str] = frozenset()
    """The clause tokens the caller satisfies, in the registry its filter was compiled with."""


def validate_query(query: str, k: int, mode: str) -> None:
    """Refuse malformed search arguments, naming the one at fault."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidRequestError("query is empty; pass the text to search for")
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidRequestError(f"query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise InvalidRequestError(f"k must be a whole number from 1 to {MAX_K}, got {k!r}")
    if mode not in MODES:
        raise InvalidRequestError(f"mode {mode!r} is not one of {', '.join(MODES)}")


class Searcher:
    """Runs governed searches over one warehouse's chunks (read, never written) with one embedder.

    Each search is planned: on a table with a vector index, a caller who may read few rows gets
    an exact scan of exactly those rows (the scalar indexes find them), and one who may read many
    gets the vector index, prefiltered, with candidates re-ranked on full vectors. Below
    ``flat_max_rows`` visible rows (by default scaled with the table, see ``FLAT_SEARCH_SHARE``)
    the scan is both faster and exact; without a vector index every search is an exact scan.
    An exact scan reads its rows' vectors once per table version and then scans them in memory
    (``flat_cache_bytes`` bounds what is held; 0 reads them from the table every time).

    Full-text ranking (``fts``, and the text half of ``hybrid``) is BM25 over the caller's visible
    rows alone (``lexical.LexicalRows``): the rows the filter admits are read and analysed once per
    caller and table version, under the same budget, and the statistics count those the post-check
    admits. ``hybrid`` fuses that ranking with an exact vector ranking of the same rows, so both
    ranks it fuses, like every score either mode returns, depend on the visible rows alone.

    Once this process's serving index is built, every mode ranks from it instead: every row's
    tags and terms are held beside it (``resident_state``), the caller's rule is evaluated over the
    tags into a mask, and nothing is read or held per caller (``_ranked_resident``).
    """

    def __init__(
        self,
        doors: ReadDoors,
        embedder: Embedder,
        *,
        flat_max_rows: int | None = None,
        flat_cache_bytes: int = DEFAULT_FLAT_CACHE_BYTES,
        resident_index_bytes: int = 0,
        resident_min_rows: int = VECTOR_INDEX_MIN_ROWS,
    ) -> None:
        self.chunks = doors.chunks
        self.registries = doors.registries
        self.embedder = embedder
        self.flat_max_rows = flat_max_rows
        self.visible = VisibleRowCache(flat_cache_bytes)
        self.serving = ServingIndex(doors, budget_bytes=resident_index_bytes, min_rows=resident_min_rows)
        self.filters: LruCache[str] = LruCache()  # by (kind, subject, tenant, policy and registry versions)
        self.decisions = DecisionMemo()
        self._counts: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._flat_read: OrderedDict[str, int] = OrderedDict()  # by filter: the newest version its rows were read at
        self._flat_lock = threading.Lock()
        self._unheld_fields: OrderedDict[tuple[str, str, int], bool] = OrderedDict()  # fields too many to hold
        self.retags = 0  # held sets carried to a new version by re-reading ids and tags only (for monitoring)
        self._indexed: tuple[int, bool] = (-1, False)
        # Concurrent searches' queries are embedded together, by one thread: a batch costs little more
        # than one query, and the backend's threads never contend with another call's. A backend
        # that encodes one text per call anyway (int8) is called from each search's own thread.
        self._queries: GroupCommit[str, np.ndarray] = GroupCommit(
            lambda queries: list(self.embedder.encode(list(queries))), max_batch=QUERY_BATCH, name="query-embedder"
        )
        self._views: LruCache[SubjectView] = LruCache(VIEWS_KEPT)
        self._satisfied: LruCache[frozenset[str]] = LruCache(VIEWS_KEPT)  # by reader key: the clauses each satisfies
        self._halves = ThreadPoolExecutor(max_workers=HYBRID_HALVES, thread_name_prefix="hybrid-vector-half")

    def view(self, policy: Policy, caller: Caller) -> SubjectView:
        """What ``policy`` lets ``caller`` read, compiled once per (policy version, subject, tenant):
        a policy's version is the hash of its rules, so one version compiles to one view."""
        key = (policy.version, caller.subject, caller.tenant)
        return self._views.get(key, lambda: SubjectView.of(policy, caller.subject, caller.tenant))

    def _filter(self, kind: str, view: SubjectView, registries: Registries | None) -> str:
        registries = registries or self.registries.current()
        key = (kind, view.subject, view.tenant, view.policy_version, registries.version)

        def build() -> str:
            clauses = registries.clauses
            if kind == "exact":
                return compile_filter(view, view.satisfied_clauses(clauses))
            return compile_prefilter(view, clauses, self.registries.labels())

        return self.filters.get(key, build)

    def compiled_filter(self, view: SubjectView) -> str:
        """The exact filter (every term evaluated on every row): for counts and the fallback."""
        return self._filter("exact", view, None)

    def prefilter(self, view: SubjectView, registries: Registries | None = None) -> str:
        """The index-served filter searches run under (see ``compile_prefilter``), compiled against
        ``registries`` (read afresh when not given)."""
        return self._filter("indexed", view, registries)

    def search(
        self,
        query: str,
        *,
        policy: Policy | None,
        caller: Caller,
        k: int = 10,
        mode: str = "vector",
        vector: Sequence[float] | np.ndarray | None = None,
        collapse: Collapse = NO_COLLAPSE,
        narrowing: Narrowing | None = None,
    ) -> SearchResult:
        """The best ``k`` rows ``caller`` may read under ``policy`` (none without a policy), and what
        the receipt needs: how many rows the post-check withheld (never the caller's to see) and
        the versions the answer was read at.

        ``vector``: the query's embedding when the caller has it already (it must be the model's
        dimension and finite); ``query`` is still what the audit records. ``collapse``: at most so
        many hits of one document, one of each text; rows are ranked deeper until k are kept.
        ``narrowing``: only rows it matches are ranked (ANDed with the governance filter).
        """
        validate_query(query, k, mode)
        with stage("embed"):
            query_vector = self.query_vector(query, vector) if mode != "fts" else None
        if policy is None:  # no policy at all: nothing is visible
            return SearchResult(hits=[], withheld=0, table_version=self.chunks.version, policy_version=None)
        if not collapse.active:
            return self._answer(query, query_vector, policy, caller, k, mode, narrowing)
        ranked = -1
        for depth in collapse.depths(k):
            found = self._answer(query, query_vector, policy, caller, depth, mode, narrowing)
            kept = collapse.apply(found.hits, k)
            # enough; or a deeper ranking brought no more rows (an approximate plan may return fewer
            # than asked while rows remain, so one short answer alone does not end the search)
            if len(kept) == k or len(found.hits) <= ranked:
                break
            ranked = len(found.hits)
        return SearchResult(hits=kept, withheld=found.withheld, table_version=found.table_version,
                            policy_version=found.policy_version)  # fmt: skip

    def _answer(
        self,
        query: str,
        query_vector: np.ndarray | None,
        policy: Policy,
        caller: Caller,
        k: int,
        mode: str,
        narrowing: Narrowing | None,
    ) -> SearchResult:
        """The best ``k`` rows ``caller`` may read (and ``narrowing`` matches), ranked and post-checked."""
        view = self.view(policy, caller)
        registries = self.registries.current()
        where = self.prefilter(view, registries)
        narrowing = narrowing.within(view.tenant) if narrowing is not None else None
        reader = self.reader(view, registries)
        with stage("rank"):
            ranked, version = self.rank(query, query_vector, where, k, mode, reader, narrowing)
        with stage("check"):
            hits, withheld = self.post_check(ranked, view, version, registries.clauses)
        if withheld:  # a row the registries did not know passed the indexed filter: ask again, exactly
            exactly = replace(reader, view=None)  # through Lance under the exact filter
            ranked, version = self.rank(query, query_vector, self.compiled_filter(view), k, mode, exactly, narrowing)
            hits, _ = self.post_check(ranked, view, version)
        return SearchResult(hits=hits, withheld=withheld, table_version=version, policy_version=policy.version)

    def reader(self, view: SubjectView, registries: Registries) -> Reader:
        """The caller as full-text ranking needs it: the post-check's verdicts (memoised per tags)."""

        def counts(rows: pa.Table) -> np.ndarray:
            return self.decisions.verdicts(view, registries.clauses, rows)

        key = (view.policy_version, view.subject, view.tenant, registries.version)
        satisfied = self._satisfied.get(key, lambda: view.satisfied_clauses(registries.clauses))
        return Reader(key=key, counts=counts, view=view, satisfied=satisfied)

    def query_vector(self, query: str, vector: Sequence[float] | np.ndarray | None) -> np.ndarray:
        """The given vector, checked, or the query's embedding."""
        if vector is None and self.embedder.one_text_per_call:  # encoded alone anyway: on this thread, in parallel
            return self.embedder.encode([query])[0]
        if vector is None:
            return self._queries.submit(query)
        array = np.asarray(vector, dtype=np.float32)
        dimension = self.chunks.dimension
        if array.shape != (dimension,):
            model = self.chunks.embedding_model or "the warehouse's model"
            raise InvalidRequestError(f"vector has shape {array.shape}; {model}'s vectors have {dimension} numbers")
        if not np.isfinite(array).all():
            raise InvalidRequestError("vector holds NaN or infinity; pass finite numbers")
        return array

    def get(self, chunk_id: str, *, policy: Policy | None, caller: Caller) -> Hit | None:
        """The row ``chunk_id`` if ``caller`` may read it; None whether missing or forbidden."""
        if policy is None or not isinstance(chunk_id, str) or not chunk_id:
            return None
        view = self.view(policy, caller)
        registries = self.registries.current()
        found = self.visible_row(chunk_id, view, registries, RESULT_COLUMNS)
        if found is None:
            return None
        row, version = found
        admitted, _ = self.admitted([(row, 1.0)], view, registries.clauses)
        if not admitted:
            return None
        return Hit.of_row(row, score=1.0, reason=admitted[0][2], table_version=version, policy_version=policy.version)

    def visible_row(
        self, chunk_id: str, view: SubjectView, registries: Registries, columns: Sequence[str]
    ) -> tuple[dict[str, Any], int] | None:
        """The row ``chunk_id`` with ``columns`` and the version it was read at, if ``view``'s
        filter admits it; None otherwise. The id is looked for among the ids of the rows the
        caller may read (held per filter and version) before any row is read, so asking for a row
        the caller cannot read reads nothing of it, exactly as asking for a missing one does."""
        where = self.prefilter(view, registries)
        version = self.chunks.version
        for _ in range(3):
            check_deadline()
            ids = self._visible_ids(where, version)
            if ids is not None:
                if not pc.any(pc.equal(ids.chunk_ids, chunk_id)).as_py():
                    return None
                table = self.chunks.read_rows_at(version, where, [chunk_id], columns)
                if table is not None:
                    rows = table.to_pylist()
                    return (rows[0], version) if rows else None
            version = self.chunks.latest_version()  # that version is gone: ask the latest
        return None

    def rank(
        self,
        query: str,
        vector: np.ndarray | None,
        where: str,
        k: int,
        mode: str,
        reader: Reader | None = None,
        narrowing: Narrowing | None = None,
    ) -> tuple[list[tuple[dict[str, Any], float]], int]:
        """Candidates under ``where`` (and ``narrowing``), best first, and the table version they
        were read at (the version read before and after must agree, so hits can name it). ``fts``
        and ``hybrid`` need the ``reader`` whose visible rows their statistics count; with a
        ``narrowing`` the reader also names whose the matches are (without one, none is held)."""
        if mode != "vector" and reader is None:
            raise InvalidValueError(f"{mode} ranking counts the statistics of one reader's rows: pass the reader")
        version = self.chunks.version  # the request's freshness check, when one is pinned
        resident = self._resident_state(reader, mode, vector, version)
        if resident is not None:  # every row's tags held at this version (or a later one): one pass
            narrow = self._narrow(narrowing, where, resident.version, reader)
            if narrowing is None or narrow is not None:
                ranked = self._ranked_resident(resident, query, vector, k, mode, reader, narrow)  # type: ignore[arg-type]
                return ranked, resident.version
        for _ in range(3):
            check_deadline()
            exact_version = False
            narrow = self._narrow(narrowing, where, version, reader)  # once, for both halves of a hybrid
            if mode == "vector":
                rows, exact_version = self._vector(vector, where, k, version, narrowing=narrowing, narrow=narrow)
                ranked = [(row, 1.0 - float(row["_distance"])) for row in rows]
            elif mode == "fts":
                ranked = self._lexical(query, where, k, version, reader, narrowing, narrow)  # type: ignore[arg-type]
            else:
                ranked = self._hybrid(query, vector, where, k, version, reader, narrowing, narrow)  # type: ignore[arg-type]
            if exact_version:
                break  # ranked from rows read at exactly this version: nothing to re-check
            latest = self.chunks.latest_version()
            if latest == version:
                break
            version = latest
        return ranked, version

    # -- the resident tags: every row's tags in this process, one vectorised pass per caller ---

    def _resident_state(
        self, reader: Reader | None, mode: str, vector: np.ndarray | None, version: int
    ) -> ResidentState | None:
        """The serving index with every row's tags at ``version`` or later, when this search can
        be answered from it: a caller's view to evaluate, and a query vector where one is ranked."""
        if reader is None or reader.view is None or (mode != "fts" and _unit(vector) is None):
            return None
        if self.serving.usable(self._count("", version)) is None:
            return None
        return self.serving.state(version)

    def _ranked_resident(
        self,
        state: ResidentState,
        query: str,
        vector: np.ndarray,
        k: int,
        mode: str,
        reader: Reader,
        narrow: Narrow | None,
    ) -> list[tuple[dict[str, Any], float]]:
        """The best ``k`` rows ``reader`` may read at ``state``'s version (and ``narrow`` matches),
        their tags decoded from the resident codes the mask was made from."""
        check_deadline()
        allowed = state.visible(reader.view, reader.satisfied)  # type: ignore[arg-type]
        if narrow is not None:
            allowed = allowed.narrowed(state.slots_of(narrow.matching))
        if mode == "fts":
            return state.lexical(allowed, query_terms(query), k)
        unit = _unit(vector)
        if mode == "vector":
            return state.nearest(unit, allowed.mask, k, exact=False)
        depth = max(k, HYBRID_CANDIDATES)
        # The two halves at once: faiss and numpy let go of the interpreter while they scan, so on
        # two cores the exact vector half and BM25 overlap (the other half's work counted here too).
        vector_half = self._halves.submit(contextvars.copy_context().run, state.ranked_nearest, unit, allowed.mask, depth, exact=True)
        text_ranked = state.ranked_lexical(allowed, query_terms(query), depth)
        vector_ranked = vector_half.result()
        fused = reciprocal_rank_fusion([[r.chunk_id for r in vector_ranked], [r.chunk_id for r in text_ranked]])[:k]
        slot_of = {r.chunk_id: r.slot for r in [*text_ranked, *vector_ranked]}
        return state.materialised([Ranked(slot=slot_of[chunk_id], chunk_id=chunk_id, score=score) for chunk_id, score in fused])

    def plan(self, where: str, version: int) -> str:
        """"flat" (exact scan of the rows ``where`` admits), "resident" (this process's serving
        index, when it is ready) or "index" (Lance's prefiltered vector index)."""
        if self._indexed[0] != version:
            self._indexed = (version, self.chunks.has_vector_index())
        total = self._count("", version) if self.serving.wanted(self.chunks.dimension) else 0
        if not self._indexed[1] and not self.serving.applies(total):
            return "flat"
        limit = self.flat_max_rows
        if limit is None:
            limit = max(FLAT_SEARCH_MIN_ROWS, round(FLAT_SEARCH_SHARE * self._count("", version)))
        if self._count(where, version) <= limit:
            return "flat"
        if self.serving.usable(total) is not None:
            return "resident"
        return "index" if self._indexed[1] else "flat"

    def _count(self, where: str, version: int) -> int:
        """Rows ``where`` admits (all rows for ""), cached per table version."""
        key = (where, version)
        with self._flat_lock:
            held = self._counts.get(key)
        if held is not None:
            return held
        counted = self.chunks.count(where or None)
        with self._flat_lock:
            self._counts[key] = counted
            while len(self._counts) > 4096:
                self._counts.popitem(last=False)
        return counted

    # -- narrowing filters: evaluated over the caller's visible rows ---------------------------

    def _visible_ids(self, where: str, version: int) -> VisibleIds | None:
        """The ids of the rows ``where`` admits at ``version``, held per (filter, version); None if
        that version is gone."""

        def read() -> VisibleIds | None:
            table = self.chunks.read_at(version, where, ["chunk_id"])
            return None if table is None else VisibleIds(chunk_ids=table.column("chunk_id").combine_chunks())

        return self.visible.get(("ids", where, version), read)

    def _visible_fields(self, where: str, version: int) -> VisibleFields | None:
        """The filterable fields of the rows ``where`` admits at ``version`` (read through it, so
        no other row's fields are read), held per (filter, version); None if that version is gone,
        or if they are too many to hold (``_narrow`` then asks Lance)."""
        key = ("fields", where, version)
        with self._flat_lock:
            too_many = key in self._unheld_fields
        if too_many or not self.visible.holds(self._count(where, version) * FIELD_ROW_BYTES):
            return None

        def read() -> VisibleFields | None:
            table = self.chunks.read_at(version, where, FIELD_COLUMNS)
            return None if table is None else VisibleFields.from_arrow(table)

        fields = self.visible.get(key, read)
        if fields is not None and not self.visible.holds(fields.nbytes):  # larger than guessed: Lance from now on
            with self._flat_lock:
                self._unheld_fields[key] = True
                while len(self._unheld_fields) > FLAT_FILTERS_KEPT:
                    self._unheld_fields.popitem(last=False)
        return fields

    def _narrow(self, narrowing: Narrowing | None, where: str, version: int, reader: Reader | None) -> Narrow | None:
        """``narrowing``'s matches among the rows ``where`` admits at ``version``; None without a
        filter, or when that version is gone. Evaluated in memory over the rows' fields when this
        process can hold them; else by Lance under both filters, where the narrowing refines the
        rows the governance filter's scalar indexes admitted (and no index serves the narrowing's
        own columns: ``narrowing``), so the work is over the caller's rows either way."""
        if narrowing is None:
            return None
        owner = reader.key if reader is not None else None
        fields = self._visible_fields(where, version)
        if fields is not None:
            mask = narrowing.mask(fields)
            matching = fields.chunk_ids.filter(pa.array(mask, pa.bool_()))
            return Narrow(narrowing=narrowing, matching=matching, owner=owner, fields=fields, mask=mask)
        found = self.chunks.read_at(version, narrowed(where, narrowing), ["chunk_id"])
        if found is None:
            return None
        return Narrow(narrowing=narrowing, matching=found.column("chunk_id").combine_chunks(), owner=owner)

    def _held_for(self, narrow: Narrow, key: tuple[Any, ...], load: Callable[[], H | None]) -> H | None:
        """What ``load`` makes of a filter's matches, held for the caller whose they are (never
        for another: a cache keyed by a filter's content is per caller), or made afresh when no
        caller is named."""
        if narrow.owner is None:
            return load()
        return self.visible.get((*key, narrow.narrowing.digest, *narrow.owner), load)

    # -- vector ranking ---------------------------------------------------------------------

    def _vector(
        self,
        vector: np.ndarray | None,
        where: str,
        limit: int,
        version: int,
        *,
        exact: bool = False,
        narrowing: Narrowing | None = None,
        narrow: Narrow | None = None,
    ) -> tuple[list[dict[str, Any]], bool]:
        """The ``limit`` nearest rows ``where`` (and ``narrowing``) admits, by the planned search
        (``exact``: always the exact scan, whose ranking depends on the admitted rows alone), and
        whether they were read at ``version`` itself (held rows) rather than at the table's latest.

        A narrowing filter is evaluated over the fields of the rows ``where`` admits at that
        version (``_narrow``, whose answer is ``narrow``; None with a filter: that version is
        gone), never over the table: its matches cut the caller's held rows (held
        scan or serving index); without held rows, few matches (at most ``IN_LIST_MAX_IDS``) are
        read by id and scanned exactly, and more go to Lance under both filters, where the
        narrowing refines the rows the governance filter's indexes admitted (``narrowing``). Only
        when that version is gone is the narrowing evaluated by Lance alone, the same way."""
        check_deadline()
        plan = "flat" if exact else self.plan(where, version)
        if narrowing is not None and narrow is None:  # that version is gone: Lance, both filters
            visible = self._count(where, version)  # never counted under the filter: no cache keyed by it
            return self._through_lance(vector, narrowed(where, narrowing), plan, limit, version, visible), False
        held = plan == "resident" or self._scans_held(plan, vector, where, version)
        if narrow is not None and vector is not None and not held and narrow.count <= IN_LIST_MAX_IDS:
            few = self._few_matching(vector, where, narrow, limit, version)
            if few is not None:
                return few, True
        if plan == "resident":
            found = self._resident(vector, where, limit, version, narrow)
            if found is not None:
                return found, True
            plan = "index" if self._indexed[1] else "flat"
        if self._scans_held(plan, vector, where, version):
            visible = self._held(where, version, narrow)
            if visible is not None:
                return [{**row, "_distance": 1.0 - score} for row, score in visible.top(vector, limit)], True
        visible_rows = self._count(where, version) if narrow is None else max(1, narrow.count)
        return self._through_lance(vector, narrowed(where, narrowing), plan, limit, version, visible_rows), False

    def _scans_held(self, plan: str, vector: np.ndarray | None, where: str, version: int) -> bool:
        """Whether ``plan`` is an exact scan of rows this process holds (or would hold) in memory."""
        return plan == "flat" and vector is not None and self.visible.fits(self._count(where, version), self.chunks.dimension)

    def _through_lance(
        self, vector: np.ndarray | None, where: str, plan: str, limit: int, version: int, visible_rows: int | None
    ) -> list[dict[str, Any]]:
        """The ``limit`` nearest rows ``where`` admits by Lance: an exact scan for the flat plan,
        else its prefiltered vector index probed for about ``visible_rows`` (None: counted)."""
        if plan == "flat":
            return self.chunks.nearest(vector, where=where, limit=limit, columns=RESULT_COLUMNS, exact=True)
        visible = self._count(where, version) if visible_rows is None else visible_rows
        return self.chunks.nearest(
            vector,
            where=where,
            limit=limit,
            columns=RESULT_COLUMNS,
            exact=False,
            nprobes=self.nprobes(visible, version),
            refine_factor=INDEX_REFINE_FACTOR,
        )

    def _held(self, where: str, version: int, narrow: Narrow | None) -> VisibleRows | None:
        """The rows ``where`` admits at ``version``, held (None if that version is gone:
        ``ChunkReads.read_at``), cut to a filter's matches when one is given."""
        visible = self.visible.get((where, version), lambda: self._read_visible(where, version))
        return visible if visible is None or narrow is None else visible.narrowed(narrow.matching)

    def _few_matching(
        self, vector: np.ndarray, where: str, narrow: Narrow, limit: int, version: int
    ) -> list[dict[str, Any]] | None:
        """The ``limit`` nearest of the few rows a filter matched among those ``where`` admits at
        ``version``, read by id and scanned exactly (held for the caller); None if that version is gone."""

        def read() -> VisibleRows | None:
            table = self.chunks.read_rows_at(version, where, narrow.matching.to_pylist(), [*RESULT_COLUMNS, "vector"])
            return None if table is None else VisibleRows.from_arrow(table, self.chunks.dimension)

        held = self._held_for(narrow, ("narrowed", where, version), read)
        if held is None:
            return None
        return [{**row, "_distance": 1.0 - score} for row, score in held.top(vector, limit)]

    def _resident(
        self, vector: np.ndarray | None, where: str, limit: int, version: int, narrow: Narrow | None = None
    ) -> list[dict[str, Any]] | None:
        """The ``limit`` nearest rows ``where`` admits at ``version`` (among a narrowing filter's
        matches, when given) through the serving index; None when it cannot answer for that
        version (the caller then searches through Lance)."""
        index = self.serving.usable(self._count("", version))
        unit = _unit(vector)
        if index is None or unit is None:
            return None
        key = ("resident", where, version, index.version)
        view = self.visible.get(key, lambda: self.serving.view(index, where, version))
        if view is not None and narrow is not None:
            view = view.narrowed(narrow.matching, index.positions(narrow.matching))
        if view is None:
            return None
        ranked = view.nearest(unit, limit)
        return [{**row, "_distance": 1.0 - score} for row, score in ranked]

    def _read_visible(self, where: str, version: int) -> VisibleRows | None:
        """The rows ``where`` admits at ``version``, read at that version even when the table has
        moved on; None if that version is gone (a purge removed it: the caller then scans the table,
        and ``rank`` sees the version change and asks again). When this
        process holds the filter's rows from an earlier version, only the admitted rows' ids and
        tags are read, and the texts and vectors of rows it did not hold (``VisibleRows.retagged``)."""
        columns = [*RESULT_COLUMNS, "vector"]
        with self._flat_lock:
            since = self._flat_read.get(where)
        before = self.visible.peek((where, since)) if since is not None and since < version else None
        if isinstance(before, VisibleRows):
            current = self.chunks.read_at(version, where, ["chunk_id", *CURRENT_COLUMNS])
            if current is None:
                return None
            visible = before.retagged(current, lambda ids: self.chunks.read_rows_at(version, where, ids, columns))
            self.retags += visible is not None
        else:
            table = self.chunks.read_at(version, where, columns)
            visible = None if table is None else VisibleRows.from_arrow(table, self.chunks.dimension)
        if visible is None:
            return None
        with self._flat_lock:
            if self._flat_read.get(where, -1) < version:
                self._flat_read[where] = version
                self._flat_read.move_to_end(where)
            while len(self._flat_read) > FLAT_FILTERS_KEPT:
                self._flat_read.popitem(last=False)
        return visible

    def nprobes(self, visible_rows: int, version: int) -> int:
        """IVF partitions to probe: enough that about ``PROBED_VISIBLE_ROWS`` of the
        ``visible_rows`` lie in them, at least ``INDEX_NPROBES``. A prefiltered IVF search only
        ranks visible rows of the partitions it probes, so a selective filter with few probes
        under-returns (the benchmark: at 1% of 100k rows, 20 probes gave recall 0.58, all 316
        gave 1.000 at similar latency)."""
        partitions = vector_index_partitions(self._count("", version))
        visible = max(1, visible_rows)
        return max(INDEX_NPROBES, min(partitions, math.ceil(partitions * PROBED_VISIBLE_ROWS / visible)))

    # -- full-text ranking ------------------------------------------------------------------

    def _lexical(
        self, query: str, where: str, limit: int, version: int, reader: Reader, narrowing: Narrowing | None = None,
        narrow: Narrow | None = None,
    ) -> list[tuple[dict[str, Any], float]]:
        """The ``limit`` best rows ``where`` (and ``narrowing``) admits that hold a query term, by
        BM25 over the reader's visible rows (see ``lexical``; with a filter, those it matches),
        best first."""
        check_deadline()
        ranked = self._lexical_rows(where, version, reader, narrowing, narrow).top(query_terms(query), limit)
        if not ranked or "text" in ranked[0][0]:
            return ranked
        found = self.chunks.rows([row["chunk_id"] for row, _ in ranked], columns=RESULT_COLUMNS)
        return [(found[row["chunk_id"]], score) for row, score in ranked if row["chunk_id"] in found]

    def _lexical_rows(
        self, where: str, version: int, reader: Reader, narrowing: Narrowing | None = None, narrow: Narrow | None = None
    ) -> LexicalRows:
        """The reader's analysed rows under ``where`` (and ``narrowing``) at ``version``, held under
        (filters, version, reader); when that version is gone, the latest rows, held nowhere
        (``rank`` then sees the version change and asks again). A filter's matches, found among
        the rows ``where`` admits (``narrow``), are read by id through it."""
        if narrow is not None:

            def read() -> LexicalRows | None:
                table = self.chunks.read_rows_at(version, where, narrow.matching.to_pylist(), RESULT_COLUMNS)
                return self._analysed(table, reader)

            found = self._held_for(narrow, ("lexical", where, version), read)
            if found is not None:
                return found
        where = narrowed(where, narrowing)
        key = ("lexical", where, version, *reader.key)
        held = self.visible.get(key, lambda: self._analysed(self.chunks.read_at(version, where, RESULT_COLUMNS), reader))
        if held is None:  # that version is gone: the latest rows, held nowhere
            held = self._analysed(self.chunks.read_at(None, where, RESULT_COLUMNS), reader)
        return held  # type: ignore[return-value]

    def _analysed(self, table: pa.Table | None, reader: Reader) -> LexicalRows | None:
        """``table``'s rows analysed for BM25, the statistics counting those the reader's
        post-check admits (None for None), held by chunk id alone when their columns would not be
        kept (the winners' columns are then read back by id)."""
        if table is None:
            return None
        rows = LexicalRows.from_arrow(table, counted=reader.counts)
        return rows if self.visible.holds(rows.nbytes) else rows.ids_only()

    def _hybrid(
        self,
        query: str,
        vector: np.ndarray | None,
        where: str,
        k: int,
        version: int,
        reader: Reader,
        narrowing: Narrowing | None = None,
        narrow: Narrow | None = None,
    ) -> list[tuple[dict[str, Any], float]]:
        depth = max(k, HYBRID_CANDIDATES)
        vector_rows, _ = self._vector(vector, where, depth, version, exact=True, narrowing=narrowing, narrow=narrow)
        text_rows = [row for row, _ in self._lexical(query, where, depth, version, reader, narrowing, narrow)]
        return self._fused(vector_rows, text_rows, k)

    @staticmethod
    def _fused(vector_rows: list[dict[str, Any]], text_rows: list[dict[str, Any]], k: int) -> list[tuple[dict[str, Any], float]]:
        """The two rankings of one caller's rows fused by reciprocal rank."""
        rows = {row["chunk_id"]: row for row in [*text_rows, *vector_rows]}
        fused = reciprocal_rank_fusion([[r["chunk_id"] for r in vector_rows], [r["chunk_id"] for r in text_rows]])
        return [(rows[chunk_id], score) for chunk_id, score in fused[:k]]

    # -- the post-check ---------------------------------------------------------------------

    def post_check(
        self,
        ranked: list[tuple[dict[str, Any], float]],
        view: SubjectView,
        version: int,
        clauses: Mapping[str, Sequence[str]] | None = None,
    ) -> tuple[list[Hit], int]:
        """Every candidate re-checked by the enforcer (against ``clauses``, the clause registry the
        filter was compiled with, else the current one): the hits, and how many it withheld."""
        admitted, withheld = self.admitted(ranked, view, clauses)
        hits = []
        for index, (row, score, reason) in enumerate(admitted):
            if index % POST_CHECK_BLOCK == 0:
                check_deadline()
            hits.append(Hit.of_row(row, score=score, reason=reason, table_version=version,
                                   policy_version=view.policy_version))  # fmt: skip
        return hits, withheld

    def admitted(
        self,
        ranked: list[tuple[dict[str, Any], float]],
        view: SubjectView,
        clauses: Mapping[str, Sequence[str]] | None = None,
    ) -> tuple[list[tuple[dict[str, Any], float, str]], int]:
        """The post-check's decisions alone: each candidate the enforcer admits, with its score and
        the reason, and how many it withheld."""
        registry = self.registries.clauses() if clauses is None else clauses
        decide = self.decisions.decider(view, registry)
        admitted: list[tuple[dict[str, Any], float, str]] = []
        withheld = 0
        work("rows_checked", len(ranked))
        for index, (row, score) in enumerate(ranked):
            if index % POST_CHECK_BLOCK == 0:
                check_deadline()
            decision = decide(row)
            if decision.allowed:
                admitted.append((row, score, decision.reason))
            else:
                log.error("post-check withheld chunk %s the filter passed: %s", row.get("chunk_id"), decision.reason)
                withheld += 1
        return admitted, withheld


def _unit(vector: np.ndarray | None) -> np.ndarray | None:
    """``vector`` scaled to norm 1 (float32), or None where it cannot be ranked by cosine (absent,
    not finite, zero)."""
    if vector is None:
        return None
    norm = float(np.linalg.norm(vector))
    return np.asarray(vector, dtype=np.float32) / norm if math.isfinite(norm) and norm > 0 else None
