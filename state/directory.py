"""The ``directory`` table: the users and groups an identity provider provisioned (SCIM), per tenant.

One row per resource: its SCIM body as JSON, and the three facts governance reads without parsing
it (the principal it names, whether a user is active, a group's member ids). Each tenant also has a
head row that every write of that tenant rewrites, so two concurrent writes to one tenant conflict
and the later plans again from what the earlier committed (``DirectorySnapshot.commit``), as
writes to ``chunks`` do (``snapshot``): a uniqueness check or a membership change is never made
against a state that is no longer there.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..governance.sql import sql_string
from .schema import DIRECTORY
from .tables import compact_and_prune, conditional_merge, declare_primary_key, names_storage_failures, open_table

HEAD = ""
"""The ``resource_type`` of a tenant's head row."""

DIRECTORY_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),  # tenant \x1f type \x1f id: a tenant is printable text
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("resource_type", pa.string(), nullable=False),
        pa.field("resource_id", pa.string(), nullable=False),
        pa.field("body", pa.string(), nullable=False),
        pa.field("principal", pa.string()),
        pa.field("active", pa.bool_()),
        pa.field("members", pa.list_(pa.string())),
    ]
)


def directory_key(tenant: str, resource_type: str, resource_id: str) -> str:
    return f"{tenant}\x1f{resource_type}\x1f{resource_id}"


@dataclass(frozen=True, kw_only=True)
class DirectoryRow:
    """One provisioned resource as stored: ``body`` its SCIM JSON; ``principal`` the user or group
    it names; ``active`` (users) whether it may act; ``members`` (groups) its members' ids."""

    tenant: str
    resource_type: str
    resource_id: str
    body: str
    principal: str | None = None
    active: bool | None = None
    members: tuple[str, ...] = ()

    def stored(self) -> dict[str, Any]:
        return {"key": directory_key(self.tenant, self.resource_type, self.resource_id), "tenant": self.tenant,
                "resource_type": self.resource_type, "resource_id": self.resource_id, "body": self.body,
                "principal": self.principal, "active": self.active, "members": list(self.members)}  # fmt: skip


def _row(columns: dict[str, Any]) -> DirectoryRow:
    return DirectoryRow(tenant=columns["tenant"], resource_type=columns["resource_type"],
                        resource_id=columns["resource_id"], body=columns.get("body", ""),
                        principal=columns["principal"], active=columns["active"],
                        members=tuple(columns["members"] or ()))  # fmt: skip


class DirectorySnapshot:
    """One tenant's resources at one table version, and the one conditional commit on it.
    ``head`` names the tenant's last commit: a reader holding the resources of that commit need
    not read them again."""

    def __init__(self, dataset: Any, tenant: str) -> None:
        self._dataset = dataset
        self.tenant = tenant
        self.version: int = dataset.version
        self._taken = time.monotonic()
        found = dataset.to_table(columns=["body"], filter=f"key = {sql_string(directory_key(tenant, HEAD, HEAD))}")
        self.head: str | None = found.column("body")[0].as_py() if found.num_rows else None

    def rows(self) -> list[DirectoryRow]:
        """The tenant's resources, bodies included."""
        rows = self._dataset.to_table(filter=f"tenant = {sql_string(self.tenant)}").to_pylist()
        return [_row(row) for row in rows if row["resource_type"] != HEAD]

    def commit(self, writes: Sequence[DirectoryRow], deletes: Iterable[tuple[str, str]]) -> str:
        """Write ``writes`` and delete ``deletes`` ((type, id) pairs) on this snapshot's version,
        with a new head row for the tenant: Lance refuses the commit (never retried here) when
        another write of this tenant committed since. Returns the new head."""
        head = DirectoryRow(tenant=self.tenant, resource_type=HEAD, resource_id=HEAD, body=uuid.uuid4().hex)
        table = pa.Table.from_pylist([row.stored() for row in (*writes, head)], schema=DIRECTORY_SCHEMA)
        doomed = sorted({directory_key(self.tenant, kind, rid) for kind, rid in deletes})
        conditional_merge(self._dataset, "key", doomed, planned_at=self._taken, what="a directory write").execute(table)
        return head.body


@names_storage_failures
class DirectoryTable:
    """The provisioned users and groups of every tenant in one warehouse (``db``: its LanceDB
    connection); created empty when absent."""

    def __init__(self, db: Any) -> None:
        self._table = open_table(db, DIRECTORY, DIRECTORY_SCHEMA)
        declare_primary_key(self._table, "key")

    @property
    def version(self) -> int:
        return int(self._table.version)

    def snapshot(self, tenant: str) -> DirectorySnapshot:
        """``tenant``'s resources at the latest version, to plan one write from."""
        return DirectorySnapshot(self._table.to_lance(), tenant)

    def governing_rows(self, version: int) -> list[DirectoryRow]:
        """Every tenant's resources at ``version``, without their bodies: what memberships need."""
        dataset = self._table.to_lance()
        if dataset.version != version:
            dataset = dataset.checkout_version(version)
        columns = ["tenant", "resource_type", "resource_id", "principal", "active", "members"]
        rows = dataset.to_table(columns=columns, filter=f"resource_type != {sql_string(HEAD)}").to_pylist()
        return [_row(row) for row in rows]

    def compact(self) -> int:
        """Merge small data files and drop old versions (``tables.compact_and_prune``)."""
        return compact_and_prune(self._table)
