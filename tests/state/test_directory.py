"""The directory table: a tenant's write commits on the snapshot it read, so a second write planned
from the same snapshot is refused (and planned again by its caller) while another tenant's is not."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from ragwarden.errors import WarehouseError
from ragwarden.state import DirectoryRow, Store, tables
from ragwarden.state.commit_retry import PlanOutlived, is_commit_conflict


def _user(tenant: str, rid: str, name: str) -> DirectoryRow:
    return DirectoryRow(tenant=tenant, resource_type="User", resource_id=rid, body="{}", principal=name, active=True)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "warehouse"), dimension=4)


def test_two_writes_planned_from_one_snapshot_of_a_tenant_the_later_is_refused(store: Store):
    first, second = store.directory.snapshot("acme"), store.directory.snapshot("acme")
    elsewhere = store.directory.snapshot("globex")
    head = first.commit([_user("acme", "u1", "user:zed")], [])
    with pytest.raises(Exception) as refused:  # Lance's own conflict error, recognised below
        second.commit([_user("acme", "u2", "user:ivy")], [])
    assert is_commit_conflict(refused.value)
    elsewhere.commit([_user("globex", "u9", "user:hank")], [])  # another tenant's write does not conflict
    again = store.directory.snapshot("acme")
    assert again.head == head
    assert [row.resource_id for row in again.rows()] == ["u1"]


def test_a_delete_removes_the_row_and_governing_rows_read_a_given_version(store: Store):
    store.directory.snapshot("acme").commit([_user("acme", "u1", "user:zed"), _user("acme", "u2", "user:ivy")], [])
    before = store.directory.version
    store.directory.snapshot("acme").commit([], [("User", "u1")])
    assert [row.resource_id for row in store.directory.snapshot("acme").rows()] == ["u2"]
    assert sorted(row.resource_id for row in store.directory.governing_rows(before)) == ["u1", "u2"]
    assert [row.resource_id for row in store.directory.governing_rows(store.directory.version)] == ["u2"]


def test_a_directory_that_has_gone_is_refused_naming_it_never_recreated_empty(store: Store, tmp_path: Path):
    """An empty directory in its place would lift every deactivation the identity provider made."""
    store.directory.snapshot("acme").commit([_user("acme", "u1", "user:zed")], [])
    shutil.rmtree(tmp_path / "warehouse" / "directory.lance")
    with pytest.raises(WarehouseError, match="table 'directory' is missing from a warehouse that had one"):
        Store(str(tmp_path / "warehouse"), dimension=4)


def test_a_write_planned_longer_ago_than_a_plan_may_live_is_never_committed(
    store: Store, monkeypatch: pytest.MonkeyPatch
):
    """The directory prunes old versions' records too: past ``PLAN_LIFETIME`` Lance could miss a conflict."""
    planned = store.directory.snapshot("acme")
    version = store.directory.version
    monkeypatch.setattr(tables, "PLAN_LIFETIME", timedelta(0))
    with pytest.raises(PlanOutlived, match="a directory write: planned on version") as outlived:
        planned.commit([_user("acme", "u1", "user:zed")], [])
    assert is_commit_conflict(outlived.value)
    assert store.directory.version == version
