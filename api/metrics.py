"""The service's Prometheus metrics at ``/metrics``: what an operator watches a replica by.

Two kinds. What requests did, counted as they are answered: ``ragwarden_http_requests_total`` by
route template, method and status, and ``ragwarden_http_request_stage_seconds``, the stage times
the service already measures for the access log (``stages``: in line, at work, embed, rank,
check, receipt), by stage. And what waits, read from the service and the warehouse at each
scrape: the admission queue (requests at work and in line, refusals), this process's audit
receipts not yet folded into their table, the serving index's state and how far it lags the table,
and lineage events spooled for their backend. The operator's guide lists each
(``docs/operations.md``, "Metrics").

Nothing of a caller: a label is a route template (never the path a caller sent: ids never become
labels), a method from a fixed list, a status, a stage or the serving index's state; no subject,
query, document or row, and no count of rows one caller may read.

Who may read them (``Settings.metrics``, ``RAGWARDEN_METRICS``): ``loopback`` by default, so a
scraper on the replica's host (or its pod) reads them and nothing further off does; ``open`` for
a network where only the scraper reaches the port; ``off`` keeps no metrics and serves no route.
No credential is asked: scrapers rarely hold one, and a tenant's grant (the policy's unit) says
nothing about a process serving every tenant. Behind a proxy on the same host the client is the
proxy, so the proxy must pass ``X-Forwarded-For`` (uvicorn takes it from 127.0.0.1) or keep
``/metrics`` to itself. ``/metrics`` is never queued by admission: a scrape must answer most when
the replica is overloaded.

Each app keeps its own registry, so several apps in one process never share a series; with
``serve --workers N`` each worker counts its own requests (the workers share one port, so a scrape
reads whichever worker takes it). Stage times are those admission measures (``Server-Timing``'s,
which answers carry only where the operator asked: a caller could read its request's work in it);
admission hands them to ``ServiceMetrics.timed``.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import get_args

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.datastructures import Address
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import Settings
from ..errors import PermissionDeniedError, RagwardenError
from ..retrieval.serving import State
from ..warehouse import Warehouse
from .admission import Admission
from .limits import CLIENT_CLOSED_STATUS, CLIENT_GONE

METRICS_PATH = "/metrics"
UNMATCHED = "unmatched"
"""The route label of a request no route matched (its path is never a label)."""
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER_METHOD = "other"
STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds: from a receipt's fraction of a millisecond to a search stopped at its deadline (10 s)."""
SERVING_STATES: tuple[State, ...] = get_args(State)
log = logging.getLogger(__name__)


def service_metrics(warehouse: Warehouse, settings: Settings) -> ServiceMetrics | None:
    """The metrics an app keeps (None when ``settings.metrics`` is ``off``): hand their ``timed``
    to admission, then ``install_metrics``."""
    return None if settings.metrics == "off" else ServiceMetrics(warehouse)


def install_metrics(app: FastAPI, metrics: ServiceMetrics | None, settings: Settings) -> None:
    """Count ``app``'s answers into ``metrics`` and serve them at ``/metrics`` as ``settings.metrics``
    allows (nothing for None). Call after admission's middleware is added: this one goes around it,
    so admission's refusals are counted too."""
    if metrics is None:
        return
    app.add_middleware(MetricsMiddleware, metrics=metrics, routes=app.router.routes)
    access = settings.metrics

    @app.get(METRICS_PATH, include_in_schema=False)
    def scrape(request: Request) -> Response:
        """The metrics in Prometheus's text format, to the clients ``RAGWARDEN_METRICS`` allows."""
        if access == "loopback" and not from_loopback(request.client):
            raise PermissionDeniedError(
                "/metrics is served to this host alone (RAGWARDEN_METRICS=loopback): scrape from the replica's "
                "host, or set RAGWARDEN_METRICS=open where only the scraper reaches this port"
            )
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


