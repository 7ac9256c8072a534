"""Dispatcher: claims runs, runs the host's agent on them, and keeps the guarantees.

* Slots before claims: a process with no free slot never claims; one claim statement
  takes up to as many runs as there are free slots (at most one per conversation).
* A lease, rolled forward by one batched heartbeat for all of this process's runs.
* Every write is fenced by the claim token and ``status = 'running'``; a write that
  matches nothing means the claim is lost and the run's agent is stopped at once.
* A reaper on every dispatcher (and a sweep at start) fails runs whose lease lapsed
  more than ``grace`` ago, re-checking the expiry inside its own write. Nothing is
  ever re-run automatically (at-most-once).
* Every terminal path wakes the queue, so a conversation's next turn starts at once.
* ``stop()`` drains: it stops claiming within milliseconds, lets in-flight runs finish
  within the budget, then cancels the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio
import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from .. import _aio, _json, _sql
from .._db import (
    HeldConnection,
    configure_own,
    describe,
    execute,
    jit_off_session,
    statement_conn,
)
from .._engine.journal_writer import AppendItem, JournalWriter
from .._errors import ConfigurationError, InvalidInput, LeaseLost
from .._events import DEFAULT_MAX_EVENT_BYTES
from .._gateway import schema as _schema
from .._hub import NotifyHub
from .._names import DEFAULT_SCHEMA, Channels, check_schema
from .context import Agent, RunContext
from .groupcommit import GroupCommit, WriterStopped

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
    from types import TracebackType

    from anyio.abc import TaskGroup

    from .._observe import Observer

__all__ = ["ClaimOrder", "Dispatcher", "DrainReport"]

log = logging.getLogger("runrow.dispatcher")

_Reason = Literal["cancel", "drain", "lost", "deadline"]
# Failures a finalize retries: the write may or may not have landed; the fence makes a
# second attempt safe either way (and one that matches nothing reads back whose ending
# was recorded).
_TRANSIENT = (psycopg.OperationalError, OSError, TimeoutError)


class _OutOfTime(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"no attempt landed within finalize_timeout ({seconds}s)")


class _Answer:
    """A run's ending is answered once (landed or not), by whichever comes first: the
    writer, a retry, or the budget timer; later answers are ignored. ``deadline`` is
    when the budget ends (loop time); ``sent`` is true while an attempt is with the
    server and not yet answered."""

    __slots__ = ("answered", "deadline", "done", "sent", "timer")

    def __init__(self, done: Callable[[bool], None], deadline: float) -> None:
        self.done = done
        self.deadline = deadline
        self.answered = False
        self.sent = False
        self.timer: asyncio.TimerHandle | None = None

    def __call__(self, landed: bool) -> None:
        if not self.answered:
            self.answered = True
            if self.timer is not None:
                self.timer.cancel()
            self.done(landed)


ClaimOrder = Literal["fair", "fifo"]
DEADLINE_ERROR = {"type": "deadline_exceeded", "message": "the run was still running past its deadline"}
# (run_id, token, status, error_json, answer_text, rows, answer)
_FinalItem = tuple[uuid.UUID, uuid.UUID, str, str | None, str | None, list[tuple[int, str, str]], _Answer]


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What :meth:`Dispatcher.stop` did with the runs in flight when it was called."""

    finished: list[uuid.UUID] = field(default_factory=list)
    """Runs that reached a terminal state during the drain budget."""
    interrupted: list[uuid.UUID] = field(default_factory=list)
    """Runs cancelled when the budget ran out and recorded ``failed`` (worker_shutdown)."""
    left_for_reaper: list[uuid.UUID] = field(default_factory=list)
    """Runs whose ending could not be recorded; the reaper fails them after lease + grace."""


