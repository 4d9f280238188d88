"""Governed search: exactly the best min(k, visible) rows, in every mode, and nothing else."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np
import pytest
from support.raw_tables import raw_table

from ragwarden.embedder import Embedder
from ragwarden.errors import InvalidRequestError
from ragwarden.governance.caller import Caller
from ragwarden.governance.compiler import SubjectView
from ragwarden.policies import policy_file
from ragwarden.retrieval.search import Searcher
from ragwarden.warehouse import Warehouse

DEMO_PEOPLE = [("user:alice", "acme"), ("user:bob", "acme"), ("user:carol", "acme"), ("user:dave", "acme"), ("user:erin", "globex")]

QUESTIONS = ["What are the salary bands for engineers?", "Is Acme planning another acquisition?", "litigation hold"]


@pytest.mark.parametrize(("subject", "tenant"), DEMO_PEOPLE)
@pytest.mark.parametrize("k", [1, 3, 100])
def test_vector_search_returns_exactly_the_best_min_k_visible(demo_warehouse, visible_to, embedder, subject, tenant, k):
    visible = visible_to(subject, tenant)
    assert visible, "every demo person sees something"
    matrix = np.asarray([row["vector"] for row in visible], dtype=np.float32)
    for question in QUESTIONS:
        hits = demo_warehouse.search(question, subject=subject, tenant=tenant, k=k)
        assert len(hits) == min(k, len(visible))
        scores = matrix @ embedder.encode([question])[0]
        expected = [visible[i]["chunk_id"] for i in np.argsort(-scores, kind="stable")[: len(hits)]]
        assert [h.chunk_id for h in hits] == expected
        assert [round(h.score, 4) for h in hits] == [round(float(s), 4) for s in sorted(scores, reverse=True)[: len(hits)]]


@pytest.mark.parametrize("mode", ["fts", "hybrid"])
@pytest.mark.parametrize(("subject", "tenant"), DEMO_PEOPLE)
def test_text_and_hybrid_search_return_only_visible_rows(demo_warehouse, visible_to, subject, tenant, mode):
    visible = {row["chunk_id"] for row in visible_to(subject, tenant)}
    for question in QUESTIONS:
        hits = demo_warehouse.search(question, subject=subject, tenant=tenant, k=10, mode=mode)
        assert {h.chunk_id for h in hits} <= visible
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    if mode == "hybrid":
        assert len(demo_warehouse.search("budget", subject=subject, tenant=tenant, k=5, mode=mode)) == min(5, len(visible))


def test_full_text_search_finds_the_rows_holding_the_terms(demo_warehouse, visible_to):
    hits = demo_warehouse.search("litigation hold", subject="user:carol", tenant="acme", k=5, mode="fts")
    assert hits and all("litigation" in h.text.lower() or "hold" in h.text.lower() for h in hits)


def test_the_same_question_gets_different_answers_for_different_people(demo_warehouse):
    answers = {
        subject: {h.doc_id for h in demo_warehouse.search(QUESTIONS[0], subject=subject, tenant=tenant, k=5)}
        for subject, tenant in DEMO_PEOPLE[:4]
    }
    assert len({frozenset(a) for a in answers.values()}) == 4  # four people, four different answers


def test_a_tenant_sees_nothing_of_another(demo_warehouse, demo_rows):
    globex = {row["chunk_id"] for row in demo_rows if row["tenant"] == "globex"}
    for subject, _ in DEMO_PEOPLE:
        hits = demo_warehouse.search("salary budget acquisition", subject=subject, tenant="globex", k=100)
        assert {h.chunk_id for h in hits} <= globex


def test_each_hit_says_why_it_was_visible(demo_warehouse):
    (hit,) = demo_warehouse.search("salary bands", subject="user:alice", tenant="acme", k=1)
    assert "which the subject holds" in hit.reason and hit.labels is not None


def test_without_any_policy_nothing_is_visible(fresh_warehouse, make_record):
    fresh_warehouse.ingest_records([make_record(acl={"allow": ["everyone"]}, labels=[], classification="public")])
    assert fresh_warehouse.policy is None
    assert fresh_warehouse.search("budget", subject="user:alice", tenant="acme", k=5) == []


def test_an_installed_policy_takes_effect_on_the_next_search(fresh_warehouse, make_record):
    fresh_warehouse.ingest_records([make_record(acl={"allow": ["everyone"]}, labels=[], classification="public")])
    fresh_warehouse.install_policy(policy_file("demo.csv"))
    assert len(fresh_warehouse.search("budget", subject="user:alice", tenant="acme", k=5)) == 1


def test_rows_appended_since_the_last_optimize_are_found_by_full_text_search(demo_policy_warehouse, make_record, embedder):
    public = {"acl": {"allow": ["everyone"]}, "labels": [], "classification": "public"}
    demo_policy_warehouse.ingest_records([make_record(id="old", text="zebra crossing notes", **public)])
    chunks = raw_table(demo_policy_warehouse.store)
    row = {k: v for k, v in chunks.search().limit(1).to_list()[0].items() if k != "_distance"}
    row.update(chunk_id="appended", doc_id="new", text="zebra stripes pattern", vector=embedder.encode(["zebra stripes"])[0])
    chunks.add([row])  # after the index was built, and not optimized into it
    hits = demo_policy_warehouse.search("zebra", subject="user:dave", tenant="acme", k=5, mode="fts")
    assert {h.doc_id for h in hits} == {"old", "new"}


def test_a_row_with_an_unknown_acl_clause_is_never_returned(demo_policy_warehouse, make_record):
    public = {"acl": {"allow": ["everyone"]}, "labels": [], "classification": "public"}
    demo_policy_warehouse.ingest_records([make_record(id="good", text="apples and pears", **public)])
    row = raw_table(demo_policy_warehouse.store).search().limit(1).to_list()[0]
    row.pop("_distance", None)
    row.update(chunk_id="forged", doc_id="forged", acl_clauses=["c-not-registered"])
    raw_table(demo_policy_warehouse.store).add([row])
    hits = demo_policy_warehouse.search("apples and pears", subject="user:dave", tenant="acme", k=5)
    assert [h.doc_id for h in hits] == ["good"]


def test_post_check_withholds_a_row_the_policy_denies_and_records_it(demo_warehouse, demo_rows, caplog):
    searcher = demo_warehouse._searcher
    secret = next(r for r in demo_rows if r["classification"] == 3)
    with caplog.at_level(logging.ERROR):
        hits, withheld = searcher.post_check([(secret, 1.0)], SubjectView.of(demo_warehouse.policy, "user:dave", "acme"), 0)
    assert (hits, withheld) == ([], 1)
    assert secret["chunk_id"] in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be a whole number from 1 to 1000"),
        ({"k": 1001}, "k must be a whole number"),
        ({"k": True}, "k must be a whole number"),
        ({"mode": "sql"}, "mode 'sql' is not one of vector, fts, hybrid"),
        ({"subject": "group:finance"}, "must be a user"),
        ({"subject": "alice"}, "not of the form"),
        ({"tenant": "acme\n"}, "non-printable"),
        ({"query": "   "}, "query is empty"),
        ({"query": "x" * 9000}, "the limit is 8192"),
    ],
)
def test_bad_search_arguments_are_refused_naming_the_argument(demo_warehouse, kwargs, message):
    args = {"query": "budget", "subject": "user:alice", "tenant": "acme", "k": 3, "mode": "vector"} | kwargs
    query = args.pop("query")
    with pytest.raises(InvalidRequestError, match=message):
        demo_warehouse.search(query, **args)


def test_the_compiled_filter_is_cached_per_subject_and_policy_version(demo_warehouse):
    searcher = demo_warehouse._searcher
    policy = demo_warehouse.policy
    first = searcher.compiled_filter(searcher.view(policy, Caller(subject="user:alice", tenant="acme")))
    assert searcher.compiled_filter(searcher.view(policy, Caller(subject="user:alice", tenant="acme"))) is first
    assert searcher.compiled_filter(searcher.view(policy, Caller(subject="user:dave", tenant="acme"))) != first


def test_search_is_available_through_open(tmp_path, make_record):
    import ragwarden

    warehouse: Warehouse = ragwarden.open(str(tmp_path / "wh"), policy=policy_file("demo.csv"))
    warehouse.ingest_records([make_record(acl={"allow": ["everyone"]}, labels=[], classification="public")])
    (hit,) = warehouse.search("budget review", subject="user:alice", tenant="acme", k=10, mode="vector")
    assert (hit.doc_id, hit.source_uri, hit.classification.label) == ("doc-1", "test://doc-1", "public")


CONCURRENT_QUERIES = ["quarterly budget", "salary bands", "cafeteria", "acquisition", "litigation hold", "Rotterdam"]


def _alone_and_together(search: Callable[[str], list[str]]) -> tuple[dict[str, list[str]], dict[str, list[list[str]]]]:
    """Each query searched alone, then every query twice at once from its own thread."""
    alone = {q: search(q) for q in CONCURRENT_QUERIES}
    start = threading.Barrier(len(CONCURRENT_QUERIES) * 2)
    together: dict[str, list[list[str]]] = {q: [] for q in CONCURRENT_QUERIES}

    def run(query: str) -> None:
        start.wait()
        together[query].append(search(query))

    threads = [threading.Thread(target=run, args=(q,)) for q in CONCURRENT_QUERIES * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return alone, together


def test_concurrent_searches_embed_their_queries_together_and_answer_as_alone(demo_warehouse, export_cache):
    batching = Searcher(demo_warehouse.store.read_doors(), Embedder(backend="onnx", cache_dir=export_cache))  # fp32: batches
    caller = Caller(subject="user:carol", tenant="acme")

    def search(query: str) -> list[str]:
        return [h.chunk_id for h in batching.search(query, policy=demo_warehouse.policy, caller=caller, k=5).hits]

    before = (batching._queries.batches, batching._queries.items)
    alone, together = _alone_and_together(search)
    assert all(answers == [alone[q], alone[q]] for q, answers in together.items())
    batches, items = batching._queries.batches - before[0], batching._queries.items - before[1]
    assert items == len(CONCURRENT_QUERIES) * 3 and batches < items, f"{items} queries in {batches} embedding calls"


def test_with_the_int8_encoder_each_search_embeds_its_own_query_and_answers_as_alone(demo_warehouse):
    """int8 encodes one text per call whatever it is given, so searches embed on their own threads."""
    searcher = demo_warehouse._searcher
    before = searcher._queries.items

    def search(query: str) -> list[str]:
        return [h.chunk_id for h in demo_warehouse.search(query, subject="user:carol", tenant="acme", k=5)]

    alone, together = _alone_and_together(search)
    assert all(answers == [alone[q], alone[q]] for q, answers in together.items())
    assert searcher._queries.items == before
