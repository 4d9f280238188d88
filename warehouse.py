"""The warehouse: ragwarden's face for Python callers, over the one place that holds all state.

Every operation goes through the permission gate once (``gate``): it decides, records the receipt,
allowed or refused, and hands the decision over. Operations run by the process itself (no caller:
the operator, as the CLI does) need no grant; a named caller (the HTTP and MCP services pass the
credential's ``Identity``) needs the policy's grant of the operation in its tenant, and touches
nothing outside that tenant. The Python API's ``subject``/``tenant``/``actor`` arguments are an
edge too: they become one validated ``Caller`` before anything runs.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from .api_keys import ApiKeys
from .config import INGEST_ENGINES, AuthSettings, IngestEngineName, Settings
from .credentials import Authenticator
from .embedder import MODEL_NAME, Embedder
from .errors import (
    ConfigurationError,
    InvalidPolicyError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    PolicyError,
    WarehouseError,
)
from .gate import ANY_TENANT, OPERATOR, Need, Permission, PermissionGate
from .governance.audit import ArchiveReport, ChainReport, StoredReceipt, fingerprint, probe_ids
from .governance.caller import Caller, asker, caller_of, required_caller
from .governance.compiler import SubjectView
from .governance.explain import Explanation, explain_row, not_visible
from .governance.lineage import Chunking, ChunksOutput, Embedding, GovernanceSummary
from .governance.operations import Operation
from .governance.policy import Policy, parse_rules, tenants_of
from .governance.trends import Trends, trends
from .governance.trends import since as trend_start
from .ingest.bulk import Checked, Provenance, checked_rows, write_checked
from .ingest.importers import AclFromMetadata, AclManifest, Collected, CollectedBatch, ImportReport, run_import
from .ingest.lifecycle import DerivedRow, ForgetReport, Lifecycle, SyncReport, read_sync_file
from .ingest.pipeline import IngestReport, count_inputs, held_apart, iter_sources, run_ingest
from .ingest.records import confined_outcomes
from .ingest.writer import Overrides
from .lineage_emitter import FlushReport, LineageEmitter
from .lineage_query import lineage_of
from .lineage_transport import WarehouseFilesTransport
from .policy_in_force import PolicyInForce, ProvisionedPolicy
from .retrieval.collapse import Collapse
from .retrieval.hits import RESULT_COLUMNS, Hit
from .retrieval.narrowing import Narrowing, narrowing
from .retrieval.resident import resident_bytes
from .retrieval.review import AccessReview, Readers, Vocabulary, access_review, inventory, readers, vocabulary
from .retrieval.search import Searcher, SearchResult
from .retrieval.serving import ServingStatus, store_artifact
from .state import (
    LINEAGE_EVENTS,
    AuditLog,
    Backup,
    Backups,
    DirectoryRow,
    DirectoryTable,
    Migration,
    RestoreReport,
    Store,
    holds_warehouse,
    restore_new,
)

PathLike = str | Path
T = TypeVar("T")
__all__ = ["ANY_TENANT", "OPERATOR", "Warehouse", "open"]
MAX_TREND_DAYS = 366
log = logging.getLogger(__name__)


class Warehouse:
    """Ingest, governed search and the lifecycle over one warehouse URI, under one policy.

    The policy is the file given when opening, else the warehouse's own installed policy,
    read afresh at each call so an installed change takes effect at once; with none at all
    nothing is visible.
    """

    def __init__(self, settings: Settings, *, embedder: Embedder | None = None, create: bool = True,
                 migrate: bool = False) -> None:  # fmt: skip
        """Open the warehouse ``settings`` name, creating it if absent, unless ``create`` is False:
        then a missing warehouse is a ``WarehouseError`` naming the path (what every command that
        only reads uses, so a mistyped path is never an empty warehouse). A warehouse of a format
        this release does not serve is a ``WarehouseFormatError`` saying what to do; ``migrate``
        (``Warehouse.migrate``) brings an earlier one to this release's format first."""
        self.settings = settings
        self.embedder = embedder or Embedder.from_settings(settings)
        self.store = Store(settings.warehouse, dimension=self.embedder.dimension, storage_options=settings.storage_options,
                           create=create, migrate=migrate)  # fmt: skip
        self._check_embedding_model()
        self.audit = AuditLog(self.store.audit_table, key=settings.audit_key, retired_keys=settings.audit_retired_keys,
                              seal=settings.audit_key_seal)  # fmt: skip
        self.openlineage = self._lineage_emitter()
        if settings.policy:
            self._policy = PolicyInForce.from_file(settings.policy)
            self._policy.current()  # a bad file is refused at once, naming its line
        else:
            self._policy = PolicyInForce(load=self._installed_policy, stamp=lambda: self.store.policies.version)
        self._provisioned = ProvisionedPolicy(version=lambda: self.store.directory_version,
                                              rows_at=self.store.directory.governing_rows)  # fmt: skip
        self._gate = PermissionGate(audit=self.audit, policy=lambda: self.policy, table_version=lambda: self.store.chunks.version,
                                    fresh=self.store.pinned, read_deadline_seconds=settings.search_deadline_seconds)  # fmt: skip
        self._reads = self.store.read_doors()
        self._writes = self.store.write_doors()
        self._searcher = Searcher(self._reads, self.embedder, flat_cache_bytes=settings.flat_cache_bytes,
                                  resident_index_bytes=settings.resident_index_mb * 2**20)  # fmt: skip
        self._lifecycle = Lifecycle(self._writes, self.embedder)

    def _check_embedding_model(self) -> None:
        """Record the embedder's model in a warehouse that has none recorded; refuse one whose
        vectors another model made, naming both (its queries would be embedded by the wrong model)."""
        recorded, configured = self.store.chunks.embedding_model, self.embedder.model_id
        if recorded is None:
            try:
                self.store.chunks.record_embedding_model(configured)
            except WarehouseError as exc:  # read-only storage: serve; a writer records it
                log.warning("could not record the embedding model in %s: %s", self.settings.warehouse, exc)
        elif recorded != configured:
            raise ConfigurationError(
                f"warehouse {self.settings.warehouse!r} holds vectors made by {recorded!r}; this process embeds "
                f"with {configured!r}, whose vectors do not compare with them: open it with {recorded!r}"
            )

    def optimize(self) -> dict[str, Any]:
        """Build the tables' indexes, compact and tidy them (``Store.optimize``), then store the
        serving index's artifact for replicas to load when the table has a vector index and the
        index fits ``resident_index_mb``; as the operator, receipted in every tenant. Returns what
        was done."""
        return self._gate.run(
            Operation.ADMIN, None, Need.GRANT, lambda _: self._optimize(),
            lambda done: {"reason": "optimized the warehouse"},
            touched=lambda _: self._every_tenant(),
            neutral=True,
        )  # fmt: skip

    @classmethod
    def migrate(cls, settings: Settings, *, embedder: Embedder | None = None) -> Migration:
        """Bring the warehouse ``settings`` name to the format this release writes (``ragwarden
        migrate``), as the operator, receipted in every tenant. Idempotent: a warehouse at that
        format is left as it is, and the run receipted as such. The steps only add (a column, the
        format's record), so replicas of the release before serve it throughout."""
        with cls(settings, embedder=embedder, create=False, migrate=True) as warehouse:
            migration = warehouse.store.migration
            assert migration is not None  # opened with migrate
            return warehouse._gate.run(
                Operation.ADMIN, None, Need.GRANT, lambda _: migration,
                lambda done: {"reason": done.summary(), "details": {"found": done.found, "now": done.now, "steps": list(done.steps)}},
                touched=lambda _: warehouse._every_tenant(), neutral=True,
            )  # fmt: skip

    def check_format(self) -> None:
        """Refuse (``WarehouseFormatError``, with what to do) once the warehouse records a format
        this release does not serve; what ``/readyz`` asks before it says ready."""
        self.store.still_served(self.store.policies.version)

    def _every_tenant(self) -> dict[str, tuple[str, ...]]:
        """Every tenant the warehouse holds documents of or its policy names (for the receipts of
        an operator's run over all of them)."""
        policy = self.policy
        return {t: () for t in {*self.store.sources.tenants(), *(policy.tenants if policy else ())}}

    def _optimize(self) -> dict[str, Any]:
        report = self.store.maintenance.optimize()
        done: dict[str, Any] = {"rows": report.rows, "vector_index": report.vector_index, "serving_index": None}
        fits = resident_bytes(report.rows, self.store.dimension) <= self.settings.resident_index_mb * 2**20
        if self.store.chunks.has_vector_index() and fits:
            stored = store_artifact(self._reads)
            if stored is not None:
                done["serving_index"] = {"version": stored.version, "rows": stored.rows, "bytes": stored.nbytes}
        return done

    def serving_status(self) -> ServingStatus:
        """This process's serving index: off, idle, building, ready, over budget or failed (why)."""
        return self._searcher.serving.status()

    @property
    def uri(self) -> str:
        return self.settings.warehouse

    @property
    def table_version(self) -> int:
        """The ``chunks`` table's version this request reads (what hits and ``/readyz`` name)."""
        return self.store.chunks.version

    @property
    def api_keys(self) -> ApiKeys:
        """This warehouse's API keys (their table opened at the first use)."""
        return ApiKeys(lambda: self.store.api_keys)

    def authenticator(self, auth: AuthSettings | None = None) -> Authenticator:
        """What turns a credential into an identity for this warehouse's services: ``auth`` (by
        default the warehouse's own settings) and its API keys."""
        return Authenticator(auth or self.settings.auth, self.api_keys)

    def close(self, timeout: float = 60.0) -> None:
        """Finish the background work this process started on the warehouse (the audit journal
        folded into its table, compaction and checkpoints done), so the folder can be copied or
        backed up as it is. The warehouse stays usable; a later write starts that work again.
        Raises WarehouseError if something still runs after ``timeout`` seconds."""
        if not self.audit.close(timeout):
            raise WarehouseError(f"the audit log's background work still ran after {timeout:g} s; "
                                 "call close() again before copying the warehouse")  # fmt: skip
        if not self._searcher.serving.close(timeout):
            raise WarehouseError(f"the serving index was still being built after {timeout:g} s; call close() again")

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rights(self, *, caller: Caller) -> tuple[str, ...]:
        """The operations the policy in force grants ``caller`` in its tenant (its token's groups
        included), read from the policy alone: no row is read, no receipt written. For a client to
        offer what it may do; each operation it then asks for is decided on its own."""
        return tuple(str(operation) for operation in self._gate.rights(caller))

    def receipts_pending(self) -> tuple[int, float]:
        """How many of this process's audit receipts wait in the journal to be folded into the
        audit table, and how many seconds the oldest has waited (``(0, 0.0)``: none). Read-only,
        for monitoring: a count that keeps growing means folding fails or falls behind."""
        return self.audit.pending()

    def lineage_spooled(self) -> int:
        """How many lineage events wait in the spool for the backend (``flush_lineage`` sends them).
        Read-only, for monitoring: a count that keeps growing means the backend is unreachable."""
        return len(self.openlineage.spool.pending())

    # -- backup and restore (docs/operations.md) ----------------------------------

    def backup(self, destination: str) -> Backup:
        """Copy the warehouse to ``destination`` (an empty folder or S3 prefix): every table at one
        version each, pinned while it is copied, the receipts still in the journal folded into the
        copy of the audit log, and the lineage files (``state.backup``). Safe while other processes
        serve and write. As the operator, receipted in every tenant (the receipt is not in the copy)."""
        return self._gate.run(
            Operation.ADMIN, None, Need.GRANT, lambda _: self._backups().take(destination),
            lambda taken: {"reason": f"backed up the warehouse to {taken.uri}",
                           "details": {"backup": taken.uri, "tables": {t.name: t.version for t in taken.tables}}},
            touched=lambda _: self._every_tenant(),
            neutral=True,
        )  # fmt: skip

    def restore(self, *, backup: str | None = None, at: datetime | None = None) -> RestoreReport:
        """Bring the warehouse's rows and source records back to a backup (``backup``, its URI) or to
        how they stood at ``at`` (a time with its zone), as new versions of ``chunks`` and ``sources``
        (``state.backup``); then apply again every erasure receipted since that point (less
        ``state.backup.ERASURE_SLACK``, for the writers' clocks), so a restore never brings an
        erased item back. Who may read (policies, API keys, the directory) and what
        was recorded (the audit log, erasure marks, lineage files) are left as they are. As the
        operator, receipted in every tenant, each receipt naming the erasures applied there."""
        if (backup is None) == (at is None):
            raise InvalidRequestError("restore needs either a backup to restore or a time to restore to, not both")

        def run(_: Permission) -> RestoreReport:
            backups = self._backups()
            report = backups.restore_backup(backups.read(backup)) if backup is not None else backups.restore_history(at)  # type: ignore[arg-type]
            return replace(report, erasures=self._erase_again(report.since))

        return self._gate.run(
            Operation.ADMIN, None, Need.GRANT, run, self._restore_receipt,
            touched=lambda report: {**self._every_tenant(), **_by_tenant(report.erasures)},
            neutral=True,
        )  # fmt: skip

    @classmethod
    def restore_backup(
        cls, settings: Settings, backup: str, *, embedder: Embedder | None = None
    ) -> tuple[Warehouse, RestoreReport]:
        """Restore the backup at ``backup`` into the warehouse ``settings`` name: in place when one is
        there (``restore``); into an empty location, every table as the backup holds it, version
        numbers included, the audit log too (the backup's own, which verifies: receipts written after
        the backup were in the lost warehouse). The restore is receipted in the restored log."""
        if holds_warehouse(settings.warehouse, settings.storage_options):
            warehouse = cls(settings, embedder=embedder, create=False)
            return warehouse, warehouse.restore(backup=backup)
        report = restore_new(settings.warehouse, settings.storage_options, backup)
        warehouse = cls(settings, embedder=embedder, create=False)
        warehouse._gate.run(Operation.ADMIN, None, Need.GRANT, lambda _: report, warehouse._restore_receipt,
                            touched=lambda _: warehouse._every_tenant(), neutral=True)  # fmt: skip
        return warehouse, report

    @staticmethod
    def _restore_receipt(report: RestoreReport) -> dict[str, Any]:
        """What every tenant's receipt of a restore says: the point and each table's versions (the
        same in every tenant); the erasures applied again go, as ids, to their own tenant's receipt."""
        tables = {t.name: {"before": t.before, "point": t.point, "after": t.after, "how": t.how} for t in report.tables}
        return {"reason": f"restored rows and source records to {report.point}", "details": {"restore": tables}}

    def _backups(self) -> Backups:
        return Backups(self.store.uri, storage_options=self.store.storage_options, registries=self.store.registries,
                       maintenance=self.store.maintenance)  # fmt: skip

    def _erase_again(self, since: datetime) -> tuple[tuple[str, str], ...]:
        """Apply again, oldest first, every erasure the audit log receipted at or after ``since`` whose
        item a restore brought back; returns (tenant, id) of each."""
        erased = []
        for receipt in sorted(self.audit.query(operation=str(Operation.FORGET), allowed=True, since=since),
                              key=lambda r: r.time):  # fmt: skip
            for item in receipt.doc_ids:
                try:
                    self._lifecycle.erasure(item, receipt.tenant, f"erasure {receipt.receipt_id} applied again after a restore")()
                except NotFoundError:
                    continue  # not brought back
                erased.append((receipt.tenant, item))
        return tuple(erased)

    def flush_lineage(self) -> FlushReport:
        """Send the lineage events that wait in the spool (what every run does first)."""
        return self.openlineage.flush()

    def _lineage_emitter(self) -> LineageEmitter:
        """Where lineage events wait and, with no backend configured, go: the folder the setting
        names; else a local warehouse's ``_lineage``; else the warehouse itself (its
        ``lineage_spool`` table and ``_lineage/events`` objects), so no host holds an event its
        crash could lose. A store that keeps no files beside its tables (neither a folder nor S3)
        writes those event files to a per-user folder of this host."""
        env = self.settings.openlineage_env
        if self.settings.lineage_dir is not None:
            return LineageEmitter(self.uri, self.settings.lineage_dir, env)
        if self.store.local_path is not None:
            return LineageEmitter(self.uri, self.store.local_path / "_lineage", env)
        files = self.store.files(LINEAGE_EVENTS)
        if files is None:
            digest = hashlib.sha256(self.uri.encode("utf-8")).hexdigest()[:16]
            events = Path.home() / ".local" / "state" / "ragwarden" / "lineage" / digest
            return LineageEmitter(self.uri, events, env, spool=self.store.lineage_spool())
        return LineageEmitter(self.uri, None, env, spool=self.store.lineage_spool(), events=WarehouseFilesTransport(files))

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

    # -- the policy -----------------------------------------------------------------------------

    @property
    def policy(self) -> Policy | None:
        """The policy in force: the file given when opening, else the latest installed, else None;
        re-read when it changes, the last good one kept if the change does not load; with the
        memberships and deactivations an identity provider provisioned (``provisioned``)."""
        return self._provisioned.over(self._policy.current())

    def document_count(self) -> int:
        """How many source documents the warehouse holds, in every tenant."""
        return self.store.sources.count()

    def configuration_notes(self, tenant: str) -> tuple[str, ...]:
        """What in this warehouse's configuration makes every search in ``tenant`` find nothing:
        no policy in force, a tenant the policy never names, no documents at all. Facts about
        the configuration, the same for every caller, never about rows: an empty answer a caller
        gets for lack of rights is said by none of these."""
        policy = self.policy
        if policy is None:
            return ("no policy is installed, so nothing is visible: install one with `ragwarden policy install FILE`",)
        notes = []
        if tenant not in tenants_of(policy.rules):
            notes.append(f"the policy in force (version {policy.version}) names no tenant {tenant!r}: check --tenant")
        if self.document_count() == 0:
            notes.append(f"the warehouse at {self.uri} holds no documents yet: ingest some with `ragwarden ingest PATH`")
        return tuple(notes)

    @property
    def policy_problem(self) -> str | None:
        """Why the policy in force is not the newest one (it did not load), or None."""
        return self._policy.problem

    @property
    def public_policy_problem(self) -> str | None:
        """``policy_problem`` without the bad line's content, for readiness probes."""
        return self._policy.public_problem

    def _installed_policy(self) -> Policy | None:
        installed = self.store.policies.installed()
        if installed is None:
            return None
        return Policy.from_text(installed.text, source=f"{self.uri} (policy {installed.version})")

    def install_policy(self, path: PathLike) -> Policy:
        """Validate a policy file and make it the warehouse's own (versioned; old ones are kept), as
        the operator: receipted in every tenant the policy in force or the new one names."""
        named = self._policy.current() if not self.settings.policy else None

        def install(_: Permission) -> Policy:
            policy = Policy.from_file(path)
            self._provisioned.require_combining(policy)  # refused if it cannot combine with what was provisioned
            self.store.policies.install(policy)
            return policy

        return self._gate.run(
            Operation.ADMIN, None, Need.GRANT, install,
            lambda policy: {"reason": f"installed policy {policy.version} from a file"},
            touched=lambda policy: {t: () for t in policy.tenants | (named.tenants if named else frozenset())},
            neutral=True,
        )  # fmt: skip

    def install_policy_text(
        self,
        text: str,
        *,
        subject: str | None = None,
        tenant: str | None = None,
        actor: str | None = None,
        caller: Caller | None = None,
    ) -> Policy:
        """Install a policy on behalf of a named caller, who needs ``admin`` in every tenant that the
        policy in force or the new one names: one tenant's administrator cannot rewrite another's rules.

        The right is decided first, from what validating each line gives (the tenants the text
        names, in one pass over it); the role graph is checked and the enforcer built only for a
        caller who holds it, so a caller who does not learns nothing of the policy's graph and
        costs no more than that one pass."""
        who = required_caller(caller, subject, tenant, actor, Operation.ADMIN)
        source = "policy sent by " + who.subject

        def refused_line(exc: InvalidPolicyError) -> InvalidRequestError:
            return InvalidRequestError(f"policy line {exc.line}: {exc.reason}")

        def install(permission: Permission) -> Policy:
            try:
                rules = parse_rules(text, source, check_graph=False)
            except InvalidPolicyError as exc:
                raise refused_line(exc) from None
            current = permission.policy  # decides, with every membership the caller holds
            named = self._policy.current()  # names the tenants: a directory's rows name none of their own
            for other in sorted(tenants_of(rules) | (named.tenants if named else frozenset())):
                decision = current.allows_operation(who.subject, other, Operation.ADMIN) if current else None
                if decision is None or not decision.allowed:
                    raise PermissionDeniedError(f"installing this policy needs admin in {other}, which {who.subject} lacks")
            try:
                policy = Policy(rules, source=source, source_text=text)  # checks the role graph, builds the enforcer
                self._provisioned.require_combining(policy)  # and that it combines with what was provisioned
            except InvalidPolicyError as exc:
                raise refused_line(exc) from None
            except PolicyError as exc:
                raise InvalidRequestError(str(exc)) from None
            self.store.policies.install(policy)
            return policy

        return self._gate.run(
            Operation.ADMIN,
            who,
            Need.GRANT,
            install,
            lambda policy: {"reason": f"installed policy {policy.version} ({len(policy.rules)} rules)"},
        )

    def provision(
        self, run: Callable[[DirectoryTable], T], describe: Callable[[T], Mapping[str, Any]], *, caller: Caller
    ) -> T:
        """Run one request of the identity provider (``api.scim``) on the warehouse's directory of
        users and groups, for ``caller``'s tenant, if the policy grants it ``provision`` there;
        recorded, allowed or refused, with what ``describe`` says of the result."""
        return self._gate.run(Operation.PROVISION, caller, Need.GRANT, lambda _: run(self.store.directory), describe)

    def check_directory(self, tenant: str, rows: Sequence[DirectoryRow]) -> None:
        """Raise ``PolicyError`` if ``tenant``'s directory, were it ``rows``, would not combine with
        the policy in force (a membership nesting groups past the limit): checked before a write."""
        self._provisioned.check(self._policy.current(), tenant, rows)

    # -- ingest -------------------------------------------------------------------------------

    def ingest(
        self,
        paths: PathLike | Sequence[PathLike],
        *,
        manifest: PathLike | None = None,
        acl_from: str | None = None,
        tenant: str | None = None,
        progress: bool | None = False,
        engine: IngestEngineName = "local",
        allow_move: bool = False,
        restore_erased: bool = False,
    ) -> IngestReport:
        """Ingest files, folders and JSONL files (as the operator); returns a report of what was
        written and refused.

        A file's id is its path relative to the folder named (a file named itself: its name),
        unless its sidecar or the manifest gives one. An input whose id a document of another
        source holds is refused, naming both, unless ``allow_move``; an erased document is
        refused unless ``restore_erased``. Either override is recorded in the receipt.
        ``engine`` ``ray`` chunks and embeds on a Ray cluster (``ingest.ray_engine``); the result
        is the same as a local ingest's."""
        items = [paths] if isinstance(paths, str | Path) else list(paths)
        outcomes = iter_sources(
            items,
            manifest=Path(manifest) if manifest else None,
            acl_from=acl_from,
            default_tenant=tenant,
            max_bytes=self.settings.max_file_bytes,
        )
        sources = [str(Path(p).resolve()) for p in items]
        return self._gate.run(
            Operation.INGEST,
            None,
            Need.GRANT,
            lambda _: self._run(outcomes, progress, sources, engine,
                                total=lambda: count_inputs(items, manifest=Path(manifest) if manifest else None),
                                overrides=Overrides(allow_move=allow_move, restore_erased=restore_erased)),
            _ingested,
            touched=_written,
        )

    def ingest_records(
        self,
        records: Iterable[Mapping[str, Any]],
        *,
        progress: bool | None = False,
        subject: str | None = None,
        tenant: str | None = None,
        actor: str | None = None,
        caller: Caller | None = None,
        engine: IngestEngineName = "local",
        allow_move: bool = False,
        restore_erased: bool = False,
    ) -> IngestReport:
        """Ingest records given as dicts in the JSONL format of DESIGN §6 (``allow_move`` and
        ``restore_erased`` as for ``ingest``).

        A named caller needs ``ingest`` in its tenant; its records take that tenant when they
        name none, and a record naming another tenant is rejected (nothing written for it).
        """
        who = caller_of(caller, subject, tenant, actor)
        records = list(records)
        sources = [f"doc:{r.get('id')}" for r in records if isinstance(r, Mapping)]

        def run(_: Permission) -> IngestReport:
            outcomes = confined_outcomes(records, tenant=who.tenant if who else None)
            return self._run(outcomes, progress, sources, engine, total=lambda: len(records),
                             overrides=Overrides(allow_move=allow_move, restore_erased=restore_erased))  # fmt: skip

        with held_apart():  # the records given (and all the process held) are not traversed by every collection
            return self._gate.run(Operation.INGEST, who, Need.GRANT, run, _ingested, touched=_written)

    def import_collection(
        self,
        rows: Iterable[Collected] | Iterable[CollectedBatch],
        *,
        tags: AclFromMetadata | AclManifest,
        model: str,
        origin: str,
        tenant: str | None = None,
        classification: str | None = None,
        total: int | None = None,
        progress: bool | None = None,
    ) -> ImportReport:
        """Import a collection another store holds (``ingest.importers``: its rows, each with its
        vector, made by ``model``), as the operator: each row's governance from ``tags`` (its
        metadata's keys, or a manifest), ``tenant`` and ``classification`` for rows whose tags name
        none. Each ``import_batch_rows`` rows (a setting) are one ingest run and one commit
        (``ingest.bulk``: checked as records are, new documents written as Arrow columns); a row
        with no ACL is refused and counted. Running it again after a kill writes only what is missing.
        ``progress`` (by default on a terminal): a bar of rows against ``total``, with the time left."""

        came = Provenance(model=model, origin=origin, tenant=tenant, classification=classification)

        def prepare(chunk: CollectedBatch) -> Checked:
            return checked_rows(chunk, tags, came, warehouse_model=self.embedder.model_id, dimension=self.store.chunks.dimension)

        def ingest(checked: Checked) -> IngestReport:
            def write() -> IngestReport:
                return write_checked(checked, came, doors=self._writes, embedder=self.embedder,
                                     overlap=self.settings.chunk_overlap, batch=self.settings.import_batch_rows,
                                     maintain=self.settings.ingest_maintenance)  # fmt: skip

            sources = [f"doc:{doc_id}" for doc_id in checked.asked]
            return self._gate.run(Operation.INGEST, None, Need.GRANT, lambda _: self._written_by(write, sources), _ingested,
                                  touched=_written)  # fmt: skip

        with held_apart():  # the rows read are not traversed by every collection
            return run_import(prepare, ingest, rows, total=total, progress=progress, chunk_rows=self.settings.import_batch_rows)

    def _run(
        self, outcomes: Iterable[Any], progress: bool | None, sources: list[str], engine: IngestEngineName = "local",
        total: Callable[[], int] | None = None, overrides: Overrides = Overrides(),
    ) -> IngestReport:
        if engine not in INGEST_ENGINES:
            raise InvalidRequestError(f"ingest engine {engine!r} is not one of {', '.join(INGEST_ENGINES)}")

        def ingest() -> IngestReport:
            return run_ingest(
                outcomes,
                doors=self._writes,
                embedder=self.embedder,
                overlap=self.settings.chunk_overlap,
                batch_docs=self.settings.write_batch_docs,
                progress=progress,
                engine=self._ray_engine() if engine == "ray" else None,
                window_docs=self.settings.embed_window_docs,
                total=total,
                overrides=overrides,
                maintain=self.settings.ingest_maintenance,
                brought_batch=self.settings.write_batch_brought,
            )

        return self._written_by(ingest, sources)

    def _written_by(self, ingest: Callable[[], IngestReport], sources: list[str]) -> IngestReport:
        """``ingest()`` run as a tracked ingest of ``sources``: its lineage says what it wrote."""

        def output(report: IngestReport) -> ChunksOutput:
            chunking = Chunking(
                tokenizer=f"{MODEL_NAME} WordPiece",
                window=self.embedder.max_tokens,
                overlap=self.settings.chunk_overlap,
                chunk_count=report.chunks,
            )
            governance = GovernanceSummary.of(report.written_tags, documents=report.documents)
            return self._chunks_output(report.chunks, chunking=chunking, embedding=self._embedding, governance=governance)

        return self._tracked("ingest", sources, ingest, output)

    def _ray_engine(self) -> Any:
        from .ingest.ray_engine import RayEngine, spec_of

        return RayEngine(spec_of(self.settings, self.embedder.cache_dir), actors=self.settings.ray_actors)

    # -- retrieval ----------------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        subject: str | None = None,
        tenant: str | None = None,
        actor: str | None = None,
        caller: Caller | None = None,
        k: int = 10,
        mode: str = "vector",
        min_version: int | None = None,
        purpose: str | None = None,
        vector: Sequence[float] | None = None,
        group_by: str | None = None,
        per_group: int = 1,
        distinct: bool = False,
        filter: Mapping[str, Any] | None = None,  # the name LangChain and Chroma users know
        vector_model: str | None = None,
    ) -> list[Hit]:
        """The best ``k`` chunks the caller may read in its tenant (fewer only if fewer are visible).

        The caller is ``caller`` whole (a verified ``Identity``, say), or ``subject`` in ``tenant``
        with ``actor``, the agent acting for the subject (it gets exactly the subject's visibility).
        ``vector``: the query's embedding, when the caller computed it already; ``vector_model``,
        the model that did (refused unless it is the warehouse's).
        ``min_version``: refuse to answer from a table older than this version (read-your-writes).
        ``group_by="doc"``: at most ``per_group`` chunks of one document; ``distinct``: one chunk of
        each text (byte for byte), so copies of one licence do not fill the answer.
        ``filter``: only chunks it matches, e.g. ``{"year": {"$gte": 2020}}`` (see
        ``retrieval.narrowing``); it narrows what the caller may read, never widens it.
        """
        who = required_caller(caller, subject, tenant, actor, Operation.SEARCH)
        self.store.chunks.require_version(min_version)
        collapse = Collapse(group_by=group_by, per_group=per_group, distinct=distinct)  # type: ignore[arg-type] - checked there
        narrow = narrowing(filter, self.settings.filter_limits)
        if vector is not None and vector_model is not None and vector_model != self.embedder.model_id:
            raise InvalidRequestError(
                f"vector_model {vector_model!r} is not this warehouse's model {self.embedder.model_id!r}: "
                "its vectors do not compare with the warehouse's; embed the query with the warehouse's model"
            )
        how = ", ".join(part for part in (mode, collapse.describe(), "filtered" if narrow else "") if part)

        def describe(found: SearchResult) -> dict[str, Any]:
            hits = found.hits
            return {
                "purpose": purpose,
                "reason": f"{len(hits)} of k={k} ({how})",
                "details": self._filter_details(narrow),
                "query_fingerprint": fingerprint(query),
                "query": query if self.settings.audit_raw_queries else None,
                "chunk_ids": tuple(h.chunk_id for h in hits),
                "doc_ids": tuple(dict.fromkeys(h.doc_id for h in hits)),
                "chunk_labels": {h.chunk_id: h.labels for h in hits},
                "withheld": found.withheld,
                "table_version": found.table_version,
            }

        found = self._gate.run(
            Operation.SEARCH,
            who,
            Need.READ,
            lambda permission: self._searcher.search(
                query, policy=permission.policy, caller=who, k=k, mode=mode, vector=vector, collapse=collapse,
                narrowing=narrow,
            ),
            describe,
        )
        return found.hits

    def _filter_details(self, narrow: Narrowing | None) -> dict[str, Any]:
        """What a search receipt keeps of its filter: a fingerprint, and the filter itself where the
        warehouse keeps raw queries (a filter's values can say as much as the query)."""
        if narrow is None:
            return {}
        kept = {"filter_fingerprint": fingerprint(narrow.describe())}
        return {**kept, "filter": dict(narrow.expression)} if self.settings.audit_raw_queries else kept

    def get_chunk(
        self,
        chunk_id: str,
        *,
        subject: str | None = None,
        tenant: str | None = None,
        actor: str | None = None,
        caller: Caller | None = None,
    ) -> Hit:
        """One chunk or derived row by id, if the caller may read it; ``NotFoundError`` alike whether
        it is missing or forbidden, so the answer reveals nothing of rows the caller cannot see."""
        who = required_caller(caller, subject, tenant, actor, Operation.GET)

        def describe(hit: Hit | None) -> dict[str, Any]:
            if hit is None:
                return {"allowed": False, "reason": "not visible (missing or forbidden)", "chunk_ids": probe_ids(chunk_id),
                        "details": {"asked": str(chunk_id)[:256]}}  # fmt: skip
            return {"reason": "visible", "chunk_ids": (hit.chunk_id,), "doc_ids": (hit.doc_id,),
                    "chunk_labels": {hit.chunk_id: hit.labels}, "table_version": hit.table_version}  # fmt: skip

        hit = self._gate.run(
            Operation.GET,
            who,
            Need.READ,
            lambda permission: self._searcher.get(chunk_id, policy=permission.policy, caller=who),
            describe,
        )
        if hit is None:
            raise NotFoundError(f"chunk {chunk_id!r} not found")
        return hit

    def _reader(self, permission: Permission, who: Caller) -> SubjectView | None:
        """What the policy the gate decided under lets ``who`` read (None: no policy, nothing)."""
        return None if permission.policy is None else self._searcher.view(permission.policy, who)

    # -- lifecycle ----------------------------------------------------------------------------

    def derive(
        self,
        text: str,
        *,
        parents: Sequence[str],
        subject: str | None = None,
        tenant: str | None = None,
        actor: str | None = None,
        caller: Caller | None = None,
        kind: str = "summary",
    ) -> DerivedRow:
        """Save ``text`` (a summary, note or agent memory) derived from chunks the caller may read.

        Needs the policy's ``derive`` grant in the caller's tenant. The new row is visible only to
        whoever could read every parent; a parent the caller cannot read is refused exactly as a
        missing one is (``NotFoundError``).
        """
        who = required_caller(caller, subject, tenant, actor, Operation.DERIVE)
        return self._gate.run(
            Operation.DERIVE,
            who,
            Need.GRANT,
            lambda permission: self._tracked(
                "derive",
                [f"{self.uri}/chunks"],
                lambda: self._lifecycle.derive(text, parents=parents, reader=self._reader(permission, who), kind=kind),
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

    def sync(
        self,
        records: PathLike | Iterable[Mapping[str, Any]],
        *,
        subject: str | None = None,
        tenant: str | None = None,
        actor: str | None = None,
        caller: Caller | None = None,
    ) -> SyncReport:
        """Apply changed ACLs, labels or classifications (JSONL records, or a JSONL file) to the
        documents' chunks and to every row derived from them, without re-embedding.

        A named caller needs ``sync`` in its tenant and may name no other tenant.
        """
        who = caller_of(caller, subject, tenant, actor)
        records = read_sync_file(Path(records)) if isinstance(records, str | Path) else list(records)

        def run(_: Permission) -> SyncReport:
            for number, record in enumerate(records, start=1):
                named = record.get("tenant") if isinstance(record, Mapping) else None
                if who is not None and named != who.tenant:
                    raise PermissionDeniedError(f"sync record {number} names tenant {named!r}; the caller acts in {who.tenant!r}")
            return self._tracked(
                "sync",
                [f"doc:{r.get('id')}" for r in records if isinstance(r, Mapping)],
                lambda: self._lifecycle.sync(records),
                lambda report: self._chunks_output(
                    report.chunks + report.derived,
                    governance=GovernanceSummary.of(report.tags, documents=len(report.documents), derived_rows=report.derived),
                ),
            )

        return self._gate.run(
            Operation.SYNC,
            who,
            Need.GRANT,
            run,
            lambda report: {
                "reason": f"re-tagged {report.chunks} chunks and {report.derived} derived rows",
                "doc_ids": report.documents,
            },
            touched=lambda report: _by_tenant(report.keys),
        )

    def forget(
        self,
        item_id: str,
        *,
        reason: str,
        subject: str | None = None,
        tenant: str | None = None,
        actor: str | None = None,
        caller: Caller | None = None,
    ) -> ForgetReport:
        """Erase a document, or a derived row (a summary, note or agent memory) by its own id, with
        everything derived from it, and purge it from old versions; the receipt is its tombstone.

        A named caller needs ``forget`` in its tenant; another tenant's item reads as missing.
        The operator names ``tenant`` when a document id is used in more than one.
        """
        who = caller_of(caller, subject, tenant, actor)
        # The reason goes into the receipt: refuse one it cannot hold before erasing anything.
        if not isinstance(reason, str) or not reason.strip() or "\x00" in reason:
            raise InvalidRequestError(
                "a reason is required to forget a document (it goes into the audit receipt): text without NUL characters"
            )

        def run(_: Permission) -> ForgetReport:
            erase = self._lifecycle.erasure(item_id, who.tenant if who else tenant, reason)
            return self._tracked("forget", [f"doc:{item_id}"], erase, lambda _: self._chunks_output(0))

        return self._gate.run(
            Operation.FORGET,
            who,
            Need.GRANT,
            run,
            lambda report: {
                "reason": reason,
                "doc_ids": (report.item_id,),
                "details": {"chunks": report.chunks, "derived": report.derived, "tombstone": report.tombstone()},
            },
            touched=lambda report: {report.tenant: [report.item_id]},
        )

    # -- questions ----------------------------------------------------------------------------

    def explain(
        self,
        chunk_id: str,
        *,
        subject: str,
        tenant: str | None = None,
        caller: str | Caller | None = None,
        actor: str | None = None,
    ) -> Explanation:
        """Why ``subject`` may or may not read ``chunk_id`` in the caller's tenant, step by step.

        ``caller`` asks (by default ``subject`` itself). Anyone may ask about themselves; asking
        about someone else needs ``audit``. Without ``audit``, a row the subject cannot read is
        only "not visible": nothing of it leaks.
        """
        who = asker(caller, subject, tenant, actor)
        if not isinstance(chunk_id, str) or "\x00" in chunk_id:
            raise InvalidRequestError("a chunk id is text without NUL characters")
        where = who.tenant

        def decide(permission: Permission) -> Explanation:
            policy = permission.policy
            if policy is None:
                return not_visible(chunk_id, subject, where)
            if permission.auditor:  # an auditor may see any row of its tenant, and why it is refused
                row = self.store.chunks.rows([chunk_id]).get(chunk_id)
            else:  # asking about itself: the row is looked for among those it may read, and only there
                found = self._searcher.visible_row(chunk_id, self._searcher.view(policy, who), self.store.registries.current(),
                                                   RESULT_COLUMNS)  # fmt: skip
                row = found[0] if found is not None else None
            if row is None or row["tenant"] != where:  # another tenant's row reads as a missing one
                return not_visible(chunk_id, subject, where)
            explanation = explain_row(policy, subject, where, row, self.store.registries.clauses())
            return explanation if explanation.allowed or permission.auditor else not_visible(chunk_id, subject, where)

        return self._gate.run(
            Operation.EXPLAIN,
            who,
            Need.SELF_OR_AUDIT,
            decide,
            lambda result: {
                "reason": f"asked about {subject}: {'visible' if result.allowed else 'not visible'}",
                "chunk_ids": probe_ids(chunk_id),
                "details": {"about": subject, "visible": result.allowed},
            },
            about=subject,
        )

    def access_review(
        self, *, subject: str, tenant: str | None = None, caller: str | Caller | None = None
    ) -> AccessReview:
        """What ``subject`` can read in the caller's tenant, by source, label and classification;
        ``caller`` (by default ``subject``) needs ``audit`` to ask about someone else."""
        who = asker(caller, subject, tenant, None)
        about = Caller(subject=subject, tenant=who.tenant)

        def review(permission: Permission) -> AccessReview:
            assert permission.policy is not None  # the gate refuses a review without a policy
            return access_review(self._reads, self._searcher, self._searcher.view(permission.policy, about))

        return self._gate.run(
            Operation.AUDIT,
            who,
            Need.SELF_OR_AUDIT,
            review,
            lambda found: {"reason": f"access review of {subject}: {found.rows} readable rows"},
            about=subject,
        )

    def inventory(self, *, label: str, tenant: str | None = None, caller: str | Caller) -> dict[str, list[str]]:
        """Every row carrying ``label`` in the caller's tenant, grouped by source; needs ``audit``."""
        who = asker(caller, None, tenant, None)
        return self._gate.run(
            Operation.AUDIT,
            who,
            Need.AUDIT,
            lambda _: inventory(self._reads, label, who.tenant),
            lambda found: {"reason": f"inventory of label {label!r}: {len(found)} sources", "doc_ids": tuple(found)},
        )

    def readers(
        self, *, caller: str | Caller, doc_id: str | None = None, label: str | None = None, tenant: str | None = None
    ) -> Readers:
        """Who can read document ``doc_id`` (and what derives from it) or the rows carrying
        ``label``, in the caller's tenant, and through which path (``retrieval.review.readers``);
        needs ``audit``."""
        who = asker(caller, None, tenant, None)

        def review(permission: Permission) -> Readers:
            policy = self.policy  # in force, as the gate read it, without the asker's own token claims
            assert policy is not None  # the gate refuses a review without a policy
            return readers(self._reads, policy, who.tenant, doc_id=doc_id, label=label)

        return self._gate.run(
            Operation.AUDIT,
            who,
            Need.AUDIT,
            review,
            lambda found: {"reason": f"who can read {found.item}: {len(found.subjects)} subjects, {len(found.groups)} groups",
                           "doc_ids": probe_ids(doc_id) if doc_id else ()},
        )  # fmt: skip

    def trends(self, *, caller: str | Caller, days: int = 30, tenant: str | None = None) -> Trends:
        """The caller's tenant's last ``days`` days from its receipts: searches and refusals a day,
        labels returned, documents returned most (``governance.trends``); needs ``audit``."""
        if not isinstance(days, int) or isinstance(days, bool) or not 1 <= days <= MAX_TREND_DAYS:
            raise InvalidRequestError(f"days must be 1 to {MAX_TREND_DAYS}, got {days!r}")
        who = asker(caller, None, tenant, None)
        return self._gate.run(
            Operation.AUDIT,
            who,
            Need.AUDIT,
            lambda _: trends(self.audit.query(tenant=who.tenant, since=trend_start(days)), tenant=who.tenant, days=days),
            lambda found: {"reason": f"trends of {days} days: {sum(found.searches)} searches, {sum(found.refusals)} refusals"},
        )

    def vocabulary(self, *, caller: str | Caller, tenant: str | None = None) -> Vocabulary:
        """The labels, subjects and documents of the caller's tenant, for filtering its receipts
        (``retrieval.review.vocabulary``); needs ``audit``."""
        who = asker(caller, None, tenant, None)
        return self._gate.run(
            Operation.AUDIT,
            who,
            Need.AUDIT,
            lambda permission: vocabulary(self._reads, permission.policy, who.tenant),
            lambda found: {"reason": f"vocabulary: {len(found.labels)} labels, {len(found.subjects)} subjects, "
                                     f"{len(found.documents)} documents"},
        )  # fmt: skip

    def lineage(self, item_id: str, *, caller: str | Caller | None = None, tenant: str | None = None) -> dict[str, Any]:
        """A source or row's lineage: source -> chunks -> derived rows -> the receipts that returned them.

        A named ``caller`` needs ``audit`` in its tenant, and another tenant's item reads as
        missing; the operator (no caller) sees any tenant's, or ``tenant``'s.
        """
        who = None if caller is None else asker(caller, None, tenant, None)
        found, _ = self._gate.run(
            Operation.AUDIT,
            who,
            Need.AUDIT,
            lambda _: lineage_of(item_id, who.tenant if who is not None else tenant, chunks=self.store.chunks,
                                 sources=self.store.sources, audit=self.audit),
            lambda found: {"reason": f"lineage of {item_id!r}", "doc_ids": probe_ids(item_id)},
            touched=lambda found: {found[1]: probe_ids(item_id)},
        )
        return found

    def receipts(self, *, caller: str | Caller | None, tenant: str | None = None, **filters: Any) -> list[StoredReceipt]:
        """Audit receipts of the caller's tenant matching ``filters`` (see ``AuditLog.query``); needs
        ``audit``. The operator (``caller=None``) reads any tenant's, or ``tenant``'s."""
        return self.receipt_page(caller=caller, tenant=tenant, **filters)[1]

    def receipt_page(
        self, *, caller: str | Caller | None, tenant: str | None = None, **filters: Any
    ) -> tuple[int, list[StoredReceipt]]:
        """How many receipts of the caller's tenant match ``filters``, and the page ``offset`` and
        ``limit`` pick of them, newest first (see ``AuditLog.page``); needs ``audit``. The operator
        (``caller=None``) reads any tenant's, or ``tenant``'s: receipted in each tenant it read."""
        who = None if caller is None else asker(caller, None, tenant, None)
        scope = who.tenant if who is not None else tenant
        return self._gate.run(
            Operation.AUDIT,
            who,
            Need.AUDIT,
            lambda _: self.audit.page(**{**filters, "tenant": scope}),
            lambda found: {"reason": f"audit query: {len(found[1])} of {found[0]} receipts" if scope is not None
                           else "audit query of every tenant"},
            touched=lambda _: {scope: ()} if scope is not None else self._every_tenant(),
            neutral=True,
        )

    def verify_audit(
        self, *, caller: str | Caller | None, tenant: str | None = None, expect_head: str | tuple[int, str] | None = None
    ) -> ChainReport:
        """Verify every receipt chain on behalf of ``caller``, against the checkpoint ``expect_head``
        when given (see ``AuditLog.verify``); needs ``audit`` in its tenant. The operator
        (``caller=None``) is receipted in every tenant."""
        who = None if caller is None else asker(caller, None, tenant, None)
        return self._gate.run(
            Operation.AUDIT,
            who,
            Need.AUDIT,
            lambda _: self.audit.verify(expect_head=expect_head),
            lambda report: {"reason": f"audit verify: {'intact' if report.ok else 'broken'}"
                                      + (f" ({report.receipts} receipts)" if who is not None else "")},
            touched=lambda _: self._every_tenant(),
            neutral=True,
        )

    def archive_audit(self, *, before: datetime, folder: PathLike) -> ArchiveReport:
        """Seal the receipts written before ``before`` and move them into ``folder`` (an empty or
        new local folder: ``receipts.parquet`` and ``seal.json``), as the operator, receipted in
        every tenant (``AuditLog.archive``). Record the seal's root outside the warehouse."""
        target = Path(folder)
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise InvalidRequestError(f"archive folder {str(target)!r} must be new or empty")

        def write(name: str, data: bytes) -> None:
            target.mkdir(parents=True, exist_ok=True)
            (target / name).write_bytes(data)

        return self._gate.run(
            Operation.ADMIN, None, Need.GRANT, lambda _: self.audit.archive(before, write),
            lambda done: {"reason": f"archived {done.receipts} audit receipts of {done.chains} chains written before "
                                    f"{before.isoformat()} under seal {done.seal.root}"},
            touched=lambda _: self._every_tenant(),
            neutral=True,
        )  # fmt: skip

    def verify_audit_archive(self, folder: PathLike) -> ChainReport:
        """Whether the archive in ``folder`` is whole and sealed by this log (``AuditLog.verify_archive``);
        as the operator, receipted in every tenant."""
        source = Path(folder)
        if not (source / "seal.json").is_file():
            raise NotFoundError(f"{str(source)!r} holds no audit archive (no seal.json)")
        return self._gate.run(
            Operation.AUDIT, None, Need.AUDIT, lambda _: self.audit.verify_archive(lambda name: (source / name).read_bytes()),
            lambda report: {"reason": f"audit archive verify: {'intact' if report.ok else 'broken'} ({report.receipts} receipts)"},
            touched=lambda _: self._every_tenant(),
            neutral=True,
        )  # fmt: skip


def open(  # noqa: A001 - the public name is fixed by the API
    uri: str | None = None, policy: PathLike | None = None, *, settings: Settings | None = None, create: bool = True
) -> Warehouse:
    """Open the warehouse at ``uri`` (default: settings / ``RAGWARDEN_WAREHOUSE``), creating it if
    needed unless ``create`` is False (then a missing one is refused, naming the path)."""
    changes: dict[str, object] = {}
    if uri:
        changes["warehouse"] = str(uri)
    if policy:
        changes["policy"] = str(policy)
    return Warehouse((settings or Settings.from_env()).with_(**changes), create=create)


def _by_tenant(keys: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Document ids grouped by tenant."""
    grouped: dict[str, list[str]] = {}
    for tenant, doc_id in keys:
        grouped.setdefault(tenant, []).append(doc_id)
    return grouped


def _written(report: IngestReport) -> dict[str, list[str]]:
    return _by_tenant(report.written_documents)


def _ingested(report: IngestReport) -> dict[str, Any]:
    details: dict[str, Any] = {"run_id": report.run_id, "rejected": len(report.rejected), "chunks": report.chunks}
    if report.overrides:  # what the operator allowed, and the erasures it undid, stay on the record
        details |= {"overrides": list(report.overrides), "restored": [list(key) for key in report.restored]}
    return {"reason": report.summary(), "doc_ids": report.written, "details": details}
