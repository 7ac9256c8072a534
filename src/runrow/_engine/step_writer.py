"""The step writer: the step writes of many runs (begun markers, outcomes, waits), and
their transcript messages, in one transaction and one commit when they coincide (its
loop is service ``steps``).

A step write is awaited as before: the agent goes on only once it has committed. What
changes is who shares the commit: a step write that arrives while a batch is in flight
rides the next one, with every other run's, so runs in flight pay one commit per
round trip between them instead of one per write (the journal's appender does the same
for events). Each write is its own fenced statement, so one run's lost claim fences only
its own; a batch the server refuses is sent again write by write (see groupcommit.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import psycopg

from .._db import HeldConnection, out_of_budget
from .._gateway._exec import Plan, run, run_together
from .groupcommit import GroupCommit

if TYPE_CHECKING:
    import uuid
    from collections.abc import Awaitable, Callable

    from anyio.abc import TaskStatus

    from .flight import RunHost
    from .kit import Kit

log = logging.getLogger("runrow.run")

TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError, TimeoutError)
"""Failures after which a step statement is sent again (every one is safe to repeat)."""


class StepWriter:
    """Group-commits step writes, each given as a function that makes its plan (a plan of
    one statement; a batch sent again write by write makes each plan afresh)."""

    def __init__(self, kit: Kit) -> None:
        # Kept between batches, as the appender's (see HeldConnection).
        self.conn = HeldConnection(kit.pool, min_pool=8, idle_seconds=kit.settings.tx_idle_seconds)
        # A step write's budget is half the lease (see Steps._retrying): no batch outlasts it.
        self.writer: GroupCommit[Callable[[], Plan[Any]], Any] = GroupCommit(
            self._write_batch, timeout=kit.settings.lease / 2
        )

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        """The group-commit loop."""
        task_status.started()
        await self.writer.run()

    async def close(self) -> None:
        """Gives the kept connection back (at shutdown)."""
        await self.conn.release()

    async def write(self, plan: Callable[[], Plan[Any]]) -> Any:
        """Writes one step statement with the next batch; what it returned. The caller
        bounds the wait (and shields it from a stop: see Steps._write)."""
        return await self.writer.submit(plan, caller_shielded=True)

    def hand_over(
        self, plan: Callable[[], Plan[Any]], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """Queues one step statement with the next batch without waiting; ``done`` gets
        its outcome (see GroupCommit.hand_over)."""
        self.writer.hand_over(plan, done)

    async def _write_batch(self, plans: list[Callable[[], Plan[Any]]]) -> list[Any]:
        async with self.conn.statement() as conn:
            if len(plans) == 1:  # (alone, plainly: a pipeline costs more for one statement)
                return [await run(conn, plans[0]())]
            return await run_together(conn, [make() for make in plans])


async def retrying(host: RunHost, run_id: uuid.UUID, call: Callable[[], Awaitable[Any]]) -> Any:
    """Runs ``call`` (a step statement of run ``run_id``), sending it again after a
    transient failure for up to half the lease."""
    budget = host.settings.lease / 2
    deadline = anyio.current_time() + budget
    delay = 0.05
    while True:
        try:
            with anyio.fail_after(max(deadline - anyio.current_time(), delay)):
                return await call()
        except TRANSIENT as exc:
            if anyio.current_time() + delay > deadline:
                if (named := out_of_budget(exc, "a step's record (run.step)", budget)) is not None:
                    raise named from exc
                raise
            host.db_trouble()
            log.info("step write of run %s failed; sending it again", run_id)
        await anyio.sleep(delay)
        delay = min(delay * 2, 1.0)
