"""The warehouse: ragwarden's face for Python callers, over the one place that holds all state.

Every retrieval and every decision on an operation leaves an audit receipt, allowed or refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .config import Settings
from .embedder import MODEL_NAME, Embedder
from .errors import ConfigurationError, InvalidSourceError, NotFoundError, PermissionDeniedError
from .governance.audit import AuditLog, Receipt, fingerprint
from .governance.explain import Explanation, explain_row, not_visible
from .governance.lineage import Chunking, ChunksOutput, Embedding, GovernanceSummary, LineageEmitter
from .governance.policy import Policy
from .ingest.lifecycle import DerivedRow, ForgetReport, Lifecycle, SyncReport
from .ingest.pipeline import IngestReport, iter_sources, run_ingest
from .ingest.records import record_outcome
from .retrieval.hits import Hit
from .retrieval.review import AccessReview, access_review, inventory
from .retrieval.search import Searcher
from .store import Store

PathLike = str | Path
T = TypeVar("T")
OPERATOR = "local:operator"  # the subject of operations run in-process without a named caller


class Warehouse:
    """Ingest, governed search and the lifecycle over one warehouse URI, under one policy.

    The policy is the file given when opening, else the warehouse's own installed policy,
    read afresh at each call so an installed change takes effect at once; with none at all
    nothing is visible.
    """

    def __init__(self, settings: Settings, *, embedder: Embedder | None = None) -> None:
        self.settings = settings
        self.embedder = embedder or Embedder(batch_size=settings.embed_batch_size)
        self.store = Store(settings.warehouse, dimension=self.embedder.dimension)
        self.audit = AuditLog(self.store.db, key=settings.audit_key)
        self.openlineage = LineageEmitter(settings.warehouse, self._lineage_dir(), settings.openlineage_env)
        self._explicit_policy = Policy.from_file(settings.policy) if settings.policy else None
        self._searcher = Searcher(self.store, self.embedder)
        self._lifecycle = Lifecycle(self.store, self.embedder)
        self._installed: tuple[int, Policy | None] = (-1, None)

    @property
    def uri(self) -> str:
        return self.settings.warehouse

    def _lineage_dir(self) -> Path:
        if self.settings.lineage_dir is not None:
            return self.settings.lineage_dir
        if self.store.local_path is None:
            raise ConfigurationError(
                f"warehouse {self.uri!r} is not a local folder: set RAGWARDEN_LINEAGE_DIR for the lineage spool"
            )
        return self.store.local_path / "_lineage"

    def _tracked(
        self, job: str, sources: Iterable[str], action: Callable[[], T], output: Callable[[T], ChunksOutput]
    ) -> T:
        """Run ``action`` as an OpenLineage run: START, then COMPLETE with ``output`` or FAIL."""
        with self.openlineage.run(job, sources) as scope:  # type: ignore[arg-type]
            result = action()
            scope.output = output(result)
        return result

    def _chunks_output(self, rows: int, **facets: Any) -> ChunksOutput:
        return ChunksOutput(version=self.store.chunks.version, schema=self.store.chunks.schema, rows=rows, **facets)

    @property
    def _embedding(self) -> Embedding:
        return Embedding(model=self.embedder.name, dimension=self.embedder.dimension)

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

    # -- receipts -----------------------------------------------------------------------------

    def _receipt(self, **fields: Any) -> None:
        policy = self.policy
        self.audit.append(
            Receipt(
                policy_version=policy.version if policy else None,
                table_version=self.store.chunks.version,
                **fields,
            )
        )

    def _decided(
        self,
        operation: str,
        subject: str,
        tenant: str,
        action: Callable[[], T],
        describe: Callable[[T], Mapping[str, Any]],
    ) -> T:
        """Run an operation and record the decision: refused (and why) or done (and what)."""
        try:
            result = action()
        except (NotFoundError, PermissionDeniedError) as exc:
            self._receipt(kind="decision", operation=operation, subject=subject, tenant=tenant, allowed=False, reason=str(exc))
            raise
        self._receipt(kind="decision", operation=operation, subject=subject, tenant=tenant, allowed=True, **describe(result))
        return result

    # -- ingest -------------------------------------------------------------------------------

    def ingest(
        self,
        paths: PathLike | Sequence[PathLike],
        *,
        manifest: PathLike | None = None,
        acl_from: str | None = None,
        tenant: str | None = None,
        progress: bool | None = False,
        subject: str = OPERATOR,
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
        return self._run(outcomes, progress, subject, [str(Path(p).resolve()) for p in items])

    def ingest_records(
        self, records: Iterable[Mapping[str, Any]], *, progress: bool | None = False, subject: str = OPERATOR
    ) -> IngestReport:
        """Ingest records given as dicts in the JSONL format of DESIGN §6."""
        records = list(records)
        outcomes = (o for n, r in enumerate(records, start=1) for o in record_outcome(r, f"record {n}"))
        sources = [f"doc:{r.get('id')}" for r in records if isinstance(r, Mapping)]
        return self._run(outcomes, progress, subject, sources)

    def _run(self, outcomes: Iterable[Any], progress: bool | None, subject: str, sources: list[str]) -> IngestReport:
        def ingest() -> IngestReport:
            return run_ingest(
                outcomes,
                store=self.store,
                embedder=self.embedder,
                overlap=self.settings.chunk_overlap,
                batch_docs=self.settings.write_batch_docs,
                progress=progress,
            )

        def output(report: IngestReport) -> ChunksOutput:
            chunking = Chunking(
                tokenizer=f"{MODEL_NAME} WordPiece",
                window=self.embedder.max_tokens,
                overlap=self.settings.chunk_overlap,
                chunk_count=report.chunks,
            )
            governance = GovernanceSummary.of(self.store.source_tags(report.written), documents=report.documents)
            return self._chunks_output(report.chunks, chunking=chunking, embedding=self._embedding, governance=governance)

        def run() -> IngestReport:
            return self._tracked("ingest", sources, ingest, output)

        return self._decided(
            "ingest",
            subject,
            "*",
            run,
            lambda report: {
                "reason": report.summary(),
                "doc_ids": report.written,
                "details": {"run_id": report.run_id, "rejected": len(report.rejected), "chunks": report.chunks},
            },
        )

    # -- retrieval ----------------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        subject: str,
        tenant: str,
        k: int = 10,
        mode: str = "vector",
        min_version: int | None = None,
        actor: str | None = None,
        purpose: str | None = None,
    ) -> list[Hit]:
        """The best ``k`` chunks ``subject`` may read in ``tenant`` (fewer only if fewer are visible).

        ``min_version``: refuse to answer from a table older than this version (read-your-writes).
        ``actor``: the agent acting for ``subject``; it gets exactly the subject's visibility.
        """
        self.store.require_version(min_version)
        policy = self.policy
        hits, withheld = self._searcher.search(query, policy=policy, subject=subject, tenant=tenant, k=k, mode=mode)
        self.audit.append(
            Receipt(
                kind="retrieval",
                operation="search",
                subject=subject,
                actor=actor,
                tenant=tenant,
                purpose=purpose,
                allowed=True,
                reason=f"{len(hits)} of k={k} ({mode})",
                query_fingerprint=fingerprint(query),
                query=query if self.settings.audit_raw_queries else None,
                chunk_ids=tuple(h.chunk_id for h in hits),
                doc_ids=tuple(dict.fromkeys(h.doc_id for h in hits)),
                chunk_labels={h.chunk_id: h.labels for h in hits},
                withheld=withheld,
                policy_version=policy.version if policy else None,
                table_version=hits[0].table_version if hits else self.store.chunks.version,
            )
        )
        return hits

    # -- lifecycle ----------------------------------------------------------------------------

    def derive(
        self, text: str, *, parents: Sequence[str], subject: str, tenant: str, kind: str = "summary"
    ) -> DerivedRow:
        """Save ``text`` (a summary, note or agent memory) derived from chunks ``subject`` may read.

        The new row is visible only to whoever could read every parent; a parent the subject
        cannot read is refused exactly as a missing one is (``NotFoundError``).
        """
        return self._decided(
            "derive",
            subject,
            tenant,
            lambda: self._tracked(
                "derive",
                [f"{self.uri}/chunks"],
                lambda: self._lifecycle.derive(
                    text, parents=parents, policy=self.policy, subject=subject, tenant=tenant, kind=kind
                ),
                lambda row: self._chunks_output(
                    1,
                    embedding=self._embedding,
                    governance=GovernanceSummary.of([row.tags], documents=0, derived_rows=1),
                ),
            ),
            lambda row: {
                "reason": f"{row.kind} derived from {len(row.parents)} parents",
                "chunk_ids": (row.chunk_id,),
                "chunk_labels": {row.chunk_id: tuple(sorted(row.tags.labels))},
                "details": {"parents": list(row.parents)},
            },
        )

    def sync(self, records: PathLike | Iterable[Mapping[str, Any]], *, subject: str = OPERATOR) -> SyncReport:
        """Apply changed ACLs, labels or classifications (JSONL records, or a JSONL file) to the
        documents' chunks and to every row derived from them, without re-embedding."""
        records = _read_sync_file(Path(records)) if isinstance(records, str | Path) else list(records)
        return self._decided(
            "sync",
            subject,
            "*",
            lambda: self._tracked(
                "sync",
                [f"doc:{r.get('id')}" for r in records if isinstance(r, Mapping)],
                lambda: self._lifecycle.sync(records),
                lambda report: self._chunks_output(
                    report.chunks + report.derived,
                    governance=GovernanceSummary.of(
                        self.store.source_tags(report.documents), documents=len(report.documents), derived_rows=report.derived
                    ),
                ),
            ),
            lambda report: {
                "reason": f"re-tagged {report.chunks} chunks and {report.derived} derived rows",
                "doc_ids": report.documents,
            },
        )

    def forget(self, doc_id: str, *, reason: str, subject: str = OPERATOR) -> ForgetReport:
        """Erase a document and everything derived from it, and purge it from old versions."""
        return self._decided(
            "forget",
            subject,
            "*",
            lambda: self._tracked(
                "forget", [f"doc:{doc_id}"], lambda: self._lifecycle.forget(doc_id, reason=reason), lambda _: self._chunks_output(0)
            ),
            lambda report: {
                "reason": reason,
                "doc_ids": (report.doc_id,),
                "details": {"chunks": report.chunks, "derived": report.derived},
            },
        )

    # -- questions ----------------------------------------------------------------------------

    def explain(self, chunk_id: str, *, subject: str, tenant: str, caller: str | None = None) -> Explanation:
        """Why ``subject`` may or may not read ``chunk_id`` in ``tenant``, step by step.

        Anyone may ask about themselves; asking about someone else needs ``audit``. Without
        ``audit``, a row the subject cannot read is only "not visible": nothing of it leaks.
        """
        caller = caller or subject

        def decide() -> Explanation:
            policy = self.policy
            if policy is None:
                return not_visible(chunk_id, subject, tenant)
            auditor = policy.allows_operation(caller, tenant, "audit").allowed
            if caller != subject and not auditor:
                raise PermissionDeniedError(f"{caller} may explain only its own access; asking about {subject} needs audit")
            row = self.store.rows([chunk_id]).get(chunk_id)
            if row is None or row["tenant"] != tenant:  # another tenant's row reads as a missing one
                return not_visible(chunk_id, subject, tenant)
            explanation = explain_row(policy, subject, tenant, row, self.store.clause_registry())
            return explanation if explanation.allowed or auditor else not_visible(chunk_id, subject, tenant)

        return self._decided(
            "explain",
            caller,
            tenant,
            decide,
            lambda result: {
                "reason": f"asked about {subject}: {'visible' if result.allowed else 'not visible'}",
                "chunk_ids": (chunk_id,),
            },
        )

    def access_review(self, *, subject: str, tenant: str, caller: str | None = None) -> AccessReview:
        """What ``subject`` can read in ``tenant``, by source, label and classification."""
        caller = caller or subject
        return self._decided(
            "audit",
            caller,
            tenant,
            lambda: access_review(self.store, self._searcher, self._require(caller, subject, tenant), subject, tenant),
            lambda review: {"reason": f"access review of {subject}: {review.rows} readable rows"},
        )

    def inventory(self, *, label: str, tenant: str, caller: str) -> dict[str, list[str]]:
        """Every row carrying ``label`` in ``tenant``, grouped by source; needs ``audit``."""
        def run() -> dict[str, list[str]]:
            self._require(caller, None, tenant)
            return inventory(self.store, label, tenant)

        return self._decided(
            "audit",
            caller,
            tenant,
            run,
            lambda found: {"reason": f"inventory of label {label!r}: {len(found)} sources", "doc_ids": tuple(found)},
        )

    def lineage(self, item_id: str) -> dict[str, Any]:
        """A source or row's lineage: source -> chunks -> derived rows -> the receipts that returned them."""
        chunk_ids = self.store.chunk_ids_of(item_id)
        source = self.store.source_states([item_id]).get(item_id)
        if not chunk_ids and source is None:
            row = self.store.rows([item_id]).get(item_id)
            if row is None:
                raise NotFoundError(f"no document or row {item_id!r}")
            chunk_ids = [item_id]
        derived = self.store.derived_from(chunk_ids)
        touched = [*chunk_ids, *derived]
        receipts = {r.seq: r for chunk in touched for r in self.audit.query(chunk_id=chunk)}
        return {
            "source": None if source is None else {"doc_id": source.doc_id, "tenant": source.tenant, "version": source.doc_version},
            "chunks": chunk_ids,
            "derived": [{"chunk_id": i, "kind": r["kind"], "parents": r["parents"]} for i, r in sorted(derived.items())],
            "receipts": [
                {
                    "seq": r.seq,
                    "time": r.time.isoformat(),
                    "operation": r.operation,
                    "subject": r.subject,
                    "actor": r.actor,
                    "returned": sorted(set(r.chunk_ids) & set(touched)),
                }
                for _, r in sorted(receipts.items())
            ],
        }

    def _require(self, caller: str, subject: str | None, tenant: str) -> Policy:
        """The policy, if ``caller`` asks about itself or holds ``audit`` in ``tenant``."""
        policy = self.policy
        if policy is None:
            raise PermissionDeniedError("no policy is in force, so nothing may be reviewed")
        if caller != subject and not policy.allows_operation(caller, tenant, "audit").allowed:
            raise PermissionDeniedError(f"{caller} is not granted audit in {tenant}")
        return policy


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
