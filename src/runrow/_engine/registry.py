"""The worker registry: each dispatcher's row in ``worker``, for deploys to watch.

The dispatcher registers as it starts (before it claims), rolls its row once a heartbeat
(one statement: the time, its lease's expiry and its runs in flight), and deletes it on a
clean stop. A dispatcher that dies leaves its row to the reaper of any live one, once its
lease lapsed more than ``grace`` ago (``Reaper.reap``), as its runs are. The registry is
what a deploy reads (``runrow workers``); nothing in the engine depends on it, so a write
that fails is logged and tried again at the next beat, never fatal.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from typing import TYPE_CHECKING, Any

import anyio
import psycopg

from .._db import describe, statement_conn
from .._gateway import workers as _workers
from .._gateway._exec import run

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from anyio.abc import TaskStatus

    from .kit import Kit
    from .roster import Roster

log = logging.getLogger("runrow.dispatcher")


def agent_name(agent: Any) -> str:
    """The agent's qualified name (``module.qualname``), as the registry shows it."""
    target = agent
    while isinstance(target, functools.partial):
        target = target.func
    if not hasattr(target, "__qualname__"):
        target = type(target)  # a callable object: its class
    module = getattr(target, "__module__", None) or "?"
    return f"{module}.{getattr(target, '__qualname__', repr(target))}"[:200]


class Registry:
    """This dispatcher's row in the registry (service ``registry``)."""

    def __init__(self, kit: Kit, roster: Roster, agents: Mapping[str | None, Any]) -> None:
        s = self._settings = kit.settings
        self._pool = kit.pool
        self._roster = roster
        self._extra = kit.extra
        self.me = _workers.Registration(
            id=s.worker_id,
            host=socket.gethostname()[:200],
            pid=os.getpid(),
            version=s.version,
            # (The default agent's name, else the first key's: a name to recognise it by.)
            agent=agent_name(agents[None] if None in agents else agents[min(k for k in agents if k)]),
            concurrency=s.concurrency,
            agent_keys=list(s.agent_keys),
            serves_default=s.serves_default,
        )
        self._started_at: datetime | None = None

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        """Registers, then beats once a heartbeat until cancelled."""
        await self.beat()
        task_status.started()
        while True:
            await anyio.sleep(self._settings.heartbeat)
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._settings.heartbeat):
                await self.beat()

    async def beat(self) -> None:
        """Writes this dispatcher's row now (registers it if missing)."""
        s = self._settings
        try:
            async with statement_conn(self._pool()) as conn:
                self._started_at = await run(
                    conn,
                    _workers.beat(
                        s.schema,
                        self.me,
                        in_flight=len(self._roster.runs),
                        lease_seconds=s.lease,
                        started_at=self._started_at,
                    ),
                )
        except (psycopg.Error, OSError) as exc:
            log.warning("worker registry beat failed: %s", describe(exc), extra=self._extra)

    async def leave(self) -> None:
        """Deletes this dispatcher's row (a clean stop), within a short bound."""
        if self._started_at is None:
            return  # never registered
        s = self._settings
        try:
            with anyio.fail_after(min(5.0, s.finalize_timeout)):
                async with statement_conn(self._pool()) as conn:
                    await run(conn, _workers.leave(s.schema, self.me))
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning(
                "worker registry: could not remove this worker's row (%s); the reaper will",
                describe(exc),
                extra=self._extra,
            )
        self._started_at = None
