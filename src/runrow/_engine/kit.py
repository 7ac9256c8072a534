"""The kit: what every service of one running dispatcher is handed, built once.

Each service takes the kit, the roster and only its own extras. The kit is frozen: the
things in it (the stats, the task set) change, which of them a dispatcher uses does not.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import anyio
from psycopg_pool import AsyncConnectionPool

from .. import _aio
from .._db import describe
from .._gateway._exec import configure_own

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskStatus
    from psycopg import AsyncConnection

    from .._observe import Observers
    from .settings import Settings
    from .signals import Signals

log = logging.getLogger("runrow.dispatcher")


def own_pool(conninfo: str, s: Settings) -> AsyncConnectionPool[AsyncConnection]:
    """The pool a dispatcher opens for itself from a conninfo (not opened yet)."""
    direct = s.prepared_statements  # (False: behind a transaction pooler, see below)
    return AsyncConnectionPool(
        conninfo,
        # The connections kept by the claim loop, the ending writer, the journal writer,
        # the heartbeat and the reaper are ready at start (the first runs do not wait on
        # connecting), and each run has one more.
        min_size=min(5, s.concurrency + 5),
        max_size=s.concurrency + 5,
        open=False,
        # Prepared at first use: the dispatcher repeats a handful of statements. Behind a
        # transaction-pooling pgbouncer (< 1.21) server-side prepared statements break:
        # prepared_statements=False turns them off.
        kwargs={"autocommit": True, "prepare_threshold": 0 if direct else None},
        # A direct connection sets JIT off and the idle bound of the worker's
        # transactions (tx_idle_seconds) once for its session; behind a pooler every
        # statement carries its own guard, and every such transaction its own bound.
        configure=partial(configure_own, idle_seconds=s.tx_idle_seconds) if direct else None,
        name=f"runrow-{s.worker_id}",
    )


STAT_NAMES: tuple[str, ...] = ("claimed", "completed", "failed", "cancelled", "parked", "reaped", "lost")
STAT_NAMES += ("claim_conflicts", "claims")


@dataclass(frozen=True, slots=True, kw_only=True)
class Kit:
    """One running dispatcher's shared tools.

    ``pool()`` is the dispatcher's pool (a callable: what ``HeldConnection`` and the
    statement helpers take); ``db_trouble()`` is called when a statement failed for want
    of a connection (see :class:`PoolCheck`); ``stats`` are the counters
    ``Dispatcher.get_stats`` reports; ``tasks`` runs per-run work (the runs, their
    helpers, retries, checks); ``signals`` is None outside tests (see ``signals.py``)."""

    settings: Settings
    pool: Callable[[], AsyncConnectionPool[AsyncConnection]]
    db_trouble: Callable[[], None]
    observe: Observers
    stats: dict[str, int]
    signals: Signals | None = None
    tasks: _aio.TaskSet = field(default_factory=_aio.TaskSet)

    @property
    def extra(self) -> dict[str, str]:
        """The ``extra`` of a service's log lines (a new dict: a caller may add to it)."""
        return {"worker_id": self.settings.worker_id}


class PoolCheck:
    """Has the pool test its idle connections and replace dead ones when a statement
    reported trouble (after a server restart they all are), at most once a second
    (service ``pool-check``)."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection], worker_id: str) -> None:
        self._pool = pool
        self._trouble = _aio.Event()
        self._extra = {"worker_id": worker_id}

    def report(self) -> None:
        """A statement failed for want of a connection."""
        self._trouble.set()

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        """The check loop."""
        task_status.started()
        while True:
            await self._trouble.wait()
            self._trouble.clear()
            try:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):  # (as schema_watch.py)
                    await self._pool.check()
            except Exception as exc:  # best effort
                log.debug("pool check failed: %s", describe(exc), extra=self._extra)
            await anyio.sleep(1.0)
