"""A running dispatcher's parts, wired together: the services and their shared state."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from .._db import HeldConnection
from .claimer import Claimer
from .ending import EndingWriter
from .executor import Executor
from .journal_writer import Appender
from .lease import LeaseKeeper
from .reaper import Reaper
from .registry import Registry
from .roster import Roster
from .schedules import ScheduleFirer
from .schema_watch import SchemaWatch
from .service import Services
from .step_writer import StepWriter
from .webhooks import DeliveryService, available

if TYPE_CHECKING:
    import uuid
    from collections.abc import Callable, Mapping
    from typing import Any

    from anyio.abc import TaskGroup
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    from .._gateway._exec import Plan
    from .._gateway.claims import ClaimedRun
    from .._hub import NotifyHub
    from .context import Agent
    from .flight import Park
    from .kit import Kit, PoolCheck
    from .settings import Settings


# The pool size from which the heartbeat and the reaper keep a connection each (below
# it, they take a pooled connection per statement, as the runs do).
UPKEEP_MIN_POOL = 7


class Host:
    """The narrow handle a run's context and step book get on the engine (see
    ``flight.RunHost``)."""

    __slots__ = ("_kit", "_roster", "_steps")

    def __init__(self, kit: Kit, roster: Roster, steps: StepWriter) -> None:
        self._kit = kit
        self._roster = roster
        self._steps = steps

    @property
    def settings(self) -> Settings:
        return self._kit.settings

    def pool(self) -> AsyncConnectionPool[AsyncConnection]:
        return self._kit.pool()

    def lost(self, run_id: uuid.UUID) -> None:
        self._roster.lost(run_id)

    def park(self, run_id: uuid.UUID, park: Park) -> None:
        self._roster.park(run_id, park)

    def db_trouble(self) -> None:
        self._kit.db_trouble()

    async def write_together(self, plan: Callable[[], Plan[Any]]) -> Any:
        return await self._steps.write(plan)

    def hand_over_together(
        self, plan: Callable[[], Plan[Any]], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        self._steps.hand_over(plan, done)


class Parts:
    """One running dispatcher's services and their shared state, wired together."""

    def __init__(self, kit: Kit, agents: Mapping[str | None, Agent]) -> None:
        self.kit = kit
        self.services = Services()
        self.roster = roster = Roster(kit.settings.concurrency)
        self.appender = Appender(kit)
        self.steps = StepWriter(kit)
        self.claimer = Claimer(kit, roster, self._start)
        # The slots that endings free go to the claim loop at once, or (claim_with_endings)
        # the ending writer claims for them in the endings' transaction (see ending.py).
        self.endings = EndingWriter(kit, roster, self.claimer if kit.settings.claim_with_endings else None)
        # The heartbeat and the reaper each keep a connection: keeping claims alive and
        # ending abandoned runs never wait behind the runs' own statements for a pooled
        # connection (a pool that busy would cost leases), nor behind each other.
        self.beat_conn = HeldConnection(
            kit.pool, min_pool=UPKEEP_MIN_POOL, idle_seconds=kit.settings.tx_idle_seconds
        )
        self.reap_conn = HeldConnection(
            kit.pool, min_pool=UPKEEP_MIN_POOL, idle_seconds=kit.settings.tx_idle_seconds
        )
        self.lease = LeaseKeeper(kit, roster, self.beat_conn)
        self.reaper = Reaper(kit, roster, self.reap_conn)
        self.schema_watch = SchemaWatch(kit, roster, self.stop_claiming)
        self.registry = Registry(kit, roster, agents)
        self.schedules = ScheduleFirer(kit)
        # (Only with runrow[webhooks] installed: see webhooks.py.)
        self.webhooks = DeliveryService(kit) if available() else None
        self.executor = Executor(
            kit, roster, agents, self.endings, self.appender, Host(kit, roster, self.steps)
        )

    async def start(self, tg: TaskGroup, pool_check: PoolCheck, hub: NotifyHub | None) -> None:
        """Starts the services, the claim loop last (every run it starts has them all)."""
        services = self.services
        await services.start(tg, "appends", self.appender.run)
        await services.start(tg, "steps", self.steps.run)
        await services.start(tg, "endings", self.endings.run)
        await services.start(tg, "heartbeat", self.lease.heartbeats)
        await services.start(tg, "reaper", self.reaper.run)
        await services.start(tg, "pool-check", pool_check.run)
        await services.start(tg, "schema-watch", self.schema_watch.run)
        await services.start(tg, "registry", self.registry.run)
        await services.start(tg, "schedules", self.schedules.run)
        if self.webhooks is not None:
            await services.start(tg, "webhooks", self.webhooks.run)
        if hub is not None:
            await services.start(tg, "wakes", functools.partial(self.claimer.forward_wakes, hub))
            await services.start(tg, "cancels", functools.partial(self.lease.watch_cancels, hub))
        await services.start(tg, "claimer", self.claimer.run)

    def _start(self, row: ClaimedRun) -> None:
        self.lease.adopt(self.roster.runs[row.id])
        self.executor.start(row)

    async def stop_claiming(self) -> None:
        """Stops claiming: no claim of the loop's, none folded into an ending (a claim in
        flight finishes and its runs start)."""
        self.claimer.stopping = True
        await self.services.stop("claimer", timeout=self.kit.settings.lease / 2 + 1)

    async def close(self) -> None:
        """Leaves the worker registry and gives back the connections the parts keep (at
        shutdown)."""
        await self.registry.leave()
        await self.endings.close()
        await self.appender.close()
        await self.steps.close()
        await self.beat_conn.release()
        await self.reap_conn.release()
