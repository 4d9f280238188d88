"""One freshness check per request: shared by concurrent requests, never older than a request."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ragwarden.state.freshness import SingleFlight
from ragwarden.warehouse import Warehouse
from tests.support.raw_tables import raw_table


def test_a_call_never_gets_a_read_that_began_before_it_arrived() -> None:
    value = {"now": 1}
    reading, release = threading.Event(), threading.Event()

    def read() -> int:
        seen = value["now"]
        if seen == 1:  # the first read stalls until the value has changed behind it
            reading.set()
            release.wait(10)
        return seen

    flight = SingleFlight(read)
    with ThreadPoolExecutor(2) as pool:
        early = pool.submit(flight.get)
        assert reading.wait(10)
        value["now"] = 2  # committed after the first read began, before the second call arrives
        late = pool.submit(flight.get)
        release.set()
        assert early.result(10) == 1
        assert late.result(10) == 2, "the later call was served a read that began before it"
    assert flight.reads == 2


def test_calls_that_arrive_during_a_read_share_the_next_one() -> None:
    gate = threading.Event()
    flight = SingleFlight(lambda: gate.wait(10) or 1)
    with ThreadPoolExecutor(16) as pool:
        first = pool.submit(flight.get)
        waiting = [pool.submit(flight.get) for _ in range(15)]
        gate.set()
        assert first.result(10) == 1 and all(call.result(10) for call in waiting)
    assert flight.reads <= 3, f"{flight.reads} reads for 16 concurrent calls: nothing was shared"


def test_a_failed_read_is_not_handed_to_the_calls_waiting_for_it() -> None:
    outcomes = iter([OSError("timed out"), 7])

    def read() -> int:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    flight = SingleFlight(read)
    with pytest.raises(OSError, match="timed out"):
        flight.get()
    assert flight.get() == 7


def test_inside_one_pin_every_version_is_the_checks_and_after_it_the_latest(small_warehouse: Warehouse) -> None:
    store = small_warehouse.store
    with store.pinned() as pinned:
        assert store.chunks.version == pinned.chunks and store.policies.version == pinned.policies
        raw_table(store, "labels").add([{"label": "added-meanwhile"}])  # another writer commits
        raw_table(store, "chunks").delete("doc_id = 'nothing-matches'")
        assert store.registries.version() == f"{pinned.clauses}.{pinned.labels}"
        assert store.chunks.version == pinned.chunks
        assert store.chunks.latest_version() > pinned.chunks
    assert store.chunks.version > pinned.chunks and "added-meanwhile" in store.registries.labels()


def test_a_registration_reaches_the_check_with_the_rows_that_need_it(small_warehouse: Warehouse, make_record) -> None:
    """A writer registers a new label before it commits rows carrying it, so the check re-reads the
    registries only when ``chunks`` has moved, and then sees every registration before it."""
    store = small_warehouse.store
    before = store.versions()
    raw_table(store, "labels").add([{"label": "registered-alone"}])  # no row carries it: nothing to see
    assert store.versions().labels == before.labels
    report = small_warehouse.ingest_records([make_record(id="doc-new", labels=["brand-new-label"])])
    assert report.ok
    after = store.versions()
    assert after.chunks > before.chunks and after.labels > before.labels
    with store.pinned():
        assert {"brand-new-label", "registered-alone"} <= store.registries.labels()
