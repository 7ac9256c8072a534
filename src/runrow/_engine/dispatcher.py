"""The Dispatcher: lifecycle and drain; it wires the engine's services together.

* The claimer (``claimer.py``) takes runs for free slots, the executor (``executor.py``)
  runs the host's agent on each, the ending writer (``ending.py``) records how each
  ended, and the journal's appender (``journal_writer.py``) writes what they stream.
* The lease keeper (``lease.py``) rolls every claim's lease in one batched heartbeat,
  stands down runs whose claim lapsed, and turns stop requests into cancellation.
* The reaper (``reaper.py``) fails runs whose lease lapsed more than ``grace`` ago.
* ``stop()`` drains: it stops claiming, lets in-flight runs finish, then cancels the rest.

Each long-lived loop is a service (``service.py``); per-run work runs in a task set.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from .._db import statement_conn
from .._errors import ConfigurationError
from .._events import DEFAULT_MAX_EVENT_BYTES
from .._gateway import schema as _schema
from .._gateway._exec import run
from .._hub import NotifyHub
from .._names import DEFAULT_SCHEMA
from .._observe import Observers
from .drain import DrainReport
from .kit import STAT_NAMES, Kit, PoolCheck, own_pool
from .parts import Parts
from .settings import Settings, check_agents

if TYPE_CHECKING:
    import uuid
    from collections.abc import Mapping, Sequence
    from datetime import datetime
    from types import TracebackType

    from anyio.abc import TaskGroup
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    from .._gateway.claims import ClaimOrder, ResumePolicy
    from .._observe import Observer
    from .._retry import RetryPolicy
    from .context import Agent
    from .signals import Signals

__all__ = ["Dispatcher", "DrainReport"]

log = logging.getLogger("runrow.dispatcher")


class Dispatcher:
    """Runs ``agent`` for claimed runs. Use as ``async with Dispatcher(db, agent) as d:``.
    ``agents={"key": agent, ...}`` serves runs by agent key too (``enqueue(agent_key=...)``,
    ``RunContext.spawn``); ``agent`` serves runs with none. It claims only runs it serves.
    A tree of runs is at most ``max_spawn_depth`` deep, and spawns ``max_children`` in all;
    ``max_running_per_tree`` (None: no cap) is how many of a tree's spawned runs this
    worker's claims let run at once, so one wide tree cannot take every slot.

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
    characters) and carries its traceback; ``log_error_messages=False`` leaves both out, for
    logs that must never carry what a user wrote. ``record_tracebacks=False`` stores its error
    without ``error["traceback"]`` (at most 8 KiB of the innermost frames, never locals).

    ``claim_order="fair"`` (default) claims fairly across tenants (see the ``claim``
    statement in ``sql/claims.sql``: fewest running runs relative to the tenant's weight,
    then priority, then age; per-tenant caps; ``not_before``); ``"fifo"`` claims in
    global enqueue order, ignoring tenants and priorities (``not_before`` still holds).

    A run with a deadline (``enqueue(deadline=...)``) is cancelled when it passes it,
    measured from the claim on the database's clock, and ends ``failed`` with error type
    ``deadline_exceeded``; a run claimed already past its deadline ends so at once.

    ``version`` (default: ``$RUNROW_VERSION``, else the working directory's git commit, else
    none) is stamped on the runs it claims (a run keeps its first) and the steps it records,
    and shown in the worker registry (docs/howto/upgrading.md#deploying). ``resume_policy``:
    ``"replay"`` (default) resumes any run; ``"same_version"`` resumes (or retries) a run
    with recorded steps only if it started under this ``version`` (fresh turns: any).

    When a run ends, its slot takes the next run at once: the claim loop claims for it
    while the ending is written, on another connection. ``claim_with_endings=True``
    claims for it in the ending's own transaction instead: one commit per run rather than
    two when runs end one at a time (with many in flight, claims are batched either way),
    but the next run starts only once the ending has committed. Measured on one 2-core
    server with fast fsync, the default drains 13-39% more runs a second at 1, 16 and 160
    in flight; where a commit is dear (slow fsync, a busy WAL) the fold may pay
    (docs/howto/workers.md).
    """

    def __init__(
        self,
        db: str | AsyncConnectionPool[AsyncConnection],
        agent: Agent | None = None,
        *,
        agents: Mapping[str, Agent] | None = None,
        max_spawn_depth: int = 8,
        max_children: int = 1000,
        max_running_per_tree: int | None = None,
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
        record_tracebacks: bool = True,
        retry: RetryPolicy | None = None,
        version: str | None = None,
        resume_policy: ResumePolicy = "replay",
        claim_with_endings: bool = False,
    ) -> None:
        self._agents = served = check_agents(agent, agents)
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
            record_tracebacks=record_tracebacks,
            retry=retry,
            version=version,
            resume_policy=resume_policy,
            agents=served,
            max_spawn_depth=max_spawn_depth,
            max_children=max_children,
            max_running_per_tree=max_running_per_tree,
            claim_with_endings=claim_with_endings,
        )
        self._observer_list = list(observers)
        self._db = db
        self._owns_pool = isinstance(db, str)
        self._pool: AsyncConnectionPool[AsyncConnection] | None = None if isinstance(db, str) else db
        self._hub = hub
        self._owns_hub = hub is None and notifications
        self._tg: TaskGroup | None = None
        self._report: DrainReport | None = None
        self._stats = dict.fromkeys(STAT_NAMES, 0)
        self._parts: Parts | None = None
        self._signals: Signals | None = None  # a test's (see runrow.testing.signals)

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
        """The pool the dispatcher uses (its own, or the one it was given). Its own
        connections' sessions are set for runrow (JIT off, generic plans, and an
        ``idle_in_transaction_session_timeout`` of the grace, at most 10 s): open the host's
        own long transactions on a pool of the host's."""
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

    async def __aenter__(self) -> Dispatcher:
        s = self._settings
        if isinstance(self._db, str):
            self._pool = own_pool(self._db, s)
            await self._pool.open(wait=True)
        try:
            async with statement_conn(self.pool) as conn:
                await run(conn, _schema.require(s.schema))
            if self._owns_hub:
                self._hub = NotifyHub(s.listen_conninfo or self._conninfo())
                await self._hub.__aenter__()
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
        except BaseException:
            await self._close_resources()
            raise
        pool = self.pool
        pool_check = PoolCheck(pool, s.worker_id)
        kit = Kit(
            settings=s,
            pool=lambda: pool,
            db_trouble=pool_check.report,
            observe=Observers(self._observer_list, s.worker_id),
            stats=self._stats,
            signals=self._signals,
        )
        parts = self._parts = Parts(kit, self._agents)
        try:
            await parts.start(self._tg, pool_check, self._hub)
        except BaseException:
            # A service failed to start (a hub that cannot subscribe) or the host cancelled
            # the start: stop what did start and release everything (no shield: the task
            # group's scope is left in the scope it was entered in, as in __aexit__).
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
                    left = await self._parts.kit.tasks.cancel_and_wait(s.finalize_timeout)
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
        await parts.stop_claiming()
        with anyio.move_on_after(s.finalize_timeout + 1):  # and one made with endings
            await parts.endings.folds_settled()
        at_start = set(roster.runs)
        with anyio.move_on_after(drain_timeout):
            await roster.wait_idle()
        cut = [a for a in roster.runs.values() if not a.finishing]  # (not one writing its ending)
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
                await self._parts.close()
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

    def _use_signals(self, signals: Signals) -> None:
        """Fires ``signals`` at the engine's named points (tests only: see
        ``runrow.testing.signals``); before the dispatcher starts."""
        if self._parts is not None:
            raise RuntimeError("signals must be attached before the dispatcher starts")
        self._signals = signals

    def _running(self) -> Parts:
        if self._parts is None:
            raise RuntimeError("the dispatcher is not running")
        return self._parts