def from_loopback(client: Address | None) -> bool:
    """Whether a request's client is on this host (a loopback address, IPv4 within IPv6 too)."""
    if client is None:
        return False
    try:
        address = ipaddress.ip_address(client.host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


class ServiceMetrics:
    """One app's registry: the request counter and stage histogram, fed by ``MetricsMiddleware``,
    and the readings taken at each scrape (``Readings``)."""

    def __init__(self, warehouse: Warehouse) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "ragwarden_http_requests", "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"], registry=self.registry,
        )  # fmt: skip
        self.stages = Histogram(
            "ragwarden_http_request_stage_seconds",
            "Seconds a request spent in each stage: queue (in line), app (at work), and within it embed, rank, "
            "check and receipt.",
            ["stage"], buckets=STAGE_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.readings = Readings(warehouse)
        self.registry.register(self.readings)

    def answered(self, route: str, method: str, status: int) -> None:
        self.requests.labels(route=route, method=method, status=str(status)).inc()

    def timed(self, stages: Mapping[str, float]) -> None:
        """Observe one request's stage times (milliseconds by stage, as admission measures them)."""
        for name, ms in stages.items():
            self.stages.labels(stage=name).observe(ms / 1000)


class MetricsMiddleware:
    """ASGI middleware around admission: counts each answer by route template, method and status,
    before the answer's last byte leaves, so a client that has its answer finds it counted."""

    def __init__(self, app: ASGIApp, *, metrics: ServiceMetrics, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes
        metrics.readings.admission = _admission_within(app)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        asked = {key: scope[key] for key in ("type", "path", "root_path", "method") if key in scope}  # as it came
        method = scope["method"] if scope.get("method") in METHODS else OTHER_METHOD
        status: int | None = None
        counted = False

        async def observed(message: Message) -> None:
            nonlocal status, counted
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body", False) and not counted:
                counted = True
                self.metrics.answered(self._route(scope, asked), method, _status(scope, status))
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            if not counted:  # no whole answer: the client went, or the app failed (answered 500 outside)
                self.metrics.answered(self._route(scope, asked), method, _status(scope, status))

    def _route(self, scope: Scope, asked: Scope) -> str:
        """The request's route template: the route the router chose, when it is one of the app's
        own (most requests: no second match); else matched again from the scope ``asked`` as it came
        (a mount's inner router chose an inner route; admission refused it before any routing)."""
        chosen = scope.get("route")
        if chosen is not None and any(route is chosen for route in self.routes):
            return _template(chosen)
        return route_of(self.routes, asked)


def _status(scope: Scope, started: int | None) -> int:
    """The status a request is counted under, as the access log records it: 499 when its client
    went, else the answer's, else 500 (no answer started: the app failed)."""
    if scope.get("state", {}).get(CLIENT_GONE):
        return CLIENT_CLOSED_STATUS
    return started if started is not None else 500


def route_of(routes: Iterable[BaseRoute], scope: Scope) -> str:
    """The template of the route ``scope`` goes to (``/v1/chunks/{chunk_id}``; a mount's
    ``/console/{path}``), the first partial match's (a method it does not allow), else
    ``UNMATCHED``. Never the path itself."""
    partial: BaseRoute | None = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return _template(route)
        if match is Match.PARTIAL and partial is None:
            partial = route
    return _template(partial) if partial is not None else UNMATCHED


def _template(route: BaseRoute) -> str:
    return str(getattr(route, "path_format", None) or UNMATCHED)


def _admission_within(app: ASGIApp) -> Admission | None:
    """The admission middleware among the apps ``app`` wraps, if any."""
    inner: object = app
    while inner is not None:
        if isinstance(inner, Admission):
            return inner
        inner = getattr(inner, "app", None)
    return None


class Readings:
    """What waits, read at each scrape: admission's line, the warehouse's unfolded receipts and
    spooled lineage events, the serving index. A reading the warehouse cannot answer (storage
    unreachable) is left out of that scrape and logged, so the rest still answers."""

    def __init__(self, warehouse: Warehouse) -> None:
        self._warehouse = warehouse
        self.admission: Admission | None = None  # set once the app's middleware is built
        self._lock = threading.Lock()
        self._behind: tuple[int, float] | None = None  # (index version, when first seen behind the table)

    def collect(self) -> Iterator[Metric]:
        yield from self._admission()
        for what, read in (("receipts pending", self._receipts), ("serving index", self._serving),
                           ("lineage spool", self._lineage)):  # fmt: skip
            try:
                yield from list(read())
            except (RagwardenError, OSError) as exc:
                log.warning("metrics: the %s could not be read for this scrape: %s", what, exc)

    def _admission(self) -> Iterator[Metric]:
        admission = self.admission
        if admission is None:
            return
        # Read from a scrape's thread while the event loop changes them: whole ints, at most a moment old.
        yield _gauge("ragwarden_admission_running", "Requests at work now.", admission.slots.busy)
        yield _gauge("ragwarden_admission_waiting", "Requests waiting in line for a place at work.", admission.slots.waiting)
        yield _gauge("ragwarden_admission_max_running", "Places at work (max_in_flight).", admission.max_in_flight)
        yield _gauge("ragwarden_admission_max_waiting", "Places in line (max_queued).", admission.max_queued)
        yield CounterMetricFamily("ragwarden_admission_refused", "Requests refused 503 overloaded: the line was full.",
                                  value=admission.refused)  # fmt: skip

    def _receipts(self) -> Iterator[Metric]:
        receipts, oldest = self._warehouse.receipts_pending()
        yield _gauge("ragwarden_audit_receipts_pending", "This process's audit receipts waiting in the journal to be "
                     "folded into the audit table.", receipts)  # fmt: skip
        yield _gauge("ragwarden_audit_oldest_pending_seconds", "Seconds the oldest of them has waited.", oldest)

    def _serving(self) -> Iterator[Metric]:
        status = self._warehouse.serving_status()
        state = GaugeMetricFamily("ragwarden_serving_index_state", "The resident serving index's state (1: the one "
                                  "it is in).", labels=["state"])  # fmt: skip
        for name in SERVING_STATES:
            state.add_metric([name], 1.0 if status.state == name else 0.0)
        yield state
        if status.state != "ready" or status.version is None:
            self._note_behind(None)
            return
        behind = max(0, self._warehouse.table_version - status.version)
        yield _gauge("ragwarden_serving_index_rows", "Rows the serving index holds.", status.rows)
        yield _gauge("ragwarden_serving_index_bytes", "Bytes of memory the serving index takes.", status.bytes)
        yield _gauge("ragwarden_serving_index_lag_versions", "Table versions committed since the index's.", behind)
        yield _gauge("ragwarden_serving_index_stale_seconds", "Seconds since a scrape first saw the table ahead of "
                     "the index (0: the index is at the table's version).",
                     self._note_behind(status.version if behind else None))  # fmt: skip

    def _note_behind(self, version: int | None) -> float:
        """Seconds the index at ``version`` has been seen behind the table (None: it is not)."""
        now = time.monotonic()
        with self._lock:
            if version is None:
                self._behind = None
                return 0.0
            if self._behind is None or self._behind[0] != version:
                self._behind = (version, now)
            return now - self._behind[1]

    def _lineage(self) -> Iterator[Metric]:
        yield _gauge("ragwarden_lineage_events_spooled", "Lineage events waiting in the spool for their backend.",
                     self._warehouse.lineage_spooled())  # fmt: skip


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
