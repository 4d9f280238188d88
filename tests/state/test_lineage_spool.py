"""The warehouse's own lineage spool (``TableSpool``, for warehouses on object storage): events
wait as rows in spool order until removed, an unreadable or refused one is set aside, and one
flush at a time holds the lease, which a flusher that died leaves to the next once it expires."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ragwarden.state import TableSpool
from ragwarden.state import lineage_spool as spool_module
from ragwarden.state.tables import connect


@pytest.fixture
def table_spool(tmp_path: Path) -> TableSpool:
    """An empty spool table in a fresh warehouse folder (opened as every process opens it)."""
    return TableSpool(connect(str(tmp_path / "db")), str(tmp_path / "db"))


def test_events_wait_in_spool_order_until_removed_and_a_refused_one_is_set_aside(table_spool: TableSpool) -> None:
    names = [table_spool.put({"eventType": kind, "n": n}) for n, kind in enumerate(["START", "COMPLETE", "START"])]
    assert table_spool.pending() == names == sorted(names)
    assert table_spool.read(names[1]) == {"eventType": "COMPLETE", "n": 1}
    table_spool.remove(names[0])
    table_spool.reject(names[1], "refused by the lineage backend: 422")
    assert table_spool.pending() == [names[2]]
    with pytest.raises(KeyError):
        table_spool.read(names[0])


def test_one_flush_at_a_time_holds_the_lease_and_gives_it_back(table_spool: TableSpool, tmp_path: Path) -> None:
    other = TableSpool(connect(str(tmp_path / "db")), str(tmp_path / "db"))  # another process's view
    with table_spool.exclusive() as ours:
        assert ours
        with other.exclusive() as theirs:
            assert not theirs, "a second flush while the first holds the lease"
    with other.exclusive() as theirs:
        assert theirs, "given back: the next flush takes it"


def test_a_lease_whose_holder_died_is_taken_once_it_expires(
    table_spool: TableSpool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spool_module, "LEASE_SECONDS", 0.2)
    held = table_spool.exclusive()
    assert held.__enter__()  # a flusher that dies here never gives the lease back
    other = TableSpool(connect(str(tmp_path / "db")), str(tmp_path / "db"))
    with other.exclusive() as theirs:
        assert not theirs
    threading.Event().wait(0.3)
    with other.exclusive() as theirs:
        assert theirs


def test_of_flushes_racing_for_a_free_lease_one_takes_it(table_spool: TableSpool, tmp_path: Path) -> None:
    spools = [TableSpool(connect(str(tmp_path / "db")), str(tmp_path / "db")) for _ in range(4)]
    for spool in spools:
        spool.pending()  # each has opened the table
    start, won, release = threading.Barrier(len(spools)), [], threading.Event()

    def flush(spool: TableSpool) -> None:
        start.wait()
        with spool.exclusive() as ours:
            won.append(ours)
            release.wait(5)

    threads = [threading.Thread(target=flush, args=(spool,)) for spool in spools]
    for thread in threads:
        thread.start()
    while len(won) < len(spools):
        threading.Event().wait(0.01)
    release.set()
    for thread in threads:
        thread.join()
    assert won.count(True) == 1
