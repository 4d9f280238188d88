"""The ``audit`` table: where receipts are appended, read and compacted.

The chain itself (what a receipt holds, its hash, what ``verify`` proves) is ``governance.audit``;
this module only stores rows. An append is a conditional insert keyed on ``seq``: ``seq`` is the
table's unenforced primary key, which makes Lance record the inserted keys in the commit and treat
two concurrent commits inserting the same ``seq`` as a conflict, so the later one is refused and
its writer reads the head again. Without that declaration lancedb 0.40 let both commits
through (a probe: 60 appends by three processes gave 45 distinct ``seq``; with it, 60 in a row).
Do not build a scalar index on ``seq``: Lance's indexed merge route does not record inserted keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from ..errors import WarehouseError
from .commit_retry import is_commit_conflict
from .schema import AUDIT, AUDIT_SCHEMA, PRIMARY_KEY
from .tables import compact_and_prune, damaged_files, local_path, names_storage_failures

KEY_CHECK = b"ragwarden.audit.key_check"
"""Schema metadata naming the check value of the HMAC key the log was created with."""


@names_storage_failures
class AuditTable:
    """The receipts' rows. ``key_check`` is recorded in the table's schema when this creates it."""

    def __init__(self, db: Any, *, key_check: str) -> None:
        self.uri: str = db.uri
        self._table = self._open(db, key_check)
        self._tip: tuple[int, int, str] | None = None  # (version, seq, hash) of this process's last commit
        schema = self._table.schema
        if not schema.equals(AUDIT_SCHEMA, check_metadata=False):
            raise WarehouseError(
                f"the audit table has schema {schema}, expected {AUDIT_SCHEMA}; "
                "it was written by another version of ragwarden"
            )
        seq_metadata = schema.field("seq").metadata or {}
        if seq_metadata.get(PRIMARY_KEY) != b"true" and PRIMARY_KEY + b":position" not in seq_metadata:
            self._table.set_unenforced_primary_key("seq")  # without it concurrent appends can share a seq

    @staticmethod
    def _open(db: Any, key_check: str) -> Any:
        try:
            return db.open_table(AUDIT)
        except Exception:
            pass
        try:
            return db.create_table(AUDIT, schema=AUDIT_SCHEMA.with_metadata({KEY_CHECK: key_check.encode()}))
        except Exception as create_error:
            try:  # another process created it first
                return db.open_table(AUDIT)
            except Exception:
                raise WarehouseError(f"the audit table cannot be opened or created: {create_error}") from create_error

    def damaged_files(self) -> list[str]:
        return damaged_files(local_path(self.uri), {AUDIT: self._table})

    def recorded_key_check(self) -> str | None:
        """The key check the table was created with (None: a table older than key checks)."""
        value = (self._table.schema.metadata or {}).get(KEY_CHECK)
        return value.decode() if value is not None else None

    def schema_intact(self) -> bool:
        """Whether the table still has the receipts' schema (a changed one is tampering or damage)."""
        return bool(self._table.schema.equals(AUDIT_SCHEMA, check_metadata=False))

    def count(self) -> int:
        return int(self._table.count_rows())

    def head(self, floor: int = 0) -> tuple[int, str] | None:
        """(seq, hash) of the highest receipt at the latest commit (looked for at or above ``floor``
        first, a cheaper read); None when there is none."""
        return _head_of(self._table.to_lance(), floor)

    def append_on_head(
        self, build: Callable[[int, str], Sequence[Mapping[str, Any]]], floor: int = 0
    ) -> list[Mapping[str, Any]] | None:
        """Read the head ((seq, hash) of the highest receipt, (0, None) when empty; looked for at or
        above ``floor`` first; no read at all when the pinned version is this process's own last
        commit) from one pinned version, ``build`` the next rows on it, and commit them
        on that same version: the rows, or None when a commit since then took one of their ``seq``
        (Lance refuses it). Reading and committing at one version is what makes a lost race a
        refusal, never a commit of the rows whose ``seq`` happened to be free."""
        dataset = self._table.to_lance()
        if self._tip is not None and self._tip[0] == dataset.version:
            head: tuple[int, str] | None = self._tip[1:]
        else:
            head = _head_of(dataset, floor)
        rows = build(*(head or (0, "")))
        data = pa.Table.from_pylist([dict(row) for row in rows], schema=AUDIT_SCHEMA)
        merge = dataset.merge_insert("seq").when_not_matched_insert_all().use_index(False).conflict_retries(0)
        try:
            result = merge.execute(data)
        except Exception as exc:
            if is_commit_conflict(exc):
                return None
            raise WarehouseError(f"the audit receipts could not be written: {exc}") from exc
        if result["num_inserted_rows"] != len(rows):  # planned on the version read: never expected
            raise WarehouseError("the audit receipts were written only in part; run verify and report it")
        # This commit is the head while no other writer commits: the next append reads it from here.
        self._tip = (int(dataset.version), int(rows[-1]["seq"]), str(rows[-1]["hash"]))
        self._table.checkout_latest()
        return list(rows)

    def rows(self, where: str | None = None) -> list[dict[str, Any]]:
        """Rows ``where`` admits (every row for None), highest ``seq`` first."""
        search = self._table.search()
        if where:
            search = search.where(where)
        return search.limit(None).to_arrow().sort_by([("seq", "descending")]).to_pylist()

    def all_rows(self) -> list[dict[str, Any]]:
        """Every row, lowest ``seq`` first (for verifying the chain)."""
        return self._table.to_arrow().sort_by([("seq", "ascending")]).to_pylist()

    def compact(self) -> int:
        """Merge the table's small data files (each commit leaves one) and drop its old versions
        (``tables.VERSIONS_KEPT``); rows are unchanged. Returns the versions dropped."""
        return compact_and_prune(self._table)


def _head_of(dataset: Any, floor: int) -> tuple[int, str] | None:
    """(seq, hash) of the highest receipt of ``dataset`` (one pinned version), looked for at or above
    ``floor`` first and then everywhere; None when it holds none."""
    for low in dict.fromkeys((int(floor), 0)):
        found = dataset.to_table(columns=["seq", "hash"], filter=f"seq >= {low}")
        if found.num_rows:
            top = found.sort_by([("seq", "descending")]).slice(0, 1).to_pylist()[0]
            return int(top["seq"]), str(top["hash"])
    return None
