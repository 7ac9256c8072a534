"""The schedule firer: every dispatcher fires due schedules (service ``schedules``).

It wakes when the earliest unpaused schedule is due, or after ``poll`` at the latest (a
schedule added or resumed meanwhile is found by then), and fires every due schedule,
one transaction each (``_schedules.fire_due_op``: exactly once per tick across any
number of workers; a fire that dies rolls back whole and another worker fires it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from .. import _schedules
from .._db import describe, perform, statement_conn
from .._gateway import schedules as _gw
from .._gateway._exec import run

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from .kit import Kit

log = logging.getLogger("runrow.dispatcher")

# The shortest wait between passes: a due schedule that another worker holds locked is
# not spun on.
_MIN_WAIT = 0.2


class ScheduleFirer:
    """Fires due schedules, then sleeps until the next is due (at most ``poll``)."""

    def __init__(self, kit: Kit) -> None:
        self._kit = kit

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        """The loop (service ``schedules``)."""
        task_status.started()
        poll = self._kit.settings.poll
        while True:
            # Shielded (and bounded): a stop waits for a pass's statements rather than cut
            # one, which would close its connection (a cancelled query is a broken one).
            wait = poll
            with anyio.CancelScope(shield=True), anyio.move_on_after(max(poll, 5.0)):
                wait = await self.fire_due()
            await anyio.sleep(wait)

    async def fire_due(self) -> float:
        """One pass: fires every due schedule; returns the seconds to wait for the next."""
        s, pool = self._kit.settings, self._kit.pool()
        passing: set[str] = set()
        try:
            while (
                fired := await perform(pool, s.schema, _schedules.fire_due_op(s.schema, passing=passing))
            ) is not None:
                if fired.unreadable is not None:
                    passing.add(fired.name)  # left for a worker that can read it
                    log.warning(
                        "schedule %s cannot be fired here: %s",
                        fired.name,
                        fired.unreadable,
                        extra=self._kit.extra,
                    )
                    continue
                log.debug(
                    "schedule %s fired %d tick(s), skipped %d",
                    *(fired.name, len(fired.runs), len(fired.skipped)),
                    extra=self._kit.extra,
                )
            async with statement_conn(pool) as conn:
                until = await run(conn, _gw.seconds_to_next(s.schema, passing=sorted(passing)))
        except Exception as exc:  # a fire that failed rolled back: the next pass retries it
            log.warning("firing schedules failed: %s", describe(exc), extra=self._kit.extra)
            return s.poll
        return s.poll if until is None else max(_MIN_WAIT, min(until, s.poll))
