"""Prometheus metrics for runrow: ``pip install "runrow[metrics]"``.

Two parts, both optional:

* :class:`PrometheusObserver` counts what dispatchers do (pass it as
  ``Dispatcher(observers=[...])``): runs claimed, started and finished by status, claim
  latency, queue wait, time to first event, run duration, heartbeat lag, reaped runs,
  lost-claim stand-downs, journal rows and flushes.
* :class:`QueueCollector` reports what the database holds: queue depth, running runs
  and the oldest queued run's age per tenant, and the reconnects of the process's
  :class:`~runrow.NotifyHub`\\ s. A Prometheus collector is synchronous and a scrape
  must never wait on the database, so the collector serves a cache that a background
  task refreshes every ``interval`` seconds with one bounded read.

:func:`with_metrics` mounts ``/metrics`` on any ASGI app.

Metric names start with ``runrow_``; none carries a run id, a conversation id or any
content as a label.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

import anyio
import psycopg
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ._db import Database, atomic
from ._errors import ConfigurationError
from ._gateway import metrics as _gw
from ._gateway import workers as _workers
from ._gateway._exec import run
from ._names import DEFAULT_SCHEMA, check_schema
from ._observe import Observer
from ._status import QUEUED, WAITING

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
    from types import TracebackType

    from anyio.abc import TaskGroup, TaskStatus
    from prometheus_client.metrics_core import Metric

    from ._engine.view import RunView
    from ._hub import NotifyHub

__all__ = ["PrometheusObserver", "QueueCollector", "with_metrics"]

log = logging.getLogger("runrow.metrics")

# Seconds. Claims and flushes are milliseconds; runs are seconds to minutes.
FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SLOW_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class PrometheusObserver(Observer):
    """A dispatcher observer that keeps Prometheus counters and histograms.

    ``registry`` defaults to prometheus-client's global registry. Metric names are
    registered once per registry: create one observer per process (per registry) and
    pass it to every dispatcher of that process.

    ======================================  =========  =====================================
    metric                                  type       meaning
    ======================================  =========  =====================================
    ``runrow_claims_total``                 counter    claim statements that took runs
    ``runrow_claim_seconds``                histogram  latency of those claim statements
    ``runrow_runs_claimed_total``           counter    runs claimed
    ``runrow_runs_started_total``           counter    agent calls started
    ``runrow_queue_wait_seconds``           histogram  enqueue to claim
    ``runrow_first_event_seconds``          histogram  agent start to first journal flush
    ``runrow_runs_finished_total``          counter    endings, by ``status`` and ``recorded``
    ``runrow_run_duration_seconds``         histogram  agent start to ending, by ``status``
    ``runrow_claims_lost_total``            counter    stand-downs: the run was no longer ours
    ``runrow_heartbeat_lag_seconds``        histogram  how late each heartbeat ran
    ``runrow_runs_reaped_total``            counter    runs this process's reaper ended
    ``runrow_journal_rows_total``           counter    journal rows written by workers
    ``runrow_journal_flushes_total``        counter    journal flushes
    ======================================  =========  =====================================

    ``recorded="false"`` on a finished run means its ending could not be written (the
    claim was lost meanwhile or the database was unreachable); such a run is ended by a
    stop or the reaper instead.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = REGISTRY if registry is None else registry
        self.registry = reg
        self.claims = Counter("runrow_claims", "Claim statements that took at least one run", registry=reg)
        self.claim_seconds = Histogram(
            "runrow_claim_seconds",
            "Latency of claim statements that took runs",
            buckets=FAST_BUCKETS,
            registry=reg,
        )
        self.runs_claimed = Counter("runrow_runs_claimed", "Runs claimed by this process", registry=reg)
        self.runs_started = Counter("runrow_runs_started", "Agent calls started", registry=reg)
        self.retries_started = Counter(
            "runrow_retries_started",
            "Agent calls started for a retry (attempt 2 or later), by attempt",
            ["attempt"],
            registry=reg,
        )
        self.queue_wait_seconds = Histogram(
            "runrow_queue_wait_seconds", "Time from enqueue to claim", buckets=SLOW_BUCKETS, registry=reg
        )
        self.first_event_seconds = Histogram(
            "runrow_first_event_seconds",
            "Time from the agent's start to its first journal flush",
            buckets=FAST_BUCKETS,
            registry=reg,
        )
        self.runs_finished = Counter(
            "runrow_runs_finished",
            "Runs that ended in this process, by status; recorded=false: the ending could not be written",
            ["status", "recorded"],
            registry=reg,
        )
        self.run_duration_seconds = Histogram(
            "runrow_run_duration_seconds",
            "Time from the agent's start to the run's ending",
            ["status"],
            buckets=SLOW_BUCKETS,
            registry=reg,
        )
        self.claims_lost = Counter(
            "runrow_claims_lost", "Runs this process stood down from: the claim was lost", registry=reg
        )
        self.heartbeat_lag_seconds = Histogram(
            "runrow_heartbeat_lag_seconds",
            "How late each heartbeat ran past its interval",
            buckets=FAST_BUCKETS,
            registry=reg,
        )
        self.runs_reaped = Counter(
            "runrow_runs_reaped", "Runs whose worker was lost, ended by this process's reaper", registry=reg
        )
        self.journal_rows = Counter("runrow_journal_rows", "Journal rows written by workers", registry=reg)
        self.journal_flushes = Counter("runrow_journal_flushes", "Journal flushes by workers", registry=reg)

    def claimed(self, *, count: int, seconds: float) -> None:
        self.claims.inc()
        self.claim_seconds.observe(seconds)
        self.runs_claimed.inc(count)

    def run_started(self, run: RunView, *, queue_wait: float) -> None:
        self.runs_started.inc()
        if run.attempt > 1:  # (attempts past 5 share a label: the label set stays small)
            self.retries_started.labels(attempt=str(run.attempt) if run.attempt <= 5 else "6+").inc()
        self.queue_wait_seconds.observe(max(0.0, queue_wait))

    def first_event(self, run: RunView, *, seconds: float) -> None:
        self.first_event_seconds.observe(seconds)

    def journal_flush(self, run: RunView, *, rows: int) -> None:
        self.journal_flushes.inc()
        self.journal_rows.inc(rows)

    def run_finished(self, run: RunView, *, status: str, seconds: float, recorded: bool) -> None:
        self.runs_finished.labels(status=status, recorded="true" if recorded else "false").inc()
        self.run_duration_seconds.labels(status=status).observe(seconds)

    def claim_lost(self, run: RunView) -> None:
        self.claims_lost.inc()

    def heartbeat(self, *, runs: int, lag: float) -> None:
        self.heartbeat_lag_seconds.observe(lag)

    def reaped(self, *, count: int) -> None:
        self.runs_reaped.inc(count)


