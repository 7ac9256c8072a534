"""The web process's share of the queue: a reaper.

**The reaper.** ``runrow demo`` runs its workers as separate processes, and each
dispatcher reaps, but a reaper that lives in a worker dies with it: with one worker,
nobody was left to end its runs. So the web process runs :func:`reap_periodically`, a
pass of runrow's one-pass reaper every few seconds. Not a Dispatcher with nothing to do:
that would open its own pool, claim, heartbeat and run an agent in the web process,
all to get a loop this small. The reaper is safe to run anywhere and any number of
times: each write re-checks the lease, so a live worker's heartbeat always wins.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import psycopg

from runrow._engine.reaper import reap_expired

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

__all__ = ["reap_periodically"]

log = logging.getLogger("runrow.demo")


async def reap_periodically(
    pool: AsyncConnectionPool[AsyncConnection], *, schema: str, interval: float, grace: float
) -> None:
    """A reaper pass every ``interval`` seconds, until cancelled; a failed pass is logged."""
    while True:
        try:
            with anyio.fail_after(max(interval, 5.0)):
                await reap_expired(pool, schema=schema, grace=grace, reaper_id="runrow-demo-web")
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning("demo reaper pass failed: %s", exc)
        await anyio.sleep(interval)
