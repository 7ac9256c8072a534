"""The claimer: takes runs for free slots, one claim statement at a time.

Slots come before claims: a process with no free slot never claims, and one claim
takes up to as many runs as there are free slots (at most one per conversation). It
claims again at once after a claim that took runs, and otherwise parks until a wake-up
(a NOTIFY on the schema's wake channel, or a run of its own ending) or the poll tick.

A run that ends hands its slot back here at once, and this loop claims for it while the
ending is written on another connection: the next run does not wait for the ending to
commit. With ``claim_with_endings`` the slot rides with the ending instead, and the
ending writer claims for it in the ending's own transaction (see ``ending.py``): one
commit, not two, and this loop claims only for the slots left free (at start, after an
idle spell, after a claim that came back short).
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

    from .._gateway.claims import ClaimedRun
    from .._hub import NotifyHub
    from .flight import ActiveRun
    from .kit import Kit
    from .roster import Roster

log = logging.getLogger("runrow.dispatcher")


class Claimer:
    """The claim loop and the wake-ups that drive it (two services)."""

    def __init__(self, kit: Kit, roster: Roster, start: Callable[[ClaimedRun], None]) -> None:
        self._settings = kit.settings
        self._roster = roster
        self._stats = kit.stats
        self._observe = kit.observe
        self._signals = kit.signals
        self._start = start
        self._db_trouble = kit.db_trouble
        self._extra = kit.extra
        # The claim loop keeps one pooled connection: its prepared statement stays warm
        # (a statement reaches its cached generic plan only after several executions on
        # one connection, and the pool hands connections out in turn), and no pool round
        # trip per claim.
        self._conn = HeldConnection(kit.pool, min_pool=2, idle_seconds=kit.settings.tx_idle_seconds)
        self.stopping = False
        """Set by the dispatcher's drain before it cancels the loop."""
        # Whether the next claim carries the rate-limit steps: not after a claim whose
        # runs said no limit was defined (ClaimedRun.limited). The claim without them
        # takes nothing while a limit is defined, so an empty one is sent again in full.
        self._limits = True

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
        slots, waker = self._roster.slots, self._roster.waker
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
            self._adopt(rows, want - len(rows))
            if not rows:
                # Nothing to claim now: park until a wake-up or the poll tick. (A claim
                # that came back short but not empty is followed by another at once:
                # a fair batch can be short while runs remain, e.g. after a lock race.)
                await waker.wait(poll)

    def _adopt(self, rows: list[ClaimedRun], unused: int) -> None:
        """Makes the claimed runs this process's and starts them (no await in between:
        nothing can run between a claim's answer and this); gives ``unused`` slots back."""
        self._roster.take(rows, self._settings.lease)
        for _ in range(unused):
            self._roster.slots.release()
        for row in rows:
            self._start(row)

    def request(self, limit: int) -> claims.ClaimRequest:
        """This dispatcher's claim of up to ``limit`` runs."""
        s = self._settings
        return claims.ClaimRequest(
            s.claim_order,
            limit,
            s.lease,
            s.worker_id,
            s.retry_stamp,
            version=s.version,
            same_version=s.resume_policy == "same_version",
            agent_keys=s.agent_keys,
            serves_default=s.serves_default,
            tree_cap=s.max_running_per_tree,
            limits=self._limits,
        )

    def may_fold(self) -> bool:
        """Whether the ending writer may claim with its endings: not once a drain began."""
        return not self.stopping

    def folded(self, riders: list[ActiveRun], rows: list[ClaimedRun], took: float) -> None:
        """A claim made with the endings of ``riders`` came back with ``rows``: the slots
        those runs held pass to the claimed runs; the rest are given back. Called by the
        ending writer once the claim's transaction committed, before any of the endings'
        callbacks (so the roster is never empty in between)."""
        self._roster.pass_slots(riders)  # each slot now goes to a claimed run, or back below
        self._counted(rows, took)
        self._adopt(rows, len(riders) - len(rows))

    def folded_empty(self) -> None:
        """A claim made with endings took nothing (or did not land): the next claim is
        sent whole, since the claim without the rate-limit steps takes nothing once a limit
        is defined (the claim loop would otherwise send both, one after the other)."""
        self._limits = True

    def _counted(self, rows: list[ClaimedRun], took: float) -> None:
        self._limits = rows[0].limited if rows else True
        self._stats["claims"] += 1
        self._stats["claimed"] += len(rows)
        if self._observe and rows:
            self._observe(lambda o: o.claimed(count=len(rows), seconds=took))
        if self._signals is not None and rows:
            self._signals.claimed.fire([r.id for r in rows])

    async def _claim(self, limit: int) -> list[ClaimedRun]:
        t0 = _aio.now()
        async with self._conn.statement() as conn:
            rows = await claims.run(conn, self._settings.schema, self.request(limit))
            if not rows and not self._limits:
                # (empty: maybe a limit was defined since; the full claim says)
                rows = await claims.run(
                    conn, self._settings.schema, self.request(limit)._replace(limits=True)
                )
        self._counted(rows, _aio.now() - t0)
        return rows

    async def forward_wakes(self, hub: NotifyHub, *, task_status: TaskStatus[None]) -> None:
        """Turns the wake channel's notifications into wake-ups (service ``wakes``)."""
        async with hub.subscribe(self._settings.channels.wake) as sub:
            task_status.started()
            while True:
                await sub.receive()
                self._roster.waker.set()
