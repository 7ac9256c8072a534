"""The lease keeper: heartbeats, the lease watchdog and the cancel watcher.

One batched heartbeat rolls the lease of every run this process holds (and re-reads
their stop flags: the fallback for a lost NOTIFY). A run whose lease lapsed without a
heartbeat is stood down before anything else of it is written. A stop reaches a
running run fast through a NOTIFY on the cancel channel, which is only a hint: the
keeper reads the run's durable flag before it cancels anything.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import TYPE_CHECKING

import anyio
import psycopg

from .. import _aio
from .._db import HeldConnection, describe, statement_conn
from .._gateway import lease as _lease
from .._gateway._exec import run

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from .._hub import NotifyHub
    from .flight import ActiveRun
    from .kit import Kit
    from .roster import Roster

log = logging.getLogger("runrow.dispatcher")

# How many cancel hints for runs not (yet) this process's are kept, at most.
_MAX_HINTS = 1024


class LeaseKeeper:
    """Keeps this process's claims alive, and stops the runs that lost theirs or were stopped."""

    def __init__(self, kit: Kit, roster: Roster, beat_conn: HeldConnection) -> None:
        self._settings = kit.settings
        self._roster = roster
        self._pool = kit.pool
        self._beat_conn = beat_conn  # kept for the heartbeat (see parts.py)
        self._observe = kit.observe
        self._tasks = kit.tasks
        self._db_trouble = kit.db_trouble
        self._extra = kit.extra
        self._beat_lag = 0.0
        # Cancel hints for run ids not (yet) ours, by arrival time: a stop that commits
        # between a claim and the registration of its runs must not be lost.
        self._hints: dict[uuid.UUID, float] = {}

    # -- heartbeat and watchdog -------------------------------------------------------

    async def heartbeats(self, *, task_status: TaskStatus[None]) -> None:
        """One heartbeat every ``heartbeat`` seconds (service ``heartbeat``)."""
        task_status.started()
        every = self._settings.heartbeat
        with contextlib.suppress(psycopg.Error, OSError, TimeoutError), anyio.move_on_after(every):
            await self._beat_conn.take()  # (if not now, at the first heartbeat)
        while True:
            due = anyio.current_time() + every
            await anyio.sleep(every)
            self._beat_lag = max(0.0, anyio.current_time() - due)
            with anyio.CancelScope(shield=True), anyio.move_on_after(every):
                await self.beat()

    async def beat(self) -> None:
        """One heartbeat for every run in flight (also the cancel-flag fallback)."""
        roster = self._roster
        actives = [a for a in roster.runs.values() if not a.finishing]
        now = anyio.current_time()
        for a in actives:
            if now > a.lease_deadline:
                # Our lease has lapsed without a successful heartbeat: someone may have
                # reaped the run. Stop doing side effects; the fence decides the rest.
                log.warning(
                    "run %s: lease lapsed without a heartbeat, standing down",
                    a.id,
                    extra={"run_id": str(a.id), **self._extra},
                )
                roster.cancel(a, "lost")
        actives = [a for a in actives if a.reason != "lost"]
        if not actives:
            return
        s = self._settings
        try:
            async with self._beat_conn.statement() as conn:
                alive = await run(
                    conn,
                    _lease.heartbeat(s.schema, [(a.id, a.token) for a in actives], lease_seconds=s.lease),
                )
        except (psycopg.Error, OSError) as exc:
            self._db_trouble()
            log.warning("heartbeat failed: %s", describe(exc), extra=self._extra)
            return
        lag = self._beat_lag
        self._observe(lambda o: o.heartbeat(runs=len(alive), lag=lag))
        for a in actives:
            if a.id not in alive:
                if not a.finishing:
                    roster.lost(a.id)
            else:
                roster.renewed(a, now + s.lease)
                if alive[a.id] and a.reason is None:
                    roster.cancel(a, "cancel")

    # -- stops ------------------------------------------------------------------------

    async def watch_cancels(self, hub: NotifyHub, *, task_status: TaskStatus[None]) -> None:
        """The fast path of a stop: a NOTIFY with the run id, checked against the row
        (service ``cancels``)."""
        async with hub.subscribe(self._settings.channels.cancel) as sub:
            task_status.started()
            while True:
                payload = await sub.receive()
                try:
                    run_id = uuid.UUID(payload)
                except ValueError:
                    continue  # RECONNECTED or noise: the heartbeat re-reads every flag
                active = self._roster.runs.get(run_id)
                if active is None:
                    self._remember(run_id)
                    continue
                if not active.finishing:
                    await self.check_cancel(active)

    def adopt(self, active: ActiveRun) -> None:
        """A run just claimed: if a cancel hint came before we knew it (a stop committed
        right after the claim), check its row now, as the watcher would have."""
        if active.reason is None and self._hints.pop(active.id, None) is not None:
            self._tasks.start(self.check_cancel(active))

    def _remember(self, run_id: uuid.UUID) -> None:
        """Keeps a cancel hint for a run this process may be about to register (most are
        other workers' runs): for as long as a claim may take, and at most 1024 of them."""
        now = _aio.now()
        hints = self._hints
        hints.pop(run_id, None)
        hints[run_id] = now  # (insertion order is arrival order)
        horizon = now - self._settings.lease
        while hints:
            oldest = next(iter(hints))
            if hints[oldest] >= horizon and len(hints) <= _MAX_HINTS:
                break
            del hints[oldest]

    async def check_cancel(self, active: ActiveRun) -> None:
        """Reads the run's durable cancel flag (the NOTIFY is only a hint) and cancels it."""
        try:
            async with statement_conn(self._pool()) as conn:
                requested = await run(
                    conn, _lease.cancel_requested(self._settings.schema, active.id, active.token)
                )
        except psycopg.Error as exc:
            log.warning(
                "cancel check for run %s failed: %s",
                active.id,
                describe(exc),
                extra={"run_id": str(active.id), **self._extra},
            )
            return
        if requested and not active.finishing:
            self._roster.cancel(active, "cancel")
