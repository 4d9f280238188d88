"""A request's deadline: work checks it between steps and stops once it has passed or the request
was called off; a deadline already in force (a request's own) stands over one opened inside it; at
each check the request gives the others a turn, a longer one while a cheaper caller's request works."""

from __future__ import annotations

import time

import pytest

from ragwarden.config import Settings
from ragwarden.deadline import PAUSE_SECONDS, Deadline, bounded, check_deadline, in_turns
from ragwarden.embedder import Embedder
from ragwarden.errors import DeadlineExceededError
from ragwarden.stages import work_done
from ragwarden.warehouse import Warehouse


def test_work_outside_a_bounded_request_is_never_stopped():
    check_deadline()


def test_a_deadline_stops_the_work_once_it_has_passed_naming_its_setting():
    with bounded(0.05):
        check_deadline()
        time.sleep(0.06)
        with pytest.raises(DeadlineExceededError, match="deadline of 0.05 s .* search_deadline_seconds"):
            check_deadline()
    check_deadline()  # the block is over: nothing bounds what follows


def test_a_request_called_off_stops_at_its_next_check_and_the_outer_deadline_stands():
    outer = Deadline(60)
    with bounded(60, outer), bounded(0.001) as inner:
        assert inner is outer
        time.sleep(0.01)
        check_deadline()  # the inner 1 ms never applied: the request's own deadline stands
        outer.call_off("its client went away")
        with pytest.raises(DeadlineExceededError, match="its client went away"):
            check_deadline()


def test_a_search_past_its_deadline_is_stopped_before_it_reads_anything(small_warehouse: Warehouse, embedder: Embedder):
    hurried = Warehouse(Settings(warehouse=small_warehouse.uri, search_deadline_seconds=1e-9), embedder=embedder)
    before = work_done()
    with pytest.raises(DeadlineExceededError):
        hurried.search("cafeteria menu", subject="user:alice", tenant="acme", filter={"kind": "chunk"})
    assert work_done() == before, "it stopped before any row was read or decided"


def test_at_each_check_a_request_gives_way_and_waits_longer_while_a_cheaper_callers_request_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    monkeypatch.setattr("ragwarden.deadline.time.sleep", slept.append)  # records each turn instead of taking it
    cheaper_at_work = [False]
    with bounded(60, Deadline(60, behind=lambda: cheaper_at_work[0])):
        check_deadline()
        cheaper_at_work[0] = True
        check_deadline()
        assert list(in_turns(range(40), every=16)) == list(range(40))  # turns at 0, 16 and 32, never a stop
    assert slept == [0, PAUSE_SECONDS, PAUSE_SECONDS, PAUSE_SECONDS, PAUSE_SECONDS]
