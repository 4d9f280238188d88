"""The workers of ``serve --workers N`` publish their loads in one mapped file: each claims a slot
of its own, a slot not published for a few windows (its worker gone) is no peer and is claimed
again, and a worker serving more connections than the least loaded other, by more than the
margin, is the one that closes a connection."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragwarden.api.balance import STALE_WINDOWS, WorkerLoads, create_loads_file, worker_loads


class Clock:
    """The seconds a worker's window is measured in, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def loads_file(tmp_path: Path) -> Iterator[Path]:
    path = create_loads_file(str(tmp_path))
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def two_claimed_workers(loads_file: Path, clock: Clock) -> tuple[WorkerLoads, WorkerLoads]:
    """Two workers' views of one file, each with its slot (one process stands for both)."""
    first, second = WorkerLoads(loads_file, clock=clock), WorkerLoads(loads_file, clock=clock)
    first.claim()
    second.claim()
    return first, second


def connections(worker: WorkerLoads, count: int, start: int = 0) -> list[bool]:
    """Whether each of ``count`` connections' answers closes it."""
    return [worker.answering(("127.0.0.1", port)) for port in range(start, start + count)]


def test_each_worker_claims_a_slot_of_its_own_and_gives_it_back(two_claimed_workers, clock):
    first, second = two_claimed_workers
    assert first.slot is not None and second.slot is not None and first.slot != second.slot
    first.release()
    third = WorkerLoads(first.path, clock=clock)
    third.claim()
    assert third.slot is not None and third.slot != second.slot


def test_a_worker_closes_only_past_the_margin_over_the_least_loaded_other(two_claimed_workers):
    first, second = two_claimed_workers
    assert connections(first, 3) == [False, False, True], "three against an idle peer: past the margin of two"
    assert first.closed == 1 and not first.answering(("127.0.0.1", 0)), "the closed one no longer counts"
    assert connections(second, 2) == [False, False], "never more than the other: it keeps its connections"
    for port in range(2, 40):  # both grow together to 40 connections
        assert not first.answering(("127.0.0.1", port)) and not second.answering(("127.0.0.1", port))
    assert connections(first, 5, start=40) == [False] * 5, "45 against 40: within an eighth of its own load"
    assert first.answering(("127.0.0.1", 45)), "46 against 40 is past it"


def test_a_connection_quiet_for_the_window_no_longer_counts(two_claimed_workers, clock):
    first, second = two_claimed_workers
    connections(first, 2)
    clock.now += first.window + 0.1
    assert connections(first, 2, start=10) == [False, False], "the two quiet ones left the count"
    second.publish()
    clock.now += 0.5
    assert connections(first, 2, start=10) == [False, False], "the same two again: still two"


def test_an_idle_worker_that_publishes_draws_connections_and_one_that_stopped_does_not(two_claimed_workers, clock):
    first, second = two_claimed_workers
    connections(second, 2)
    clock.now += second.window * 2
    second.publish()  # idle now, and says so
    assert any(connections(first, 10)), "the idle peer's load reads as 0, not as its last answer's 2"
    clock.now += second.window * (STALE_WINDOWS + 0.5)  # it stopped publishing: a worker gone
    assert not any(connections(first, 10, start=100)), "a stale slot is no peer to send clients to"


def test_a_worker_alone_or_unclaimed_never_closes(loads_file: Path):
    alone = WorkerLoads(loads_file)
    assert not any(connections(alone, 50)), "not yet serving: its load is not published"
    alone.claim()
    assert not any(connections(alone, 50)), "no other worker to send the client to"


def test_the_slot_of_a_worker_gone_is_no_peer_and_is_claimed_again(loads_file: Path, clock):
    """A worker killed without giving its slot back (SIGKILL) leaves its pid, load and stamp behind
    (and its pid may be reused by any process): its slot goes stale, whatever that pid is now."""
    survivor = WorkerLoads(loads_file, clock=clock)
    survivor.claim()
    script = ("import sys; from pathlib import Path; from ragwarden.api.balance import WorkerLoads; "
              "w = WorkerLoads(Path(sys.argv[1]), clock=lambda: float(sys.argv[2])); w.claim(); print(w.slot)")  # fmt: skip
    gone = subprocess.run([sys.executable, "-c", script, str(loads_file), str(clock.now)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_slot = int(gone.stdout)
    assert dead_slot != survivor.slot
    assert any(connections(survivor, 5)), "while its stamp is fresh, the other worker counts as an idle peer"
    clock.now += survivor.window * (STALE_WINDOWS + 0.5)
    assert not any(connections(survivor, 30, start=10)), "stale: no peer to send clients to"
    newcomer = WorkerLoads(loads_file, clock=clock)
    newcomer.claim()
    assert newcomer.slot == dead_slot, "a new worker takes the slot of the one that is gone"
    assert survivor.answering(("127.0.0.1", 10)), "now there is a live idle worker to send clients to"


def test_a_worker_that_found_no_slot_claims_one_once_it_frees_while_it_keeps_publishing(loads_file: Path, clock):
    holders = [WorkerLoads(loads_file, clock=clock) for _ in range(64)]
    for holder in holders:
        holder.claim()
    late = WorkerLoads(loads_file, window=0.04, clock=clock)
    late.claim()
    assert late.slot is None, "every slot is taken"
    holders[5].release()

    async def publish_a_while() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(late.keep_published(), timeout=0.05)

    asyncio.run(publish_a_while())
    assert late.slot == 5


def test_a_loads_file_that_cannot_be_mapped_leaves_the_worker_serving_unbalanced(tmp_path: Path, caplog):
    assert worker_loads(None) is None
    assert worker_loads(str(tmp_path / "removed-by-a-temp-cleaner.loads")) is None
    assert "serving without balancing" in caplog.text
