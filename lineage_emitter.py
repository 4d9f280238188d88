"""OpenLineage run events for ragwarden's jobs, delivered through a durable spool.

Each run of ``ingest``, ``derive``, ``sync`` or ``forget`` (job namespace ``ragwarden``, job
name ``ragwarden.<job>``) emits START, then COMPLETE or FAIL. Inputs are the sources' datasets,
named by the OpenLineage conventions (see :mod:`ragwarden.governance.lineage.events`); more than
:data:`MAX_LISTED_INPUTS` distinct sources are listed as one input, the warehouse's ``sources``
table, with the real count in the ``ragwarden_sources`` facet. The output is the warehouse's
``chunks`` table; on COMPLETE at its new version, with its schema, the column lineage
``vector <- text <- source text``, and ragwarden's chunking, embedding and governance facets
(schemas in ``governance/lineage/facet_schemas/``). FAIL carries the standard ``errorMessage`` facet.

Delivery: an event is first written to the spool (``state.lineage_spool``: the warehouse's
``_lineage/spool`` folder, or its ``lineage_spool`` table on object storage) and only then sent; it
is removed once the transport has taken it, and kept (with a logged warning) otherwise. Each new
run starts by sending what is spooled, oldest first (the run's own START goes after them), so
events left by a backend that was down go out on the next run, or on :meth:`LineageEmitter.flush`.
A flush stops at the first failure, keeping the order, and a run whose START found the backend
down spools its later events without trying again: a down backend costs a run one attempt
(about a second with the bounded HTTP transport, :mod:`~ragwarden.lineage_transport`).
Nothing here raises to the caller once the emitter is built; failures are logged.

Delivery is once per event: runId and eventTime are fixed when the event is made and a re-send
is the spooled bytes, so a receiver sees the same event. The one duplicate left is a crash
between a transport's success and the file's deletion; receivers can de-duplicate by
(runId, eventType). A transport that acknowledges on hand-off (``async_http``, Kafka) ends the
spool's guarantee at the hand-off; a composite transport succeeds when any member does.

The events go where the environment's OpenLineage configuration sends them, else to one JSON
file per event in ``<lineage_dir>/events/`` (one file each, so concurrent writers never
interleave). The client's filters and tags apply; its environment-variable and source-code
facets are not added (they would describe the calling process, not the job).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from openlineage.client import event_v2
from openlineage.client.serde import Serde
from openlineage.client.transport import Transport
from openlineage.client.uuid import generate_new_uuid

from .errors import ConfigurationError, InvalidValueError, WarehouseError
from .governance.lineage import ChunksOutput, LineageRun
from .governance.lineage.events import JOBS, Job, event_from_json, run_event
from .lineage_transport import lineage_disabled, make_client
from .state import FolderSpool, LineageSpool

__all__ = ["FlushReport", "LineageEmitter", "RunScope"]

log = logging.getLogger(__name__)
_REFUSED_FOR_CONTENT = frozenset({400, 413, 415, 422})


@dataclass(frozen=True)
class FlushReport:
    """One flush: events sent, failed (0 or 1: a flush stops there), set aside, still spooled."""

    sent: int = 0
    failed: int = 0
    rejected: int = 0
    pending: int = 0


class RunScope:
    """The run inside ``with emitter.run(...)``; set :attr:`output` before the block ends."""

    def __init__(self, run: LineageRun) -> None:
        self.run = run
        self.output: ChunksOutput | None = None


class LineageEmitter:
    """Emits and delivers the lineage of one warehouse's runs.

    ``warehouse_uri`` names the datasets (``<uri>/chunks``, ``<uri>/sources``); ``lineage_dir``
    (the warehouse's ``_lineage`` folder) holds the spool and the default event files, unless
    ``spool`` (where events wait) and ``events`` (the default transport: where events go when the
    environment names no backend) are given; ``env`` is the environment to configure OpenLineage
    from (pass ``os.environ``). A configuration that cannot be used raises ``ConfigurationError``
    here, at construction.
    """

    def __init__(
        self, warehouse_uri: str, lineage_dir: Path | None, env: Mapping[str, str], *,
        spool: LineageSpool | None = None, events: Transport | None = None,
    ) -> None:  # fmt: skip
        if spool is None or (events is None and lineage_dir is None):
            if lineage_dir is None:
                raise ConfigurationError("a lineage emitter needs a lineage_dir, or both a spool and an events transport")
        self.warehouse_uri = warehouse_uri
        self.enabled = not lineage_disabled(env)
        self.spool: LineageSpool = spool if spool is not None else FolderSpool(lineage_dir / "spool")  # type: ignore[operator]
        default = events if events is not None else lineage_dir / "events"  # type: ignore[operator]
        self._client = make_client(env, default) if self.enabled else None
        self._lock = threading.RLock()
        self._backend_down = False

    @property
    def transport(self) -> Transport | None:
        """The transport events go through (None when lineage is disabled)."""
        return self._client.transport if self._client is not None else None

    def start(self, job: Job, sources: Iterable[str]) -> LineageRun:
        """Begin a run reading ``sources`` (URIs, absolute paths or ``doc:<id>``): send what is
        spooled, then START."""
        if job not in JOBS:
            raise InvalidValueError(f"unknown lineage job {job!r}; use one of {', '.join(JOBS)}")
        run = LineageRun(str(generate_new_uuid()), job, self.warehouse_uri, tuple(sources))
        with self._lock:
            self._backend_down = False  # a new run tries the backend again
            self._emit(run, event_v2.RunState.START)
        return run

    def complete(self, run: LineageRun, output: ChunksOutput | None = None) -> None:
        """End ``run`` successfully, having left the ``chunks`` table as ``output`` says."""
        self._emit(run, event_v2.RunState.COMPLETE, output=output)

    def fail(self, run: LineageRun, error: BaseException) -> None:
        """End ``run`` as failed by ``error`` (its message and stack trace go in the event)."""
        self._emit(run, event_v2.RunState.FAIL, error=error)

    @contextmanager
    def run(self, job: Job, sources: Iterable[str]) -> Iterator[RunScope]:
        """START on entry; COMPLETE with ``scope.output`` on exit, or FAIL (re-raising) on an error."""
        scope = RunScope(self.start(job, sources))
        try:
            yield scope
        except BaseException as error:
            self.fail(scope.run, error)
            raise
        self.complete(scope.run, scope.output)

    def flush(self) -> FlushReport:
        """Send the spooled events, oldest first, stopping at the first that cannot be sent."""
        if self._client is None:
            return FlushReport()
        with self._lock, self.spool.exclusive() as ours:
            if not ours:  # another process is flushing this spool
                return FlushReport(pending=len(self.spool.pending()))
            sent = rejected = failed = 0
            for name in self.spool.pending():
                try:
                    event = event_from_json(self.spool.read(name))
                except Exception as exc:  # noqa: BLE001 - whatever is unreadable is set aside
                    self.spool.reject(name, f"unreadable: {exc}")
                    rejected += 1
                    continue
                try:
                    self._client.transport.emit(event)
                except Exception as exc:  # noqa: BLE001 - any transport failure keeps the event
                    if _status(exc) in _REFUSED_FOR_CONTENT:
                        self.spool.reject(name, f"refused by the lineage backend: {exc}")
                        rejected += 1
                        continue
                    failed = 1
                    log.warning(
                        "lineage backend unavailable (%s); %d event(s) kept in %s for the next run",
                        exc,
                        len(self.spool.pending()),
                        self.spool.where,
                    )
                    break
                self.spool.remove(name)
                sent += 1
            self._backend_down = failed > 0
            return FlushReport(sent, failed, rejected, len(self.spool.pending()))

    def close(self) -> None:
        """Release the transport (an HTTP session, for one); spooled events stay for later."""
        if self._client is not None:
            try:
                self._client.close(timeout=1.0)
            except Exception as exc:  # noqa: BLE001 - closing must not raise either
                log.warning("closing the lineage transport failed: %s", exc)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _emit(self, run: LineageRun, state: event_v2.RunState, **details: Any) -> None:
        if self._client is None:
            return
        with self._lock:
            try:
                event = self._prepared(run_event(run, state, **details))
                if event is None:
                    return
                try:
                    self.spool.put(Serde.to_dict(event))
                except (OSError, WarehouseError) as exc:
                    log.warning("cannot spool lineage events in %s (%s); sending unspooled", self.spool.where, exc)
                    self._client.transport.emit(event)
                    return
                if not self._backend_down:
                    self.flush()
            except Exception:  # lineage must never break the run it describes
                log.warning("lineage %s event for run %s not delivered", state.value, run.run_id, exc_info=True)

    def _prepared(self, event: event_v2.RunEvent) -> event_v2.RunEvent | None:
        """``event`` after the client's configured tags and filters (None: filtered out)."""
        assert self._client is not None
        tagged = self._client.update_event_tags_facets(event)
        kept = self._client.filter_event(tagged)
        return kept if isinstance(kept, event_v2.RunEvent) else None


def _status(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)
