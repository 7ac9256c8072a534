"""The claimer: takes runs for free slots, one claim statement at a time.

Slots come before claims: a process with no free slot never claims, and one claim
takes up to as many runs as there are free slots (at most one per conversation). It
claims again at once after a claim that took runs, and otherwise parks until a wake-up
(a NOTIFY on the schema's wake channel, or a run of its own ending) or the poll tick.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import psycopg

from .. import _aio
from .._db import HeldConnection, describe
from .._gateway import claims

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskStatus
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    from .._gateway.claims import ClaimedRun
    from .._hub import NotifyHub
    from .._observe import Observers
    from .roster import Roster
    from .settings import Settings

log = logging.getLogger("runrow.dispatcher")


class Claimer:
    """The claim loop and the wake-ups that drive it (two services)."""

    def __init__(
        self,
        settings: Settings,
        roster: Roster,
        pool: Callable[[], AsyncConnectionPool[AsyncConnection]],
        stats: dict[str, int],
        observe: Observers,
        start: Callable[[ClaimedRun], None],
        db_trouble: Callable[[], None],
    ) -> None:
        self._settings = settings
        self._roster = roster
        self._stats = stats
        self._observe = observe
        self._start = start
        self._db_trouble = db_trouble
        self._extra = {"worker_id": settings.worker_id}
        # The claim loop keeps one pooled connection: its prepared statement stays warm
        # (a statement reaches its cached generic plan only after several executions on
        # one connection, and the pool hands connections out in turn), and no pool round
        # trip per claim.
        self._conn = HeldConnection(pool, min_pool=2)
        self.stopping = False
        """Set by the dispatcher's drain before it cancels the loop."""

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        """The claim loop (service ``claimer``). Cancelling it stops claiming; a claim in
        flight still finishes and its runs start."""
        task_status.started()
        try:
            await self._claim_until_cancelled()
        finally:
            with anyio.CancelScope(shield=True):
                await self._conn.release()

    async def _claim_until_cancelled(self) -> None:
        roster, slots, waker = self._roster, self._roster.slots, self._roster.waker
        concurrency, poll = self._settings.concurrency, self._settings.poll
        backoff = 0.05
        while not self.stopping:
            await slots.acquire()
            want = 1
            while want < concurrency and slots.value > 0:
                slots.acquire_nowait()
                want += 1
            waker.clear()
            try:
                # Shielded: a claim the server committed must reach us, or its runs
                # would sit "running" with no worker until the reaper failed them.
                # (One scope that is both shield and bound: cheaper than two.)
                with anyio.CancelScope(shield=True, deadline=_aio.now() + self._settings.lease / 2) as bound:
                    rows = await self._claim(want)
                if bound.cancelled_caught:
                    raise TimeoutError("claim did not finish in time")
                backoff = 0.05
            except psycopg.errors.UniqueViolation:
                # Another claimer won a conversation's turn: claim nothing this round.
                self._stats["claim_conflicts"] += 1
                rows = []
                waker.set()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                for _ in range(want):
                    slots.release()
                self._db_trouble()
                log.warning("claim failed: %s", describe(exc), extra=self._extra)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, poll)
                continue
            roster.take(rows, self._settings.lease)
            for _ in range(want - len(rows)):
                slots.release()
            for row in rows:
                self._start(row)
            if not rows:
                # Nothing to claim now: park until a wake-up or the poll tick. (A claim
                # that came back short but not empty is followed by another at once:
                # a fair batch can be short while runs remain, e.g. after a lock race.)
                await waker.wait(poll)

    async def _claim(self, limit: int) -> list[ClaimedRun]:
        t0 = _aio.now()
        s = self._settings
        async with self._conn.statement() as conn:
            rows = await claims.claim(
                conn,
                s.schema,
                order=s.claim_order,
                limit=limit,
                lease_seconds=s.lease,
                worker_id=s.worker_id,
                retry_policy=s.retry_stamp,
            )
        self._stats["claims"] += 1
        self._stats["claimed"] += len(rows)
        if self._observe and rows:
            took = _aio.now() - t0
            self._observe(lambda o: o.claimed(count=len(rows), seconds=took))
        return rows

    async def forward_wakes(self, hub: NotifyHub, *, task_status: TaskStatus[None]) -> None:
        """Turns the wake channel's notifications into wake-ups (service ``wakes``)."""
        async with hub.subscribe(self._settings.channels.wake) as sub:
            task_status.started()
            while True:
                await sub.receive()
                self._roster.waker.set()
