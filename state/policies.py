"""The ``policies`` table's door: every installed policy text, in commit order; the one in force
has the highest ``seq``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from .commit_retry import retrying_conflicts
from .home import Door, Home
from .schema import POLICIES_SCHEMA
from .tables import names_storage_failures


@dataclass(frozen=True, kw_only=True)
class InstalledPolicy:
    """One installed policy as the ``policies`` table holds it: its commit order, version and text."""

    seq: int
    version: str
    source: str | None
    text: str


class PolicyText(Protocol):
    """A policy as the ``policies`` table stores it (``governance.policy.Policy`` is one)."""

    @property
    def version(self) -> str: ...
    @property
    def source(self) -> str | None: ...
    @property
    def stored_text(self) -> str: ...


@names_storage_failures
class Policies(Door):
    """Installs, and the latest install."""

    def __init__(self, home: Home, table: Any) -> None:
        super().__init__(home)
        self._table = table

    @property
    def version(self) -> int:
        """Changes whenever a policy is installed (the pinned one inside ``Store.pinned``)."""
        pin = self._home.pinned()
        return pin.policies if pin is not None else int(self._table.version)

    def install(self, policy: PolicyText) -> int:
        """Append ``policy`` as the newest installed one; returns its ``seq``. Two replicas installing
        at once cannot take one ``seq`` (it is the table's primary key): the later re-reads and
        takes the next, so commit order, not any clock, decides which is in force."""

        def attempt() -> int:
            dataset = self._table.to_lance()
            seqs = dataset.to_table(columns=["seq"]).column("seq")
            seq = (pc.max(seqs).as_py() or 0) + 1
            row = {"seq": seq, "version": policy.version, "source": policy.source, "text": policy.stored_text,
                   "installed_at": datetime.now(timezone.utc)}  # fmt: skip
            merge = dataset.merge_insert("seq").when_not_matched_insert_all().use_index(False).conflict_retries(0)
            merge.execute(pa.Table.from_pylist([row], schema=POLICIES_SCHEMA))
            return seq

        return retrying_conflicts(attempt, what="installing a policy")

    def installed(self) -> InstalledPolicy | None:
        """The latest install (the highest ``seq``), or None if the warehouse has none."""
        if self._table.count_rows() == 0:
            return None
        row = self._table.to_arrow().sort_by([("seq", "descending")]).slice(0, 1).to_pylist()[0]
        return InstalledPolicy(seq=row["seq"], version=row["version"], source=row["source"], text=row["text"])