class _Waker:
    """A level-triggered wake-up: set() from anywhere, wait(timeout) in the claim loop."""

    def __init__(self) -> None:
        self._event = _aio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = _aio.Event()

    async def wait(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self._event.wait()
        self.clear()


class _Active:
    """One claimed run in this process."""

    __slots__ = (
        "ctx",
        "finishing",
        "handed_over",
        "id",
        "journal",
        "lease_deadline",
        "reason",
        "scope",
        "slot_freed",
        "token",
    )

    def __init__(self, run_id: uuid.UUID, token: uuid.UUID, lease_deadline: float) -> None:
        self.id = run_id
        self.token = token
        self.scope = anyio.CancelScope()
        self.reason: _Reason | None = None
        self.finishing = False
        self.handed_over = False  # its ending is with the writer, which releases it
        self.lease_deadline = lease_deadline
        self.journal: JournalWriter | None = None
        self.ctx: RunContext | None = None
        self.slot_freed = False


class _Helper:
    """A task that serves one run (its flush clock, its deadline) in the dispatcher's task
    group; ``stop()`` cancels it and waits until it has ended, as a run's own task group
    would on exit, so nothing of the run is still writing when its ending is written."""

    __slots__ = ("done", "scope", "started")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.started = False

    async def run(self, fn: Callable[[], Awaitable[None]]) -> None:
        self.started = True
        try:
            with self.scope:
                await fn()
        except Exception:  # a helper's failure must not end the dispatcher
            log.exception("a run's helper task failed")
        finally:
            self.done.set()

    async def stop(self) -> None:
        self.scope.cancel()
        # A task that never started (cancelled before its first step) runs nothing: its
        # cancelled scope ends it at its first checkpoint, before any write.
        if self.started:
            await self.done.wait()


class Dispatcher:
    """Runs ``agent`` for claimed runs. Use as ``async with Dispatcher(db, agent) as d:``.

    ``db`` is a conninfo string (the dispatcher opens its own pool) or an
    ``AsyncConnectionPool`` (whose conninfo the hub also uses for its direct LISTEN
    connection; pass ``hub=`` to share one hub or ``notifications=False`` to poll only).
    The claim loop and the two writers (endings, journal) each keep one of the pool's
    connections between statements, when the pool is large enough to spare them (see
    docs/howto/workers.md); the dispatcher's own pool has ``concurrency + 4``.

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
    ``journal_notify=False``
    drops the per-flush NOTIFY (tails then poll); it exists to measure what the NOTIFY costs.

    Behind a transaction-pooling pgbouncer: pass ``prepared_statements=False`` (or a pool
    built with ``prepare_threshold=None``) and ``listen_conninfo``, a direct connection to
    PostgreSQL for the hub's LISTEN (a pooled session cannot hold a LISTEN).

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
        journal_notify: bool = True,
        observers: Sequence[Observer] = (),
        prepared_statements: bool = True,
        listen_conninfo: str | None = None,
        claim_order: ClaimOrder = "fair",
    ) -> None:
        check_schema(schema)
        if claim_order not in ("fair", "fifo"):
            raise ConfigurationError(f"claim_order must be 'fair' or 'fifo', got {claim_order!r}")
        if not callable(agent):
            raise InvalidInput("agent", "must be an async callable taking a RunContext")
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError("concurrency must be a positive integer")
        for name, value in (
            ("lease", lease),
            ("heartbeat", heartbeat),
            ("grace", grace),
            ("poll", poll),
            ("reap_interval", reap_interval),
            ("flush_interval", flush_interval),
            ("finalize_timeout", finalize_timeout),
        ):
            # (inf would pass "> 0" and then never fire: a lease=inf claim never expires
            # and the claim loop's bound never ends a hung claim; nan compares false.)
            if value is not None and not (
                isinstance(value, int | float) and math.isfinite(value) and value > 0
            ):
                raise ConfigurationError(f"{name} must be a finite number of seconds above 0, got {value!r}")
        if heartbeat > lease / 2:
            raise ConfigurationError(
                f"heartbeat ({heartbeat}s) must be at most half the lease ({lease}s), so one "
                "late heartbeat does not cost the claim"
            )
        # The lease is not rolled once a run's ending is handed over (the heartbeat skips
        # finishing runs), and was last rolled up to 2 x heartbeat before (one heartbeat
        # apart, plus up to one heartbeat that the previous beat may take before it gives
        # up). So the reaper may take the run lease + grace - 2 x heartbeat after the
        # hand-over; the ending must be given up, and dead on the server, by then.
        ending_bound = lease + grace - 2 * heartbeat
        if finalize_timeout is None:
            finalize_timeout = min(10.0, ending_bound)
        elif finalize_timeout > ending_bound:
            raise ConfigurationError(
                f"finalize_timeout ({finalize_timeout}s) must be at most {ending_bound:g}s "
                f"(lease + grace - 2 x heartbeat), so a live worker's ending is given up "
                "before the reaper could take its run"
            )
        if not prepared_statements and not isinstance(db, str):
            # The flag shapes only the pool the dispatcher opens; a caller's pool prepares
            # as its owner configured it (prepare_threshold), and changing a shared pool's
            # connections behind its owner's back is not ours to do.
            raise ConfigurationError(
                "prepared_statements=False applies only to the pool the dispatcher opens from a "
                "conninfo string; build your pool with kwargs={'prepare_threshold': None} instead"
            )
        if worker_id is not None:
            _json.check_id(worker_id, "worker_id")
        self.agent = agent
        self.journal_notify = journal_notify
        self.prepared_statements = prepared_statements
        self.listen_conninfo = listen_conninfo
        self.claim_order = claim_order
        self.observers = list(observers)
        self.schema = schema
        self.concurrency = concurrency
        self.lease = lease
        self.heartbeat = heartbeat
        self.grace = grace
        self.poll = poll
        self.reap_interval = reap_interval if reap_interval is not None else poll
        self.flush_interval = flush_interval
        self.finalize_timeout = finalize_timeout
        # How much sooner than an ending's budget the server must end its statement, so
        # that the server's answer (the error) reaches us before we give up on it.
        self._ending_margin = min(1.0, 0.1 * finalize_timeout)
        # The bound the ending writer's own connection keeps for its session (see
        # _finalize_batch): an ending handed over and sent within one more margin, as on
        # the hot path, leaves at least this much of its budget, and goes out alone.
        self._session_budget = finalize_timeout - 2 * self._ending_margin
        self.max_event_bytes = max_event_bytes
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.channels = Channels.for_schema(schema)
        self._db = db
        self._owns_pool = isinstance(db, str)
        self._pool: AsyncConnectionPool[AsyncConnection] | None = None if isinstance(db, str) else db
        self._hub = hub
        self._owns_hub = hub is None and notifications
        self._notifications = notifications
        self._active: dict[uuid.UUID, _Active] = {}
        self._slots = anyio.Semaphore(concurrency)
        self._waker = _Waker()
        self._idle = anyio.Event()
        self._idle.set()
        self._tg: TaskGroup | None = None
        self._runs = _aio.TaskSet()  # the runs' tasks (not the task group's: see TaskSet)
        self._claim_scope = anyio.CancelScope()
        self._claim_done = anyio.Event()
        # The claim loop and the two group-commit writers keep one pooled connection each: their
        # prepared statements stay warm (a statement reaches its cached generic plan only
        # after several executions on one connection, and the pool hands connections
        # out in turn), and no pool round trip per statement.
        self._claim_conn = HeldConnection(lambda: self.pool, min_pool=2)
        self._finalize_conn = HeldConnection(lambda: self.pool, min_pool=4)
        self._append_conn = HeldConnection(lambda: self.pool, min_pool=6)
        self._loops: list[anyio.CancelScope] = []
        self._loops_running = 0
        self._loops_done = anyio.Event()
        self._stopping = False
        self._report: DrainReport | None = None
        self._unrecorded: set[uuid.UUID] = set()  # runs whose ending we could not write
        # Cancel hints for run ids not (yet) ours, by arrival time: a stop that commits
        # between a claim and the registration of its runs must not be lost.
        self._unknown_cancels: dict[uuid.UUID, float] = {}
        self._last_pool_check = -1e9
        self._beat_lag = 0.0
        self._appender: GroupCommit[AppendItem, bool] = GroupCommit(self._append_batch)
        # Bounded by finalize_timeout: no run's task waits on its write (see _finalize).
        self._finalizer: GroupCommit[_FinalItem, bool | None] = GroupCommit(
            self._finalize_batch, timeout=finalize_timeout
        )
        self._queries = {
            "claim": _sql.statement("claim", schema)
            if claim_order == "fair"
            else _sql.statement("claim_fifo", schema),
            "heartbeat": _sql.statement("heartbeat", schema),
            "cancel_flag": _sql.statement("cancel_flag", schema),
            "finalize": _sql.statement("finalize", schema),
            "ending_budget": _sql.statement("ending_budget", schema),
            "ending_budget_session": _sql.statement("ending_budget_session", schema),
            "ending_budget_unset": _sql.statement("ending_budget_unset", schema),
            "flush_landed": _sql.statement("flush_landed", schema),
            "ending_landed": _sql.statement("ending_landed", schema),
            "append_events": _sql.statement("append_events", schema),
        }
        # Counters a host (or the metrics module) can read.
        self.stats: dict[str, int] = dict.fromkeys(
            ("claimed", "completed", "failed", "cancelled", "reaped", "lost", "claim_conflicts", "claims"), 0
        )

    # -- public surface ---------------------------------------------------------------

    @property
    def pool(self) -> AsyncConnectionPool[AsyncConnection]:
        if self._pool is None:
            raise RuntimeError("the dispatcher is not running")
        return self._pool

    @property
    def hub(self) -> NotifyHub | None:
        return self._hub

    @property
    def in_flight(self) -> list[uuid.UUID]:
        """Ids of the runs this process is executing now."""
        return list(self._active)

    async def __aenter__(self) -> Dispatcher:
        if isinstance(self._db, str):
            self._pool = AsyncConnectionPool(
                self._db,
                # Ready at start for the claim loop, the ending writer, the journal
                # writer and the heartbeat: the first runs do not wait on connecting.
                min_size=min(4, self.concurrency + 4),
                max_size=self.concurrency + 4,
                open=False,
                # Behind a transaction-pooling pgbouncer (< 1.21), server-side prepared
                # statements break: prepared_statements=False turns them off.
                # Prepared at first use: the dispatcher repeats a handful of statements.
                kwargs={"autocommit": True, "prepare_threshold": 0 if self.prepared_statements else None},
                # A direct connection turns JIT off once for its session; behind a pooler
                # (prepared_statements=False) every statement carries its own guard.
                configure=configure_own if self.prepared_statements else None,
                name=f"runrow-{self.worker_id}",
            )
            await self._pool.open(wait=True)
        try:
            async with statement_conn(self.pool) as conn:
                await _schema.require(conn, self.schema)
            if self._owns_hub:
                self._hub = NotifyHub(self.listen_conninfo or self._conninfo())
                await self._hub.__aenter__()
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
        except BaseException:
            await self._close_resources()
            raise
        self._background(self._appender.run)
        self._background(self._finalizer.run)
        self._background(self._heartbeat_loop)
        self._background(self._reaper_loop)
        if self._hub is not None:
            await self._tg.start(self._background_started, self._forward_wakes)
            await self._tg.start(self._background_started, self._watch_cancels)
        self._tg.start_soon(self._claim_loop)
        log.info(
            "dispatcher %s started (concurrency %d)",
            self.worker_id,
            self.concurrency,
            extra={"worker_id": self.worker_id},
        )
        return self

    def _background(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Starts a loop that stop() ends by cancelling its own scope (never the task group's:
        that scope belongs to the host's task, and only __aexit__ may leave it)."""
        assert self._tg is not None
        self._tg.start_soon(self._run_background, fn)

    async def _run_background(self, fn: Callable[[], Awaitable[None]]) -> None:
        scope = anyio.CancelScope()
        self._loops.append(scope)
        self._loops_running += 1
        try:
            with scope:
                await fn()
        finally:
            self._loops_running -= 1
            if not self._loops_running:
                self._loops_done.set()

    async def _background_started(
        self, fn: Callable[..., Awaitable[None]], *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        async def body() -> None:
            await fn(task_status=task_status)

        await self._run_background(body)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is None or not issubclass(exc_type, Exception):
                await self.stop()
            else:
                # The host's block failed: still drain, but do not wait the full budget.
                await self.stop(drain_timeout=min(self.finalize_timeout, 5.0))
        finally:
            # A run still going past every budget of stop() (an agent deaf to cancellation)
            # is cancelled outright; its ending is the reaper's (stop() listed it so).
            with anyio.CancelScope(shield=True):
                left = await self._runs.cancel_and_wait(self.finalize_timeout)
            if left:
                log.warning(
                    "dispatcher %s: %d run task(s) did not end when cancelled; abandoning them",
                    self.worker_id,
                    left,
                    extra={"worker_id": self.worker_id},
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
        if self._tg is None:
            self._report = DrainReport()
            return self._report
        self._stopping = True
        self._claim_scope.cancel()
        with anyio.move_on_after(self.lease / 2 + 1):
            await self._claim_done.wait()  # a claim in flight finishes and its runs start
        at_start = set(self._active)
        with anyio.move_on_after(drain_timeout):
            await self._idle.wait()
        # (A run already writing its ending is not cut: its agent is done.)
        cut = [a for a in self._active.values() if not a.finishing]
        for a in cut:
            self._cancel(a, "drain")
        with anyio.move_on_after(self.finalize_timeout + 1):
            await self._idle.wait()
        stuck = {a.id for a in self._active.values()}
        left = stuck | (self._unrecorded & at_start)
        interrupted = {a.id for a in cut if a.reason == "drain"} - left
        self._report = DrainReport(
            finished=sorted(at_start - {a.id for a in cut} - left),
            interrupted=sorted(interrupted),
            left_for_reaper=sorted(left),
        )
        for scope in self._loops:
            scope.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.finalize_timeout):
            await self._loops_done.wait()
        log.info(
            "dispatcher %s stopped: %d finished, %d interrupted, %d left for the reaper",
            self.worker_id,
            len(self._report.finished),
            len(self._report.interrupted),
            len(self._report.left_for_reaper),
            extra={"worker_id": self.worker_id},
        )
        return self._report

    async def _close_resources(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._finalize_conn.release()
            await self._append_conn.release()
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

    def _observe(self, hook: Callable[[Observer], object]) -> None:
        for obs in self.observers:
            try:
                hook(obs)
            except Exception:  # an observer must never break a run
                log.exception("observer %r failed", obs, extra={"worker_id": self.worker_id})

    # -- claiming ---------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        try:
            await self._claim_until_stopped()
        finally:
            with anyio.CancelScope(shield=True):
                await self._claim_conn.release()
            self._claim_done.set()

    async def _claim_until_stopped(self) -> None:
        with self._claim_scope:
            backoff = 0.05
            while not self._stopping:
                await self._slots.acquire()
                want = 1
                while want < self.concurrency and self._slots.value > 0:
                    self._slots.acquire_nowait()
                    want += 1
                self._waker.clear()
                try:
                    # Shielded: a claim the server committed must reach us, or its runs
                    # would sit "running" with no worker until the reaper failed them.
                    # (One scope that is both shield and bound: cheaper than two.)
                    with anyio.CancelScope(shield=True, deadline=_aio.now() + self.lease / 2) as bound:
                        rows = await self._claim(want)
                    if bound.cancelled_caught:
                        raise TimeoutError("claim did not finish in time")
                    backoff = 0.05
                except psycopg.errors.UniqueViolation:
                    # Another claimer won a conversation's turn: claim nothing this round.
                    self.stats["claim_conflicts"] += 1
                    rows = []
                    self._waker.set()
                except (psycopg.Error, OSError, TimeoutError) as exc:
                    for _ in range(want):
                        self._slots.release()
                    self._db_trouble()
                    log.warning("claim failed: %s", describe(exc), extra={"worker_id": self.worker_id})
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, self.poll)
                    continue
                self._register(rows)
                for _ in range(want - len(rows)):
                    self._slots.release()
                for row in rows:
                    self._runs.start(self._execute(row))
                if not rows:
                    # Nothing to claim now: park until a wake-up or the poll tick. (A claim
                    # that came back short but not empty is followed by another at once:
                    # a fair batch can be short while runs remain, e.g. after a lock race.)
                    await self._waker.wait(self.poll)

    async def _claim(self, limit: int) -> list[dict[str, Any]]:
        t0 = _aio.now()
        async with self._claim_conn.statement() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await execute(
                conn,
                self._queries["claim"],
                {"limit": limit, "lease_seconds": self.lease, "worker_id": self.worker_id, "now": None},
                cursor=cur,
            )
            rows = await cur.fetchall()
        self.stats["claims"] += 1
        self.stats["claimed"] += len(rows)
        if self.observers and rows:
            took = _aio.now() - t0
            self._observe(lambda o: o.claimed(count=len(rows), seconds=took))
        return rows

    def _register(self, rows: list[dict[str, Any]]) -> None:
        """Makes the claimed runs this process's (called right after the claim, with no
        await in between: nothing can run between the claim's answer and this)."""
        if rows and self._idle.is_set():
            self._idle = anyio.Event()
        deadline = _aio.now() + self.lease
        for row in rows:
            active = self._active[row["id"]] = _Active(row["id"], row["claim_token"], deadline)
            if row["cancel_requested"]:
                self._cancel(active, "cancel")  # stopped already: the agent is never called
            elif self._unknown_cancels.pop(active.id, None) is not None and self._tg is not None:
                # A cancel hint came before we knew the run (a stop committed right after
                # the claim): check the row now, as the watcher would have.
                self._tg.start_soon(self._check_cancel, active)

    async def _forward_wakes(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        assert self._hub is not None
        async with self._hub.subscribe(self.channels.wake) as sub:
            task_status.started()
            while True:
                await sub.receive()
                self._waker.set()

    # -- running one run --------------------------------------------------------------

    async def _execute(self, row: Mapping[str, Any]) -> None:
        active = self._active[row["id"]]
        try:
            await self._execute_claimed(active, row)
        except Exception:
            # A bug of runrow's must not take the worker and its other runs down with
            # this one: the run stays claimed until its lease lapses and a reaper ends it.
            self._unrecorded.add(active.id)
            log.exception(
                "run %s: unexpected error; its ending is left to the reaper",
                active.id,
                extra={"run_id": str(active.id), "worker_id": self.worker_id},
            )
        finally:
            if not active.handed_over:
                self._release(active)

    def _release(self, active: _Active) -> None:
        """The run is done with, ending written or not: forget it (idempotent)."""
        self._active.pop(active.id, None)
        self._free_slot(active)
        self._waker.set()  # this conversation's next turn may be ready
        if not self._active:
            self._idle.set()

    def _free_slot(self, active: _Active) -> None:
        if not active.slot_freed:
            active.slot_freed = True
            self._slots.release()
            self._waker.set()

    async def _execute_claimed(self, active: _Active, row: Mapping[str, Any]) -> None:
        run_id = active.id
        journal = JournalWriter(
            run_id,
            active.token,
            int(row["last_seq"]) + 1,
            self._appender,
            flush_interval=self.flush_interval,
            max_event_bytes=self.max_event_bytes,
            on_lost=lambda: self._lost(run_id),
            resolve=self._flush_landed,
            retry_budget=self.lease / 2,
        )
        ctx = RunContext(self, row, journal)
        ctx.cancel_requested = active.reason == "cancel"  # stopped between claim and here
        active.journal, active.ctx = journal, ctx
        extra = {"run_id": str(run_id), "conversation_id": ctx.conversation_id, "worker_id": self.worker_id}
        log.info("run %s started", run_id, extra=extra)
        started = _aio.now()
        if self.observers:
            wait = (row["started_at"] - row["created_at"]).total_seconds()
            self._observe(lambda o: o.run_started(ctx, queue_wait=wait))
            journal.on_flush = lambda n: self._flushed(ctx, n, started)
        status: str | None = None
        error: dict[str, Any] | None = None
        # The deadline, measured on the database's clock: both times come from the claim.
        remaining = (
            None
            if row.get("deadline_at") is None
            else (row["deadline_at"] - row["started_at"]).total_seconds()
        )
        # The run's helpers (its flush clock, its deadline) are started only if it needs
        # them, and ended before its ending is written: a run that needs neither costs
        # no task, no task group and no cancellation.
        helpers: list[_Helper] = []
        journal.start_flusher = functools.partial(self._start_helper, helpers, journal.run_flusher)
        if remaining is not None:
            if remaining <= 0:
                self._cancel(active, "deadline")  # claimed too late: never call the agent
            else:
                self._start_helper(helpers, functools.partial(self._deadline_watch, active, remaining))
        try:
            with active.scope, self._observer_scopes(ctx):
                try:
                    if active.reason is None:  # not already stopped or past its deadline
                        await self.agent(ctx)
                        status = "completed"
                except LeaseLost:
                    self._lost(run_id)
                except Exception as exc:
                    status = "failed"
                    error = _failure(exc)
                except asyncio.CancelledError as exc:
                    # Only runrow's own cancellations (a stop, a drain, a lost claim, the
                    # deadline: all through this run's scope) or the task's (shutdown)
                    # end a run as cancelled. Any other CancelledError is the agent's own
                    # (it awaited a future someone else cancelled): a failure like any
                    # other, or the run would sit "running" until the reaper.
                    if active.scope.cancel_called or _task_cancelling():
                        raise
                    status = "failed"
                    error = _agent_cancelled(exc)
                    log.warning(
                        "run %s: the agent raised CancelledError that runrow did not ask for; "
                        "failing the run (%s)",
                        run_id,
                        error["message"],
                        extra=extra,
                    )
        finally:
            journal.start_flusher = None
            if helpers:
                with anyio.CancelScope(shield=True):
                    for helper in helpers:
                        await helper.stop()
        # The agent is done: its slot can take the next run while this one's ending is
        # written (concurrency bounds agent calls; the finalize is one short statement).
        self._free_slot(active)
        if active.scope.cancelled_caught or (status is None and active.reason is not None):
            if active.reason == "cancel":
                status, error = "cancelled", None
            elif active.reason == "drain":
                status = "failed"
                error = {"type": "worker_shutdown", "message": "the worker shut down before the run finished"}
            elif active.reason == "deadline":
                status, error = "failed", dict(DEADLINE_ERROR)
        if active.reason == "lost" or status is None:
            self.stats["lost"] += 1
            log.warning("run %s: claim lost, standing down without writing", run_id, extra=extra)
            self._observe(lambda o: o.claim_lost(ctx))
            return
        # The task ends here; the ending writer reports back (see _finalize).
        self._finalize(active, status, error, functools.partial(self._ended, active, status, started, extra))

    def _ended(
        self, active: _Active, status: str, started: float, extra: dict[str, str], landed: bool
    ) -> None:
        """The run's ending landed (or failed for good): report it and let the run go.
        Called from the ending writer's task (or a retry's), not the run's."""
        try:
            took = _aio.now() - started
            ctx = active.ctx
            assert ctx is not None
            self._observe(lambda o: o.run_finished(ctx, status=status, seconds=took, recorded=landed))
            if landed:
                self.stats[status] += 1
                log.info("run %s %s", active.id, status, extra={**extra, "status": status})
            else:
                log.warning(
                    "run %s: ending %s not recorded (claim lost or database unreachable)",
                    active.id,
                    status,
                    extra=extra,
                )
        finally:
            self._release(active)

    def _observer_scopes(self, ctx: RunContext) -> contextlib.AbstractContextManager[object]:
        """The observers' scopes around one agent call, entered; none without observers
        (an ExitStack's exit costs measurably per run)."""
        if not self.observers:
            return contextlib.nullcontext()
        scopes = contextlib.ExitStack()
        try:
            for obs in self.observers:
                scopes.enter_context(obs.run_scope(ctx))
        except BaseException:
            scopes.close()
            raise
        return scopes

    def _start_helper(self, helpers: list[_Helper], fn: Callable[[], Awaitable[None]]) -> None:
        if self._tg is None:
            # Shutting down past the drain: the run is being cut; its ending writes any
            # pending text, and no clock needs to start now.
            return
        helper = _Helper()
        helpers.append(helper)
        self._tg.start_soon(helper.run, fn)

    async def _deadline_watch(self, active: _Active, seconds: float) -> None:
        await anyio.sleep(seconds)
        if not active.finishing:
            log.info("run %s passed its deadline; cancelling it", active.id, extra={"run_id": str(active.id)})
            self._cancel(active, "deadline")

    def _flushed(self, ctx: RunContext, rows: int, started: float) -> None:
        journal = ctx._journal
        if journal.flushes == 1:
            took = anyio.current_time() - started
            self._observe(lambda o: o.first_event(ctx, seconds=took))
        self._observe(lambda o: o.journal_flush(ctx, rows=rows))

    def _finalize(
        self,
        active: _Active,
        status: str,
        error: dict[str, Any] | None,
        done: Callable[[bool], None],
    ) -> None:
        """Hands the fenced terminal write to the ending writer; ``done(landed)`` is
        called exactly once: when it has landed, or failed for good, or at the latest
        ``finalize_timeout`` after the hand-over (a write still in flight then may yet
        land; the run is counted unrecorded, as the reaper would find it).

        The run's task does not wait for it: the writer calls back when the batch ends,
        so a run costs no wake-up after its write. A transient failure is retried by a
        task of its own (three attempts in all, within the same budget); a retry after
        an ambiguous failure is safe: if the first attempt committed, the fence makes the
        retry match nothing, and the worker then reads back whether the ending recorded
        is its own (counted, not lost) or someone else's.
        """
        active.finishing = True
        journal = active.journal
        assert journal is not None
        terminal: dict[str, Any] = {"status": status}
        if error is not None:
            terminal["error"] = error
        if active.reason == "cancel":
            terminal["reason"] = "stopped"
        elif active.reason == "deadline" and status == "failed":
            terminal["reason"] = "deadline_exceeded"
        if journal.broken is not None and not isinstance(journal.broken, LeaseLost):
            # A flush of unknown outcome: our seq numbering cannot be trusted. Let the
            # reaper (max(seq)+1) record the ending.
            self._unrecorded.add(active.id)
            done(False)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.finalize_timeout
        answer = _Answer(done, deadline)
        item: _FinalItem = (
            active.id,
            active.token,
            status,
            None if error is None else _json.dumps(error, "error"),
            journal.answer_text,
            journal.final_rows(terminal),
            answer,
        )

        def first_attempt(landed: bool | None, exc: BaseException | None) -> None:
            if answer.answered:
                return
            if exc is None and landed is None:  # never sent: its budget had run out
                self._finalize_failed(active, _OutOfTime(self.finalize_timeout), 1, answer)
            elif exc is None:
                self._finalize_landed(bool(landed), answer)
            elif isinstance(exc, _TRANSIENT) and not self._runs.closed:
                self._runs.start(self._finalize_again(active, item, exc, deadline, answer))
            else:  # rejected, or shutting down
                self._finalize_failed(active, exc, 1, answer)

        answer.timer = loop.call_at(
            deadline, self._finalize_failed, active, _OutOfTime(self.finalize_timeout), 0, answer
        )
        active.handed_over = True
        self._finalizer.hand_over(item, first_attempt)

    def _finalize_landed(self, landed: bool, answer: _Answer) -> None:
        if answer.answered:
            return
        if not landed:  # the fence matched nothing: someone else ended or took the run
            self.stats["lost"] += 1
        answer(landed)

    def _finalize_failed(self, active: _Active, exc: BaseException, attempt: int, answer: _Answer) -> None:
        if answer.answered:
            return
        extra = {"run_id": str(active.id), "worker_id": self.worker_id}
        if answer.sent:
            # The server has not answered the attempt in flight (a stalled network or
            # server: the statement's own server-side bound would have ended it in
            # time otherwise): it may yet commit. Say so, not "not recorded".
            log.warning(
                "finalize of run %s given up with an attempt unanswered: %s; it may yet land "
                "(the run then ends as written; if not, the reaper ends it)",
                active.id,
                exc,
                extra=extra,
            )
        elif isinstance(exc, _OutOfTime | WriterStopped):
            log.warning("finalize of run %s given up: %s", active.id, exc, extra=extra)
        elif isinstance(exc, _TRANSIENT):
            self._attempt_failed(active, attempt, exc)
        elif isinstance(exc, psycopg.Error):
            log.warning("finalize of run %s rejected: %s", active.id, describe(exc), extra=extra)
        else:
            log.error("finalize of run %s: unexpected error", active.id, exc_info=exc, extra=extra)
        self._unrecorded.add(active.id)
        answer(False)

    def _attempt_failed(self, active: _Active, attempt: int, exc: BaseException) -> None:
        self._db_trouble()
        log.warning(
            "finalize of run %s failed (attempt %d): %s",
            active.id,
            attempt,
            describe(exc),
            extra={"run_id": str(active.id), "worker_id": self.worker_id},
        )

    async def _finalize_again(
        self,
        active: _Active,
        item: _FinalItem,
        exc: BaseException,
        deadline: float,
        answer: _Answer,
    ) -> None:
        """Attempts 2 and 3 of a finalize whose first attempt failed, within its budget."""
        attempt = 1
        try:
            with anyio.CancelScope(shield=True, deadline=deadline) as bound:
                while isinstance(exc, _TRANSIENT) and attempt < 3:
                    self._attempt_failed(active, attempt, exc)
                    await anyio.sleep(0.2 * attempt)
                    attempt += 1
                    try:
                        landed = await self._finalizer.submit(item, caller_shielded=True)
                        if landed is None:  # not sent: no budget left for a server-side bound
                            exc = _OutOfTime(self.finalize_timeout)
                            break
                        if not landed:
                            # The fence matched nothing: maybe the failed attempt had
                            # committed and only its answer was lost.
                            landed = await self._ending_landed(item)
                            if landed:
                                log.info(
                                    "finalize of run %s: an earlier attempt had landed (its answer was lost)",
                                    active.id,
                                    extra={"run_id": str(active.id), "worker_id": self.worker_id},
                                )
                    except Exception as again:
                        exc = again
                        continue
                    self._finalize_landed(landed, answer)
                    return
            if bound.cancelled_caught:
                exc = _OutOfTime(self.finalize_timeout)
            self._finalize_failed(active, exc, attempt, answer)
        finally:
            if not answer.answered:  # the task was cancelled (shutdown past every budget)
                self._finalize_failed(active, WriterStopped("the dispatcher shut down"), attempt, answer)

    async def _ending_landed(self, item: _FinalItem) -> bool:
        run_id, token, status, _, _, rows, _ = item
        seq, _, payload = rows[-1]  # the terminal event
        try:
            async with statement_conn(self.pool) as conn:
                cur = await execute(
                    conn,
                    self._queries["ending_landed"],
                    {
                        "run_id": run_id,
                        "claim_token": token,
                        "status": status,
                        "seq": seq,
                        "payload": payload,
                    },
                )
                row = await cur.fetchone()
        except Exception as exc:  # the caller counts it as a failed attempt
            log.warning(
                "finalize of run %s: reading back whether an earlier attempt landed failed: %s",
                run_id,
                describe(exc),
                extra={"run_id": str(run_id), "worker_id": self.worker_id},
            )
            raise
        return bool(row and row[0])

    async def _flush_landed(self, run_id: uuid.UUID, token: uuid.UUID, seqs: list[int]) -> tuple[int, bool]:
        self._db_trouble()
        async with statement_conn(self.pool) as conn:
            cur = await execute(
                conn, self._queries["flush_landed"], {"run_id": run_id, "claim_token": token, "seqs": seqs}
            )
            row = await cur.fetchone()
        assert row is not None
        return int(row[0]), bool(row[1])

    def _db_trouble(self) -> None:
        """A statement failed for want of a connection: have the pool test its idle
        connections and replace dead ones (after a server restart they all are)."""
        now = anyio.current_time()
        if self._tg is None or now - self._last_pool_check < 1.0:
            return
        self._last_pool_check = now
        self._tg.start_soon(self._check_pool)

    async def _check_pool(self) -> None:
        try:
            await self.pool.check()
        except Exception as exc:  # pragma: no cover - best effort
            log.debug("pool check failed: %s", describe(exc), extra={"worker_id": self.worker_id})

    async def _append_batch(self, items: list[AppendItem]) -> list[bool]:
        events = _batch_json(
            {"run_id": str(run_id), "token": str(token), "seq": seq, "type": etype, "payload": payload}
            for run_id, token, rows in items
            for seq, etype, payload in rows
        )
        async with self._append_conn.statement() as conn:
            cur = await execute(
                conn,
                self._queries["append_events"],
                {
                    "events": events,
                    "events_prefix": self.channels.events_prefix,
                    "notify": self.journal_notify,
                },
            )
            landed = {r[0] for r in await cur.fetchall()}
        return [run_id in landed for run_id, _, _ in items]

    async def _finalize_batch(self, items: list[_FinalItem]) -> list[bool | None]:
        """Writes the endings whose budget leaves room for it (None for the others: not
        sent), under a server-side bound that ends the statement before the first of
        their budgets does: an ending given up is then dead on the server, never left
        waiting (e.g. on a row lock) to commit later.

        On the ending writer's own kept connection (runrow opened it: direct, JIT off for
        its session) the bound is a session setting, ``_session_budget``, set with the
        first finalize it carries; an ending that leaves at least that much of its budget
        (the usual case: sent as soon as it is handed over) then costs the finalize
        statement alone. Any other batch (budgets partly spent, a retry, the host's pool,
        a connection behind a transaction pooler) sets a tighter bound transaction-locally
        by a statement pipelined ahead of the finalize: same round trip, same implicit
        transaction (or runrow's own), nothing left on the connection afterwards."""
        now = asyncio.get_running_loop().time()
        margin = self._ending_margin
        fits = [i[6].deadline - now - margin >= 0.001 for i in items]
        sent = [i for i, ok in zip(items, fits, strict=True) if ok]
        if not sent:
            return [None] * len(items)
        # statement_timeout ends the statement, all its waits included; lock_timeout
        # also bounds the commit's wait for the NOTIFY queue's lock.
        left = min(i[6].deadline for i in sent) - now - margin
        runs = _batch_json(
            {"id": str(i[0]), "token": str(i[1]), "status": i[2], "error": i[3], "partial": i[4]}
            for i in sent
        )
        events = _batch_json(
            {"run_id": str(i[0]), "seq": seq, "type": etype, "payload": payload}
            for i in sent
            for seq, etype, payload in i[5]
        )
        params = {
            "runs": runs,
            "events": events,
            "events_prefix": self.channels.events_prefix,
            "wake_channel": self.channels.wake,
        }
        for i in sent:
            i[6].sent = True
        try:
            async with self._finalize_conn.statement() as conn:
                cur = conn.cursor()
                held = self._finalize_conn
                session = held.keeps(conn) and jit_off_session(conn) and left >= self._session_budget
                if session and held.carries(conn):
                    await cur.execute(self._queries["finalize"], params)
                elif session:
                    # The first ending on this kept connection: the session's bound goes
                    # with it. Marked first: if this fails (the bound is then rolled back
                    # with it), the connection is given back and the mark goes with it;
                    # however this ends, the bound comes off before the connection serves
                    # anything else.
                    held.session_changed(self._queries["ending_budget_unset"])
                    async with conn.pipeline():
                        await conn.execute(
                            self._queries["ending_budget_session"],
                            {"timeout": f"{int(self._session_budget * 1000)}ms"},
                        )
                        await cur.execute(self._queries["finalize"], params)
                else:
                    # (ending_budget also turns JIT off for the finalize: no guard here.)
                    async with conn.pipeline():
                        await conn.execute(
                            self._queries["ending_budget"], {"timeout": f"{int(left * 1000)}ms"}
                        )
                        await cur.execute(self._queries["finalize"], params)
                landed = {r[0] for r in await cur.fetchall()}
        finally:
            for i in sent:
                i[6].sent = False
        return [(i[0] in landed) if ok else None for i, ok in zip(items, fits, strict=True)]

    # -- losing a claim, cancelling ---------------------------------------------------

    def _lost(self, run_id: uuid.UUID) -> None:
        active = self._active.get(run_id)
        if active is not None and not active.finishing:
            self._cancel(active, "lost")

    def _cancel(self, active: _Active, reason: _Reason) -> None:
        # A lost claim trumps everything (nothing may be written); a stop trumps a drain
        # (the user asked for it: the run ends cancelled, not worker_shutdown).
        if active.reason is None or reason == "lost" or (reason == "cancel" and active.reason == "drain"):
            active.reason = reason
        if reason == "cancel" and active.ctx is not None:
            active.ctx.cancel_requested = True
        active.scope.cancel()

    async def _watch_cancels(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """The fast path of a stop: a NOTIFY with the run id, checked against the row."""
        assert self._hub is not None
        async with self._hub.subscribe(self.channels.cancel) as sub:
            task_status.started()
            while True:
                payload = await sub.receive()
                try:
                    run_id = uuid.UUID(payload)
                except ValueError:
                    continue  # RECONNECTED or noise: the heartbeat re-reads every flag
                active = self._active.get(run_id)
                if active is None:
                    self._remember_cancel(run_id)
                    continue
                if not active.finishing:
                    await self._check_cancel(active)

    def _remember_cancel(self, run_id: uuid.UUID) -> None:
        """Keeps a cancel hint for a run this process may be about to register (most are
        other workers' runs): for as long as a claim may take, and at most 1024 of them."""
        now = _aio.now()
        hints = self._unknown_cancels
        hints.pop(run_id, None)
        hints[run_id] = now  # (insertion order is arrival order)
        horizon = now - self.lease
        while hints:
            oldest = next(iter(hints))
            if hints[oldest] >= horizon and len(hints) <= 1024:
                break
            del hints[oldest]

    async def _check_cancel(self, active: _Active) -> None:
        """Reads the run's durable cancel flag (the NOTIFY is only a hint) and cancels it."""
        try:
            async with statement_conn(self.pool) as conn:
                cur = await execute(
                    conn, self._queries["cancel_flag"], {"run_id": active.id, "claim_token": active.token}
                )
                row = await cur.fetchone()
        except psycopg.Error as exc:
            log.warning(
                "cancel check for run %s failed: %s",
                active.id,
                describe(exc),
                extra={"run_id": str(active.id), "worker_id": self.worker_id},
            )
            return
        if row is not None and row[0] and not active.finishing:
            self._cancel(active, "cancel")

    # -- heartbeat and lease watchdog -------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            due = anyio.current_time() + self.heartbeat
            await anyio.sleep(self.heartbeat)
            self._beat_lag = max(0.0, anyio.current_time() - due)
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.heartbeat):
                await self.beat()

    async def beat(self) -> None:
        """One heartbeat for every run in flight (also the cancel-flag fallback)."""
        actives = [a for a in self._active.values() if not a.finishing]
        now = anyio.current_time()
        for a in actives:
            if now > a.lease_deadline:
                # Our lease has lapsed without a successful heartbeat: someone may have
                # reaped the run. Stop doing side effects; the fence decides the rest.
                log.warning(
                    "run %s: lease lapsed without a heartbeat, standing down",
                    a.id,
                    extra={"run_id": str(a.id), "worker_id": self.worker_id},
                )
                self._cancel(a, "lost")
        actives = [a for a in actives if a.reason != "lost"]
        if not actives:
            return
        try:
            async with statement_conn(self.pool) as conn:
                cur = await execute(
                    conn,
                    self._queries["heartbeat"],
                    {
                        "ids": [a.id for a in actives],
                        "tokens": [a.token for a in actives],
                        "lease_seconds": self.lease,
                        "now": None,
                    },
                )
                alive = {r[0]: r[1] for r in await cur.fetchall()}
        except (psycopg.Error, OSError) as exc:
            self._db_trouble()
            log.warning("heartbeat failed: %s", describe(exc), extra={"worker_id": self.worker_id})
            return
        lag = self._beat_lag
        self._observe(lambda o: o.heartbeat(runs=len(alive), lag=lag))
        for a in actives:
            if a.id not in alive:
                if not a.finishing:
                    self._lost(a.id)
            else:
                a.lease_deadline = now + self.lease
                if alive[a.id] and a.reason is None:
                    self._cancel(a, "cancel")

    # -- the reaper -------------------------------------------------------------------

    async def _reaper_loop(self) -> None:
        while True:
            try:
                with anyio.CancelScope(shield=True), anyio.fail_after(max(self.poll, 5.0)):
                    await self.reap()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                log.warning("reaper pass failed: %s", describe(exc), extra={"worker_id": self.worker_id})
            await anyio.sleep(self.reap_interval)

    async def reap(self, *, now: Any = None, limit: int = 100) -> list[uuid.UUID]:
        """One reaper pass; returns the ids it failed (or cancelled, if a stop was pending)."""
        return await reap_expired(
            self.pool,
            schema=self.schema,
            grace=self.grace,
            now=now,
            limit=limit,
            on_reaped=self._count_reaped,
            reaper_id=self.worker_id,
        )

    def _count_reaped(self, n: int) -> None:
        self.stats["reaped"] += n
        if n:
            self._observe(lambda o: o.reaped(count=n))
        if n:
            self._waker.set()


def _failure(exc: BaseException) -> dict[str, str]:
    """The error recorded for an agent that raised ``exc``: its type and message, made
    storable whatever the message holds (jsonb refuses NUL; UTF-8, lone surrogates)."""
    try:
        message = str(exc)[:2000]
    except Exception:  # an exception whose __str__ itself fails
        message = f"<{type(exc).__name__} with an unprintable message>"
    message = message.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    return {"type": type(exc).__name__, "message": message}


def _task_cancelling() -> bool:
    """Whether this task itself is being cancelled (``Task.cancel()``, e.g. at shutdown)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _agent_cancelled(exc: BaseException) -> dict[str, str]:
    """The error recorded for an agent that raised a CancelledError runrow did not ask for."""
    detail = _failure(exc)["message"]
    return {
        "type": "agent_cancelled",
        "message": "the agent raised CancelledError without the run being cancelled "
        "(did it await something another task cancelled?)" + (f": {detail}" if detail else ""),
    }


def _batch_json(rows: Iterable[dict[str, Any]]) -> str:
    """A batch as one JSON array of objects, the shape jsonb_to_recordset() reads. (The
    values are ids, numbers and text already checked for jsonb; payloads travel as text.)"""
    return json.dumps(list(rows), ensure_ascii=False, separators=(",", ":"))


async def reap_expired(
    db: AsyncConnectionPool[AsyncConnection] | AsyncConnection | str,
    *,
    schema: str = DEFAULT_SCHEMA,
    grace: float = 30.0,
    now: Any = None,
    limit: int = 100,
    on_reaped: Any = None,
    reaper_id: str | None = None,
) -> list[uuid.UUID]:
    """Ends runs whose lease lapsed more than ``grace`` seconds ago (see :class:`Dispatcher`)."""
    channels = Channels.for_schema(schema)
    reaped: list[uuid.UUID] = []

    async def reap(ids: list[uuid.UUID]) -> list[tuple[Any, ...]]:
        params = {
            "ids": ids,
            "now": now,
            "grace_seconds": grace,
            "events_prefix": channels.events_prefix,
            "wake_channel": channels.wake,
        }
        async with statement_conn(db) as conn:
            cur = await execute(conn, _sql.statement("reap", schema), params)
            return await cur.fetchall()

    while True:
        async with statement_conn(db) as conn:
            cur = await execute(
                conn,
                _sql.statement("reap_candidates", schema),
                {"now": now, "grace_seconds": grace, "limit": limit},
            )
            ids = [r[0] for r in await cur.fetchall()]
        if not ids:
            break
        try:
            rows = await reap(ids)
        except psycopg.errors.UniqueViolation:
            # A dying worker's last append raced one run's terminal event (same seq). That
            # run must not hold back the others: each goes again alone (a fresh snapshot
            # sees the append, so the victim usually goes through too; if not, next pass).
            rows = []
            for one in ids if len(ids) > 1 else []:
                with contextlib.suppress(psycopg.errors.UniqueViolation):
                    rows.extend(await reap([one]))
            if not rows:
                break
        for run_id, conversation_id, status, worker_id, _, _ in rows:
            reaped.append(run_id)
            log.warning(
                "reaped run %s (worker %s lost): %s",
                run_id,
                worker_id,
                status,
                extra={
                    "run_id": str(run_id),
                    "conversation_id": conversation_id,
                    "lost_worker_id": worker_id,
                    "worker_id": reaper_id,
                },
            )
        if on_reaped is not None:
            on_reaped(len(rows))
        if len(ids) < limit:
            break
    return reaped
