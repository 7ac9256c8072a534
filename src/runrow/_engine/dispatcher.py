"""The Dispatcher: lifecycle and drain; it wires the engine's services together.

* The claimer (``claimer.py``) takes runs for free slots and the executor
  (``executor.py``) runs the host's agent on each; the ending writer (``ending.py``)
  records how each ended, fenced by its claim token, and the journal's appender
  (``journal_writer.py``) writes what they stream.
* The lease keeper (``lease.py``) rolls every claim's lease in one batched heartbeat,
  stands down runs whose claim lapsed, and turns stop requests into cancellation.
* The reaper (``reaper.py``) fails runs whose lease lapsed more than ``grace`` ago.
  Nothing is ever re-run automatically (at-most-once).
* Every terminal path wakes the queue, so a conversation's next turn starts at once.
* ``stop()`` drains: it stops claiming within milliseconds, lets in-flight runs finish
  within the budget, then cancels the rest.

Each long-lived loop is a service (``service.py``); per-run work runs in a task set.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

import anyio
from psycopg_pool import AsyncConnectionPool

from .. import _aio
from .._db import describe, statement_conn
from .._errors import ConfigurationError
from .._events import DEFAULT_MAX_EVENT_BYTES
from .._gateway import schema as _schema
from .._gateway._exec import configure_own
from .._hub import NotifyHub
from .._names import DEFAULT_SCHEMA
from .drain import DrainReport
from .parts import Parts
from .settings import Settings, check_agent

if TYPE_CHECKING:
    import uuid
    from collections.abc import Sequence
    from datetime import datetime
    from types import TracebackType

    from anyio.abc import TaskGroup, TaskStatus
    from psycopg import AsyncConnection

    from .._gateway.claims import ClaimOrder
    from .._observe import Observer
    from .._retry import RetryPolicy
    from .context import Agent

__all__ = ["Dispatcher", "DrainReport"]

log = logging.getLogger("runrow.dispatcher")

_STAT_NAMES: tuple[str, ...] = ("claimed", "completed", "failed", "cancelled", "parked", "reaped", "lost")
_STAT_NAMES += ("claim_conflicts", "claims")


class Dispatcher:
    """Runs ``agent`` for claimed runs. Use as ``async with Dispatcher(db, agent) as d:``.

    ``db`` is a conninfo string (the dispatcher opens its own pool) or an
    ``AsyncConnectionPool`` (whose conninfo the hub also uses for its direct LISTEN
    connection; pass ``hub=`` to share one hub or ``notifications=False`` to poll only).
    The claim loop, the two writers (endings, journal), the heartbeat and the reaper
    each keep one of the pool's connections between statements, when the pool is large
    enough to spare them (see
    docs/howto/workers.md); the dispatcher's own pool has ``concurrency + 5``.

    Timing options are seconds: ``lease`` (30) is how long a claim lives without a
    heartbeat, ``heartbeat`` (10) how often it is renewed (well under the lease),
    ``grace`` (30) how long past its lease a run is given before the reaper fails it,
    ``poll`` (10) the idle claim tick when no wake-up arrives (the ceiling with a hub,
    the latency without one), ``reap_interval`` (defaults to ``poll``) the reaper's tick,
    ``flush_interval`` (0.25) the journal's text-merging clock, and ``finalize_timeout``
    how long a run's ending may take before it is given up and left to the reaper: 10, or
    ``lease + grace - 2 x heartbeat`` if that is less, and never more than that (a run is
    not heartbeated once its ending is handed over, and its lease was last rolled up to
    2 x heartbeat before, so the reaper may take it that long after the hand-over; an
    ending given up is also dead on the server by then). All are finite and above 0.

    Behind a transaction-pooling pgbouncer: pass ``prepared_statements=False`` (or a pool
    built with ``prepare_threshold=None``) and ``listen_conninfo``, a direct connection to
    PostgreSQL for the hub's LISTEN (a pooled session cannot hold a LISTEN).

    ``retry`` (None: never) retries failed runs automatically, as new runs of the same
    turn, by a :class:`~runrow.RetryPolicy`; at-most-once stays the default.

    A failed run's log line names its error's type and message (one line, cut at 300
    characters); ``log_error_messages=False`` leaves the message out, for logs that must
    never carry what a user wrote (an agent's error may quote it).

    ``claim_order="fair"`` (default) claims fairly across tenants (see the ``claim``
    statement in ``sql/runs.sql``: fewest running runs relative to the tenant's weight,
    then priority, then age; per-tenant caps; ``not_before``); ``"fifo"`` claims in
    global enqueue order, ignoring tenants and priorities (``not_before`` still holds).

    A run with a deadline (``enqueue(deadline=...)``) is cancelled when it passes it,
    measured from the claim on the database's clock, and ends ``failed`` with error type
    ``deadline_exceeded``; a run claimed already past its deadline ends so at once.
    """

    def __init__(
        self,
        db: str | AsyncConnectionPool[AsyncConnection],
        agent: Agent,
        *,
        schema: str = DEFAULT_SCHEMA,
        concurrency: int = 8,
        lease: float = 30.0,
        heartbeat: float = 10.0,
        grace: float = 30.0,
        poll: float = 10.0,
        reap_interval: float | None = None,
        flush_interval: float = 0.25,
        worker_id: str | None = None,
        hub: NotifyHub | None = None,
        notifications: bool = True,
        finalize_timeout: float | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        observers: Sequence[Observer] = (),
        prepared_statements: bool = True,
        listen_conninfo: str | None = None,
        claim_order: ClaimOrder = "fair",
        log_error_messages: bool = True,
        retry: RetryPolicy | None = None,
    ) -> None:
        check_agent(agent)
        self._settings = Settings.validate(
            own_pool=isinstance(db, str),
            schema=schema,
            concurrency=concurrency,
            lease=lease,
            heartbeat=heartbeat,
            grace=grace,
            poll=poll,
            reap_interval=reap_interval,
            flush_interval=flush_interval,
            finalize_timeout=finalize_timeout,
            max_event_bytes=max_event_bytes,
            worker_id=worker_id,
            claim_order=claim_order,
            prepared_statements=prepared_statements,
            listen_conninfo=listen_conninfo,
            notifications=notifications,
            log_error_messages=log_error_messages,
            retry=retry,
        )
        self._agent = agent
        self._observer_list = list(observers)
        self._db = db
        self._owns_pool = isinstance(db, str)
        self._pool: AsyncConnectionPool[AsyncConnection] | None = None if isinstance(db, str) else db
        self._hub = hub
        self._owns_hub = hub is None and notifications
        self._tg: TaskGroup | None = None
        self._report: DrainReport | None = None
        self._stats = dict.fromkeys(_STAT_NAMES, 0)
        self._trouble = _aio.Event()
        self._parts: Parts | None = None

    # -- public surface ---------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The validated settings, defaults filled in (frozen)."""
        return self._settings

    @property
    def worker_id(self) -> str:
        """This dispatcher's worker id (in each run's row, and in its log lines)."""
        return self._settings.worker_id

    @property
    def pool(self) -> AsyncConnectionPool[AsyncConnection]:
        """The pool the dispatcher uses (its own, or the one it was given)."""
        if self._pool is None:
            raise RuntimeError("the dispatcher is not running")
        return self._pool

    @property
    def hub(self) -> NotifyHub | None:
        """The NotifyHub it listens on (None with ``notifications=False``)."""
        return self._hub

    @property
    def in_flight(self) -> list[uuid.UUID]:
        """Ids of the runs this process is executing now."""
        return [] if self._parts is None else list(self._parts.roster.runs)

    def get_stats(self) -> dict[str, int]:
        """Counters since start: runs ``claimed``, ``completed``, ``failed``,
        ``cancelled``, ``reaped`` (by this dispatcher's reaper) and ``lost`` (stood down
        without writing), ``claims`` (statements) and ``claim_conflicts``."""
        return dict(self._stats)

    async def beat(self) -> None:
        """One heartbeat now, for every run in flight (the loop does this every ``heartbeat`` s)."""
        await self._running().lease.beat()

    async def reap(self, *, now: datetime | None = None, limit: int = 100) -> list[uuid.UUID]:
        """One reaper pass now; returns the ids it ended (failed, or cancelled if a stop was pending)."""
        return await self._running().reaper.reap(now=now, limit=limit)

    # -- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> Dispatcher:
        s = self._settings
        if isinstance(self._db, str):
            self._pool = AsyncConnectionPool(
                self._db,
                # The connections kept by the claim loop, the ending writer, the journal
                # writer, the heartbeat and the reaper are ready at start (the first runs
                # do not wait on connecting), and each run has one more.
                min_size=min(5, s.concurrency + 5),
                max_size=s.concurrency + 5,
                open=False,
                # Behind a transaction-pooling pgbouncer (< 1.21), server-side prepared
                # statements break: prepared_statements=False turns them off.
                # Prepared at first use: the dispatcher repeats a handful of statements.
                kwargs={"autocommit": True, "prepare_threshold": 0 if s.prepared_statements else None},
                # A direct connection turns JIT off once for its session; behind a pooler
                # (prepared_statements=False) every statement carries its own guard.
                configure=configure_own if s.prepared_statements else None,
                name=f"runrow-{s.worker_id}",
            )
            await self._pool.open(wait=True)
        try:
            async with statement_conn(self.pool) as conn:
                await _schema.require(conn, s.schema)
            if self._owns_hub:
                self._hub = NotifyHub(s.listen_conninfo or self._conninfo())
                await self._hub.__aenter__()
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
        except BaseException:
            await self._close_resources()
            raise
        parts = self._parts = Parts(self)
        try:
            tg, services = self._tg, parts.services
            await services.start(tg, "appends", parts.appender.run)
            await services.start(tg, "endings", parts.endings.run)
            await services.start(tg, "heartbeat", parts.lease.heartbeats)
            await services.start(tg, "reaper", parts.reaper.run)
            await services.start(tg, "pool-check", self._check_pool)
            await services.start(tg, "schema-watch", parts.schema_watch.run)
            if (hub := self._hub) is not None:
                await services.start(tg, "wakes", functools.partial(parts.claimer.forward_wakes, hub))
                await services.start(tg, "cancels", functools.partial(parts.lease.watch_cancels, hub))
            await services.start(tg, "claimer", parts.claimer.run)
        except BaseException:
            # A service failed to start (a hub that cannot subscribe) or the host cancelled
            # the start: stop what did start and release everything, as if never started.
            # (The task group's scope is left in the scope it was entered in: no shield
            # around it, as in __aexit__.)
            tg, self._tg = self._tg, None
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)
            await self._close_resources()
            raise
        extra = {"worker_id": s.worker_id}
        log.info("dispatcher %s started (concurrency %d)", s.worker_id, s.concurrency, extra=extra)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        s = self._settings
        try:
            if exc_type is None or not issubclass(exc_type, Exception):
                await self.stop()
            else:
                # The host's block failed: still drain, but do not wait the full budget.
                await self.stop(drain_timeout=min(s.finalize_timeout, 5.0))
        finally:
            # A run still going past every budget of stop() (an agent deaf to cancellation)
            # is cancelled outright; its ending is the reaper's (stop() listed it so).
            if self._parts is not None:
                with anyio.CancelScope(shield=True):
                    left = await self._parts.tasks.cancel_and_wait(s.finalize_timeout)
                if left:
                    log.warning(
                        "dispatcher %s: %d run task(s) did not end when cancelled; abandoning them",
                        s.worker_id,
                        left,
                        extra={"worker_id": s.worker_id},
                    )
            tg, self._tg = self._tg, None
            if tg is not None:
                tg.cancel_scope.cancel()  # anything still running (nothing, after stop())
                await tg.__aexit__(None, None, None)
            await self._close_resources()

    async def stop(self, drain_timeout: float = 30.0) -> DrainReport:
        """Drains and stops; idempotent (a second call returns the first report).

        Phase 1 stops claiming (milliseconds). Phase 2 waits up to ``drain_timeout``
        for in-flight runs to finish; whatever is still running is then cancelled and
        recorded ``failed`` with ``worker_shutdown``, and any run whose ending could
        not be written is listed in ``left_for_reaper``.
        """
        if self._report is not None:
            return self._report
        parts = self._parts
        if self._tg is None or parts is None:
            return DrainReport()  # not running: nothing to drain (and a later start drains as usual)
        s, roster = self._settings, parts.roster
        parts.claimer.stopping = True
        # A claim in flight finishes and its runs start.
        await parts.services.stop("claimer", timeout=s.lease / 2 + 1)
        with anyio.move_on_after(s.finalize_timeout + 1):  # and one made with endings
            await parts.endings.folds_settled()
        at_start = set(roster.runs)
        with anyio.move_on_after(drain_timeout):
            await roster.wait_idle()
        # (A run already writing its ending is not cut: its agent is done.)
        cut = [a for a in roster.runs.values() if not a.finishing]
        for a in cut:
            roster.cancel(a, "drain")
        with anyio.move_on_after(s.finalize_timeout + 1):
            await roster.wait_idle()
        stuck = set(roster.runs)
        left = stuck | (roster.unrecorded & at_start)
        interrupted = {a.id for a in cut if a.reason == "drain"} - left
        self._report = DrainReport(
            finished=sorted(at_start - {a.id for a in cut} - left),
            interrupted=sorted(interrupted),
            left_for_reaper=sorted(left),
        )
        with anyio.CancelScope(shield=True):
            await parts.services.stop(timeout=s.finalize_timeout)
        r = self._report
        log.info(
            "dispatcher %s stopped: %d finished, %d interrupted, %d left for the reaper",
            *(s.worker_id, len(r.finished), len(r.interrupted), len(r.left_for_reaper)),
            extra={"worker_id": s.worker_id},
        )
        return self._report

    async def _close_resources(self) -> None:
        if self._parts is not None:
            with anyio.CancelScope(shield=True):
                await self._parts.endings.close()
                await self._parts.appender.close()
                await self._parts.beat_conn.release()
                await self._parts.reap_conn.release()
        # The hub's task group must exit in the scope it was entered in (no shield here).
        if self._owns_hub and self._hub is not None and self._hub.running:
            await self._hub.__aexit__(None, None, None)
        if self._owns_pool and self._pool is not None:
            with anyio.CancelScope(shield=True):
                await self._pool.close()

    def _conninfo(self) -> str:
        if isinstance(self._db, str):
            return self._db
        conninfo = self.pool.conninfo
        if not isinstance(conninfo, str):
            raise ConfigurationError(
                "the pool's conninfo is a callable; pass hub=NotifyHub(conninfo) explicitly"
            )
        return conninfo

    def _running(self) -> Parts:
        if self._parts is None:
            raise RuntimeError("the dispatcher is not running")
        return self._parts

    # -- the handle runs get (see RunHost) --------------------------------------------

    def _pool_now(self) -> AsyncConnectionPool[AsyncConnection]:
        return self.pool

    def _db_trouble(self) -> None:
        """A statement failed for want of a connection: have the pool test its idle
        connections and replace dead ones (after a server restart they all are)."""
        self._trouble.set()

    async def _check_pool(self, *, task_status: TaskStatus[None]) -> None:
        """Checks the pool when a statement reported trouble, at most once a second
        (service ``pool-check``)."""
        task_status.started()
        while True:
            await self._trouble.wait()
            self._trouble.clear()
            try:
                await self.pool.check()
            except Exception as exc:  # best effort
                log.debug("pool check failed: %s", describe(exc), extra={"worker_id": self.worker_id})
            await anyio.sleep(1.0)
