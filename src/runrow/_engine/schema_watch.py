"""The schema watch: a dispatcher that finds its schema migrated past its own runrow
stops claiming.

During a rolling upgrade, ``runrow migrate`` runs before every process has the new
release. Migrations expand before they contract (docs/howto/upgrading.md), so the old
release's writes still land: the runs it holds can end. But the new release's
workers are the ones meant to take the queue from here, and an old worker that kept
claiming would hold runs through the rest of the rollout (and through any later,
contracting migration that it would not survive). So once a heartbeat's read finds the
schema ahead, the dispatcher stops claiming, finishes what it holds (its heartbeat,
ending writer and reaper keep going) and says so in one log line.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from .._db import describe, statement_conn
from .._gateway import schema as _schema
from .._gateway._exec import run

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import TaskStatus

    from .kit import Kit
    from .roster import Roster

log = logging.getLogger("runrow.dispatcher")


class SchemaWatch:
    """Reads the schema's version once a heartbeat; stops claiming when it is ahead."""

    def __init__(self, kit: Kit, roster: Roster, stop_claiming: Callable[[], Awaitable[None]]) -> None:
        self._settings = kit.settings
        self._pool = kit.pool
        self._roster = roster
        self._stop_claiming_now = stop_claiming

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        """The watch (service ``schema-watch``): ends once it has stopped the claims."""
        task_status.started()
        expected = _schema.latest_version()
        while True:
            await anyio.sleep(self._settings.heartbeat)
            found = None
            try:
                # Shielded, as every service's statements: a stop lands at the sleep. A
                # query cut by anyio's cancellation cannot be cancelled cleanly on the
                # server (the cancellation interrupts psycopg's own cancel request too),
                # so the connection would be closed, with a warning, at every such stop.
                with anyio.CancelScope(shield=True), anyio.move_on_after(max(self._settings.heartbeat, 1.0)):
                    async with statement_conn(self._pool()) as conn:
                        found = await run(conn, _schema.version(self._settings.schema))
            except Exception as exc:  # a hint like any other: the next beat reads again
                log.debug("schema version read failed: %s", describe(exc), extra=self._extra)
                continue
            if found is not None and found > expected:
                await self._stop_claiming(found, expected)
                return

    async def _stop_claiming(self, found: int, expected: int) -> None:
        s = self._settings
        await self._stop_claiming_now()  # as the drain's first phase
        log.warning(
            "dispatcher %s stopped claiming: schema %r is at version %d, ahead of this runrow "
            "(version %d); finishing the %d run(s) it holds. Upgrade runrow on this host.",
            *(s.worker_id, s.schema, found, expected, len(self._roster.runs)),
            extra=self._extra,
        )

    @property
    def _extra(self) -> dict[str, str]:
        return {"worker_id": self._settings.worker_id}
