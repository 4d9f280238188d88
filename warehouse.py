"""The warehouse: ragwarden's face for Python callers, over the one place that holds all state."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .config import Settings
from .embedder import Embedder
from .governance.policy import Policy
from .errors import InvalidSourceError, PermissionDeniedError
from .governance.explain import Explanation, explain_row, not_visible
from .ingest.lifecycle import DerivedRow, ForgetReport, Lifecycle, SyncReport
from .ingest.pipeline import IngestReport, iter_sources, run_ingest
from .ingest.records import record_outcome
from .retrieval.hits import Hit
from .retrieval.review import AccessReview, access_review, inventory
from .retrieval.search import Searcher
from .store import Store

PathLike = str | Path


class Warehouse:
    """Ingest and governed search over one warehouse URI, under one policy.

    The policy is the file given when opening, else the warehouse's own installed policy,
    read afresh at each search so an installed change takes effect at once; with none at all
    nothing is visible.
    """

    def __init__(self, settings: Settings, *, embedder: Embedder | None = None) -> None:
        self.settings = settings
        self.embedder = embedder or Embedder(batch_size=settings.embed_batch_size)
        self.store = Store(settings.warehouse, dimension=self.embedder.dimension)
        self._explicit_policy = Policy.from_file(settings.policy) if settings.policy else None
        self._searcher = Searcher(self.store, self.embedder)
        self._lifecycle = Lifecycle(self.store, self.embedder)
        self._installed: tuple[int, Policy | None] = (-1, None)

    @property
    def uri(self) -> str:
        return self.settings.warehouse

    @property
    def policy(self) -> Policy | None:
        """The policy in force: the explicit one, else the latest installed, else None."""
        if self._explicit_policy is not None:
            return self._explicit_policy
        version = self.store.policies.version
        if self._installed[0] != version:
            self._installed = (version, self.store.installed_policy())
        return self._installed[1]

    def install_policy(self, path: PathLike) -> Policy:
        """Validate a policy file and make it the warehouse's own (versioned; old ones are kept)."""
        policy = Policy.from_file(path)
        self.store.install_policy(policy)
        return policy

    def ingest(
        self,
        paths: PathLike | Sequence[PathLike],
        *,
        manifest: PathLike | None = None,
        acl_from: str | None = None,
        tenant: str | None = None,
        progress: bool | None = False,
    ) -> IngestReport:
        """Ingest files, folders and JSONL files; returns a report of what was written and refused."""
        items = [paths] if isinstance(paths, str | Path) else list(paths)
        outcomes = iter_sources(
            items,
            manifest=Path(manifest) if manifest else None,
            acl_from=acl_from,
            default_tenant=tenant,
            max_bytes=self.settings.max_file_bytes,
        )
        return self._run(outcomes, progress)

    def ingest_records(self, records: Iterable[Mapping[str, Any]], *, progress: bool | None = False) -> IngestReport:
        """Ingest records given as dicts in the JSONL format of DESIGN §6."""
        outcomes = (o for n, r in enumerate(records, start=1) for o in record_outcome(r, f"record {n}"))
        return self._run(outcomes, progress)

    def _run(self, outcomes: Iterable[Any], progress: bool | None) -> IngestReport:
        return run_ingest(
            outcomes,
            store=self.store,
            embedder=self.embedder,
            overlap=self.settings.chunk_overlap,
            batch_docs=self.settings.write_batch_docs,
            progress=progress,
        )

    def search(
        self, query: str, *, subject: str, tenant: str, k: int = 10, mode: str = "vector", min_version: int | None = None
    ) -> list[Hit]:
        """The best ``k`` chunks ``subject`` may read in ``tenant`` (fewer only if fewer are visible).

        ``min_version``: refuse to answer from a table older than this version (read-your-writes).
        """
        self.store.require_version(min_version)
        return self._searcher.search(query, policy=self.policy, subject=subject, tenant=tenant, k=k, mode=mode)

    def derive(
        self, text: str, *, parents: Sequence[str], subject: str, tenant: str, kind: str = "summary"
    ) -> DerivedRow:
        """Save ``text`` (a summary, note or agent memory) derived from chunks ``subject`` may read.

        The new row is visible only to whoever could read every parent; a parent the subject
        cannot read is refused exactly as a missing one is (``NotFoundError``).
        """
        return self._lifecycle.derive(text, parents=parents, policy=self.policy, subject=subject, tenant=tenant, kind=kind)

    def sync(self, records: PathLike | Iterable[Mapping[str, Any]]) -> SyncReport:
        """Apply changed ACLs, labels or classifications (JSONL records, or a JSONL file) to the
        documents' chunks and to every row derived from them, without re-embedding."""
        if isinstance(records, str | Path):
            records = _read_sync_file(Path(records))
        return self._lifecycle.sync(records)

    def explain(self, chunk_id: str, *, subject: str, tenant: str, caller: str | None = None) -> Explanation:
        """Why ``subject`` may or may not read ``chunk_id`` in ``tenant``, step by step.

        Anyone may ask about themselves; asking about someone else needs ``audit``. Without
        ``audit``, a row the subject cannot read is only "not visible": nothing of it leaks.
        """
        caller = caller or subject
        policy = self.policy
        if policy is None:
            return not_visible(chunk_id, subject, tenant)
        auditor = policy.allows_operation(caller, tenant, "audit").allowed
        if caller != subject and not auditor:
            raise PermissionDeniedError(f"{caller} may explain only its own access; asking about {subject} needs audit")
        row = self.store.rows([chunk_id]).get(chunk_id)
        if row is None:
            return not_visible(chunk_id, subject, tenant)
        explanation = explain_row(policy, subject, tenant, row, self.store.clause_registry())
        return explanation if explanation.allowed or auditor else not_visible(chunk_id, subject, tenant)

    def access_review(self, *, subject: str, tenant: str, caller: str | None = None) -> AccessReview:
        """What ``subject`` can read in ``tenant``, by source, label and classification."""
        policy = self._require(caller or subject, subject, tenant)
        return access_review(self.store, self._searcher, policy, subject, tenant)

    def inventory(self, *, label: str, tenant: str, caller: str) -> dict[str, list[str]]:
        """Every row carrying ``label`` in ``tenant``, grouped by source; needs ``audit``."""
        self._require(caller, None, tenant)
        return inventory(self.store, label, tenant)

    def _require(self, caller: str, subject: str | None, tenant: str) -> Policy:
        """The policy, if ``caller`` asks about itself or holds ``audit`` in ``tenant``."""
        policy = self.policy
        if policy is None:
            raise PermissionDeniedError("no policy is in force, so nothing may be reviewed")
        if caller != subject and not policy.allows_operation(caller, tenant, "audit").allowed:
            raise PermissionDeniedError(f"{caller} is not granted audit in {tenant}")
        return policy

    def forget(self, doc_id: str, *, reason: str) -> ForgetReport:
        """Erase a document and everything derived from it, and purge it from old versions."""
        return self._lifecycle.forget(doc_id, reason=reason)


def _read_sync_file(path: Path) -> list[dict[str, Any]]:
    """Sync records of a JSONL file; a malformed line stops the sync before anything changes."""
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSourceError(str(path), f"cannot read: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise InvalidSourceError(f"{path}:{number}", f"not valid JSON ({exc.msg})") from None
    return records


def open(  # noqa: A001 - the public name is fixed by the API
    uri: str | None = None, policy: PathLike | None = None, *, settings: Settings | None = None
) -> Warehouse:
    """Open (creating if needed) the warehouse at ``uri`` (default: settings / ``RAGWARDEN_WAREHOUSE``)."""
    changes: dict[str, object] = {}
    if uri:
        changes["warehouse"] = str(uri)
    if policy:
        changes["policy"] = str(policy)
    return Warehouse((settings or Settings.from_env()).with_(**changes))