class QueueCollector(Collector):
    """Queue depth per tenant and hub reconnects, for Prometheus, read off the request path.

    ``db`` is a pool (recommended) or a conninfo string. Run the refresher while the
    process serves, as ``async with collector:`` or ``tg.start_soon(collector.run)``;
    each refresh is one read of the live (queued, running, waiting) rows, bounded by
    ``timeout`` on the server (``statement_timeout``, local to its transaction) and on
    the client. A scrape only reads the cache, so it never touches the database and
    never blocks the event loop. If refreshes fail, the last good values stay and
    ``runrow_queue_stats_age_seconds`` grows: alert on it.

    The collector registers itself with ``registry`` (default: prometheus-client's
    global registry) unless ``register=False``.

    ================================  =====  ============================================
    metric                            type   meaning
    ================================  =====  ============================================
    ``runrow_queue_depth``            gauge  queued runs, by ``tenant`` (``""``: none)
    ``runrow_runs_running``           gauge  running runs, by ``tenant``
    ``runrow_runs_waiting``           gauge  runs waiting for input, by ``tenant``
    ``runrow_oldest_queued_seconds``  gauge  age of the oldest queued run, by ``tenant``
    ``runrow_queue_stats_age_seconds``gauge  seconds since the last successful refresh
    ``runrow_queue_stats_errors``     count  refreshes that failed or timed out
    ``runrow_hub_reconnects``         count  NotifyHub reconnects after a lost connection
    ``runrow_hub_connected``          gauge  hubs whose LISTEN connection is up
    ``runrow_workers``                gauge  live registered workers, by ``version``
    ================================  =====  ============================================
    """

    def __init__(
        self,
        db: Database,
        *,
        schema: str = DEFAULT_SCHEMA,
        hubs: Sequence[NotifyHub | None] = (),
        interval: float = 5.0,
        timeout: float = 2.0,
        registry: CollectorRegistry | None = None,
        register: bool = True,
    ) -> None:
        check_schema(schema)
        if not interval > 0 or not timeout > 0:
            raise ConfigurationError("interval and timeout must be positive")
        self.db = db
        self.schema = schema
        self.interval = interval
        self.timeout = timeout
        self.hubs: list[NotifyHub] = [h for h in hubs if h is not None]
        self.errors = 0
        self.refreshes = 0
        # (refreshed at (monotonic), {tenant: (queued, running, waiting, oldest queued seconds or nan)})
        self._cache: tuple[float, dict[str, tuple[int, int, int, float]]] | None = None
        self._seen: set[str] = set()
        # Registered workers per version ('' for none), and every version seen (a drained
        # version reports 0 rather than vanishing).
        self._workers: dict[str, int] = {}
        self._seen_versions: set[str] = set()
        self._tg: TaskGroup | None = None
        if register:
            (REGISTRY if registry is None else registry).register(self)

    def add_hub(self, hub: NotifyHub | None) -> None:
        """Reports ``hub``'s reconnects too (e.g. ``dispatcher.hub`` once it started;
        None, a dispatcher's hub with ``notifications=False``, is ignored)."""
        if hub is not None and hub not in self.hubs:
            self.hubs.append(hub)

    async def refresh(self) -> None:
        """One bounded read of the live rows into the cache (raises on failure)."""
        timeout_ms = str(max(1, int(self.timeout * 1000)))
        with anyio.fail_after(self.timeout + 1):
            async with atomic(self.db) as conn:
                await run(conn, _gw.bound_statement_timeout(self.schema, timeout_ms=timeout_ms))
                rows = await run(conn, _gw.queue_depth_by_tenant(self.schema))
                workers = await run(conn, _workers.count_by_version(self.schema))
        found: dict[str, tuple[int, int, int, float]] = {}
        for row in rows:
            queued, running, waiting, age = found.get(row.tenant, (0, 0, 0, math.nan))
            if row.status == QUEUED:
                queued, age = row.runs, row.oldest_seconds
            elif row.status == WAITING:
                waiting = row.runs
            else:
                running = row.runs
            found[row.tenant] = (queued, running, waiting, age)
        self._cache = (time.monotonic(), found)
        self._seen |= found.keys()
        self._workers = workers
        self._seen_versions |= workers.keys()
        self.refreshes += 1

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Refreshes every ``interval`` seconds until cancelled; reports started after the
        first attempt, so a scrape right after start-up sees data when the database is up."""
        started = False
        while True:
            try:
                await self.refresh()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                self.errors += 1
                log.warning("queue metrics refresh failed: %s", type(exc).__name__)
            if not started:
                started = True
                task_status.started()
            await anyio.sleep(self.interval)

    async def __aenter__(self) -> QueueCollector:
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        await tg.start(self.run)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg, self._tg = self._tg, None
        assert tg is not None
        tg.cancel_scope.cancel()
        return await tg.__aexit__(exc_type, exc, tb)

    # -- the synchronous side: what a scrape calls -----------------------------------

    def describe(self) -> Iterable[Metric]:
        return self._families(None)

    def collect(self) -> Iterable[Metric]:
        return self._families(self._cache)

    def _families(self, cache: tuple[float, dict[str, tuple[int, int, int, float]]] | None) -> list[Metric]:
        depth = GaugeMetricFamily("runrow_queue_depth", "Queued runs, by tenant", labels=["tenant"])
        running = GaugeMetricFamily("runrow_runs_running", "Running runs, by tenant", labels=["tenant"])
        waiting = GaugeMetricFamily(
            "runrow_runs_waiting", "Runs waiting for a person's input, by tenant", labels=["tenant"]
        )
        oldest = GaugeMetricFamily(
            "runrow_oldest_queued_seconds", "Age of the oldest queued run, by tenant", labels=["tenant"]
        )
        age = GaugeMetricFamily(
            "runrow_queue_stats_age_seconds", "Seconds since the queue metrics were last read successfully"
        )
        errors = CounterMetricFamily(
            "runrow_queue_stats_errors", "Queue metric reads that failed or timed out"
        )
        reconnects = CounterMetricFamily(
            "runrow_hub_reconnects", "NotifyHub reconnects after a lost LISTEN connection"
        )
        connected = GaugeMetricFamily("runrow_hub_connected", "NotifyHubs whose LISTEN connection is up")
        workers = GaugeMetricFamily(
            "runrow_workers", "Live registered workers, by version ('' for none)", labels=["version"]
        )
        families: list[Metric] = [
            depth,
            running,
            waiting,
            oldest,
            age,
            errors,
            reconnects,
            connected,
            workers,
        ]
        errors.add_metric([], self.errors)
        reconnects.add_metric([], sum(h.reconnects for h in self.hubs))
        connected.add_metric([], sum(1 for h in self.hubs if h.connected))
        if cache is None:
            age.add_metric([], math.nan)
            return families
        at, found = cache
        age.add_metric([], time.monotonic() - at)
        for tenant in sorted(self._seen):
            q, r, w, a = found.get(tenant, (0, 0, 0, math.nan))
            depth.add_metric([tenant], q)
            running.add_metric([tenant], r)
            waiting.add_metric([tenant], w)
            if q:
                oldest.add_metric([tenant], a)
        for version in sorted(self._seen_versions):
            workers.add_metric([version], self._workers.get(version, 0))
        return families


# -- ASGI --------------------------------------------------------------------------------


def with_metrics(
    app: Callable[..., Awaitable[None]],
    *,
    path: str = "/metrics",
    registry: CollectorRegistry | None = None,
) -> Callable[..., Awaitable[None]]:
    """Wraps an ASGI ``app`` so that HTTP requests to ``path`` get the Prometheus text
    exposition of ``registry`` (default: the global one); everything else, lifespan
    included, goes to ``app``. Works with any ASGI framework (Starlette, FastAPI, ...).
    With Starlette you may instead ``app.mount("/metrics", prometheus_client.make_asgi_app())``.
    """
    exposition = make_asgi_app(REGISTRY if registry is None else registry)

    async def asgi(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope.get("type") == "http" and scope.get("path") == path:
            await exposition(scope, receive, send)
        else:
            await app(scope, receive, send)

    return asgi
