"""Full-text and hybrid search reveal nothing of rows the caller cannot read (DESIGN §4, SECURITY §7).

BM25 over one shared index carries statistics (row count, document frequencies, average length)
of every row of every tenant, so scores would move when someone else writes text the caller cannot
see. Here a caller's hits, their order and their scores must be a function of the rows it may read
and nothing else:

1. a globex reader's answers are byte-identical before and after acme stores restricted rows
   with the same words, and, separately, after a globex row she cannot read does (while a row she
   can read does move them: the statistics are live, and hers);
2. the scores are BM25 over exactly the rows the independent oracle says she may read
   (``support.bm25``, to 1e-6), and a caller who may read every row gets Lance's own scores;
3. for random small corpora and policies, a caller's answer is the answer it gets once every row
   it cannot read is deleted from the table.
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from lancedb.index import FTS
from lancedb.query import MatchQuery
from support.bm25 import bm25_ranking
from support.demo_world import DEMO_CORPUS
from support.oracle import oracle_visible
from support.policy_worlds import World, look_alike_worlds
from support.raw_tables import raw_table

from ragwarden.governance.caller import Caller
from ragwarden.governance.policy import Policy
from ragwarden.governance.tags import EVERYONE, GovernanceTags
from ragwarden.retrieval.hits import Hit
from ragwarden.retrieval.search import Searcher
from ragwarden.state import Store, chunks_schema
from ragwarden.warehouse import Warehouse

READER = ("user:erin", "globex")  # HR lead in globex: the public and internal rows, and HR's
QUESTIONS = ["salary scales", "Rotterdam plant hydraulic pumps", "parental leave policy", "opening hours and closures"]
SAME_WORDS = (
    "Salary scales for the Rotterdam plant. Hydraulic pumps and parental leave policy. "
    "Opening hours and closures. "
)
UNREADABLE = {
    "another tenant's restricted rows": [
        {"id": f"acme-secret-{i}", "text": SAME_WORDS * (i + 1), "tenant": "acme",
         "acl": {"allow": ["group:hr-managers"]}, "labels": ["hr"], "classification": "restricted",
         "uri": f"test://acme/secret-{i}"}
        for i in range(5)
    ],
    "a row of her own tenant she may not read": [
        {"id": "globex-fin-secret", "text": SAME_WORDS * 3, "tenant": "globex", "acl": {"allow": ["group:finance"]},
         "labels": ["finance"], "classification": "confidential", "uri": "test://globex/fin-secret"}
    ],
}  # fmt: skip
READABLE = {"id": "globex-pub-new", "text": SAME_WORDS, "tenant": "globex", "acl": {"allow": ["everyone"]},
            "labels": [], "classification": "public", "uri": "test://globex/pub-new"}  # fmt: skip


def _exactly(hit: Hit) -> tuple[Any, ...]:
    """Everything a hit tells its reader, the score to the last bit (``float.hex``), except the
    table version, which every commit in any tenant moves (SECURITY's known limits)."""
    return (hit.chunk_id, hit.score.hex(), hit.doc_id, hit.source_uri, hit.text, hit.labels, hit.classification,
            hit.doc_version, hit.position, hit.reason, hit.kind, hit.parents, hit.policy_version)  # fmt: skip


def _answers(warehouse: Warehouse) -> dict[str, list[list[tuple[Any, ...]]]]:
    subject, tenant = READER
    def answer(question: str, mode: str) -> list[tuple[Any, ...]]:
        return [_exactly(hit) for hit in warehouse.search(question, subject=subject, tenant=tenant, k=10, mode=mode)]

    return {mode: [answer(question, mode) for question in QUESTIONS] for mode in ("fts", "hybrid")}


@pytest.mark.parametrize("unreadable", UNREADABLE)
def test_rows_she_may_not_read_change_nothing_of_her_full_text_and_hybrid_answers(demo_copy: Warehouse, unreadable: str) -> None:
    warehouse = demo_copy
    before = _answers(warehouse)
    assert all(before["fts"]), "every question finds rows she may read"

    report = warehouse.ingest_records(UNREADABLE[unreadable])
    assert report.ok and report.chunks, report.rejected
    assert _answers(warehouse) == before

    # a row she may read with the same words does move her scores: the statistics are hers, and live
    assert warehouse.ingest_records([READABLE]).ok
    fts_after = _answers(warehouse)["fts"]
    assert fts_after != before["fts"]
    assert any(hit[2] == READABLE["id"] for hits in fts_after for hit in hits)


PEOPLE = [("user:alice", "acme"), ("user:bob", "acme"), ("user:carol", "acme"), ("user:dave", "acme"),
          ("user:erin", "globex"), ("user:carol", "globex"), ("user:dave", "globex")]  # fmt: skip
ASKED = ["What are the salary bands for engineers?", "salary salary bands", "Is Acme planning another acquisition?",
         "litigation hold", "the", "Rotterdam", "zzzz nothing matches"]  # fmt: skip


@pytest.mark.parametrize(("subject", "tenant"), PEOPLE)
def test_full_text_scores_are_bm25_over_exactly_the_rows_the_oracle_lets_her_read(
    demo_warehouse: Warehouse, demo_rows: list[dict], demo_oracle: Any, subject: str, tenant: str
) -> None:
    visible = demo_oracle(subject, tenant)
    rows = [row for row in demo_rows if row["chunk_id"] in visible]
    for question in ASKED:
        hits = demo_warehouse.search(question, subject=subject, tenant=tenant, k=10, mode="fts")
        expected = bm25_ranking(rows, question, 10)
        assert [hit.chunk_id for hit in hits] == [chunk_id for chunk_id, _ in expected], question
        assert [hit.score for hit in hits] == pytest.approx([score for _, score in expected], rel=0, abs=1e-6)


def _resident(warehouse: Warehouse) -> Searcher:
    """A searcher over ``warehouse`` whose serving index, with every row's tags and terms, is built."""
    searcher = Searcher(warehouse.store.read_doors(), warehouse.embedder, resident_index_bytes=2**28, resident_min_rows=0)
    searcher.serving.build_now()
    return searcher


@pytest.mark.parametrize(("subject", "tenant"), PEOPLE)
def test_resident_terms_score_bm25_over_exactly_the_rows_the_oracle_lets_her_read(
    demo_warehouse: Warehouse, demo_rows: list[dict], demo_oracle: Any, subject: str, tenant: str
) -> None:
    searcher = _resident(demo_warehouse)
    caller = Caller(subject=subject, tenant=tenant)
    rows = [row for row in demo_rows if row["chunk_id"] in demo_oracle(subject, tenant)]
    for question in ASKED:
        found = searcher.search(question, policy=demo_warehouse.policy, caller=caller, k=10, mode="fts")
        assert searcher.serving.state(found.table_version) is not None, "answered from the resident terms"
        expected = bm25_ranking(rows, question, 10)
        assert [hit.chunk_id for hit in found.hits] == [chunk_id for chunk_id, _ in expected], question
        assert [hit.score for hit in found.hits] == pytest.approx([score for _, score in expected], rel=0, abs=1e-6)


def test_a_caller_who_may_read_every_row_gets_lances_own_scores(demo_policy_warehouse: Warehouse) -> None:
    """The analyser and the constants are Lance's: over a table the caller may read in full, the
    visible rows' statistics are the index's, and the scores are the ones Lance's index gives."""
    records = [json.loads(line) for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    public = [{**record, "tenant": "acme", "acl": {"allow": ["everyone"]}, "labels": [], "classification": "public"}
              for record in records]  # fmt: skip
    assert demo_policy_warehouse.ingest_records(public).ok
    chunks = raw_table(demo_policy_warehouse.store)
    chunks.create_index("text", config=FTS())  # Lance's index, for its scores: ingest builds none
    for question in ASKED[:4]:
        ours = demo_policy_warehouse.search(question, subject="user:dave", tenant="acme", k=10, mode="fts")
        lance = chunks.search(MatchQuery(question, "text"), query_type="fts").select(["chunk_id"]).limit(10).to_list()
        assert {row["chunk_id"]: pytest.approx(row["_score"], rel=1e-5) for row in lance} == {
            hit.chunk_id: hit.score for hit in ours
        }


# ---------------------------------------------------------------- random corpora and policies

WORDS = ["pump", "pumps", "pumping", "valve", "Valves", "leave", "the", "Rotterdam", "naïve", "x" * 45]


@st.composite
def corpora(draw: st.DrawFn) -> tuple[World, str, str, list[GovernanceTags], list[str], list[list[float]], str, int]:
    """A policy (look-alike names: quotes, commas, SQL and LIKE characters, look-alike unicode),
    a reader in one of its tenants, two to ten rows whose tags often let the reader
    in (allowing the reader, everyone or a group the reader joins), at least one of them readable,
    texts from a few words (stems, case, a stop word, a word too long to index), 2-d vectors with
    ties, a query and a k."""
    world = draw(look_alike_worlds())
    tenant = draw(st.sampled_from(world.tenants))
    reader = draw(st.sampled_from(world.users))
    joined = sorted({group for member, group, where in world.memberships if member == reader and where == tenant})
    principals = [*world.users, *world.groups, EVERYONE]

    @st.composite
    def tags(draw: st.DrawFn) -> GovernanceTags:
        allow = draw(st.sampled_from([reader, EVERYONE, *joined] * 3 + principals))
        return GovernanceTags.for_source(
            tenant=draw(st.sampled_from([tenant] * 3 + world.tenants)),
            allow=[allow],
            deny=[draw(st.sampled_from(principals))] if draw(st.integers(0, 4)) == 0 else [],
            labels=[draw(st.sampled_from(world.labels))] if draw(st.integers(0, 3)) == 0 else [],
            classification=draw(st.sampled_from([0, 0, 0, 1, 2, 3])),
        )

    count = draw(st.integers(2, 10))
    rows = draw(st.lists(tags(), min_size=count, max_size=count))
    texts = draw(st.lists(st.lists(st.sampled_from(WORDS), max_size=8).map(" ".join), min_size=count, max_size=count))
    directions = st.sampled_from([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [0.8, 0.6]])
    vectors = draw(st.lists(directions, min_size=count, max_size=count))
    query = " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3)))
    registry = {token: members for one in rows for token, members in one.clauses_by_token.items()}
    drafts = [{"chunk_id": str(index), **one.row_columns()} for index, one in enumerate(rows)]
    readable = oracle_visible(world, reader, tenant, drafts, registry)
    assume(readable)  # a reader who may read nothing proves nothing here
    return world, reader, tenant, rows, texts, vectors, query, draw(st.integers(1, 6))


def _write(folder: str, tags: list[GovernanceTags], texts: list[str], vectors: list[list[float]]) -> Store:
    store = Store(folder, dimension=2)
    for one in tags:
        store.registries.register_clauses(one.clauses_by_token)
    store.registries.register_labels(label for one in tags for label in one.labels)
    rows = [
        {"chunk_id": f"c{index}", "doc_id": f"d{index}", "source_uri": f"test://{index}", "doc_version": "v1",
         "kind": "chunk", "position": 0, "text": text, "vector": vector, **one.row_columns(), "parents": [],
         "ingest_run_id": "run", "embedding_model": "dummy", "created_at": None}
        for index, (one, text, vector) in enumerate(zip(tags, texts, vectors, strict=True))
    ]  # fmt: skip
    raw_table(store).add(pa.Table.from_pylist(rows, schema=chunks_schema(2)))
    raw_table(store).create_index("text", config=FTS())  # as older warehouses hold one (search must not use it)
    return store


def _search(
    searcher: Searcher, policy: Policy, reader: str, tenant: str, query: str, k: int, mode: str
) -> list[tuple[str, str]]:
    found = searcher.search(
        query, policy=policy, caller=Caller(subject=reader, tenant=tenant), k=k, mode=mode, vector=[1.0, 0.5]
    )
    hits, withheld = found.hits, found.withheld
    assert withheld == 0
    return [(hit.chunk_id, hit.score.hex()) for hit in hits]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)
@given(corpus=corpora())
@pytest.mark.parametrize("plan", ["read per caller", "resident"])
def test_a_callers_answer_is_the_answer_once_every_row_it_may_not_read_is_deleted(corpus: tuple[Any, ...], plan: str) -> None:
    world, reader, tenant, tags, texts, vectors, query, k = corpus
    policy = Policy.from_text(world.csv_text())
    with tempfile.TemporaryDirectory() as folder:
        store = _write(folder, tags, texts, vectors)
        if plan == "resident":  # every row's tags and terms held, moved by the deletion's delta
            searcher = Searcher(store.read_doors(), None, resident_index_bytes=2**26, resident_min_rows=0)  # type: ignore[arg-type]
            searcher.serving.build_now()
        else:
            searcher = Searcher(store.read_doors(), None)  # type: ignore[arg-type]
        rows = raw_table(store).to_arrow().to_pylist()
        visible = oracle_visible(world, reader, tenant, rows, store.registries.clauses())
        answers = {mode: _search(searcher, policy, reader, tenant, query, k, mode) for mode in ("fts", "hybrid")}
        assert {chunk_id for chunk_id, _ in answers["fts"] + answers["hybrid"]} <= visible

        hidden = sorted(row["chunk_id"] for row in rows if row["chunk_id"] not in visible)
        if hidden:  # deleted, and erased as ``forget`` erases: files rewritten, text index rebuilt
            raw_table(store).delete("chunk_id IN (" + ", ".join(f"'{chunk_id}'" for chunk_id in hidden) + ")")
            store.maintenance.purge_history()
        for mode, answer in answers.items():
            assert _search(searcher, policy, reader, tenant, query, k, mode) == answer, mode
    event("rows hidden: " + ("none" if not hidden else "some"))
    event("fts found: " + ("none" if not answers["fts"] else "k" if len(answers["fts"]) == k else "fewer than k"))
    if len({score for _, score in answers["fts"]}) < len(answers["fts"]):
        event("fts answer holds equal scores")

