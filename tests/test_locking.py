"""Batched writers against each other on real connections: no deadlocks, and one run's
conflict does not hold back a reaper pass's other runs."""

from __future__ import annotations

import random

import anyio
import psycopg
import pytest

import runrow

from . import manual
from .helpers import enqueue_turn

pytestmark = pytest.mark.anyio


async def test_batched_heartbeats_in_opposite_orders_never_deadlock(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Batched writers lock agent_run rows in one fixed order (by id), whatever order
    their batch comes in: heartbeats of overlapping batches, in opposite orders, on
    separate connections, never deadlock."""
    n = 12
    for i in range(n):
        await enqueue_turn(dsn, schema, f"c{i}")
    claimed = await manual.claim(conn, schema, limit=n, lease=60, worker_id="w")
    assert len(claimed) == n
    runs = [(r["id"], r["claim_token"]) for r in claimed]
    deadlocks: list[BaseException] = []
    beats = 0

    async def hammer(seed: int) -> None:
        nonlocal beats
        rng = random.Random(seed)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            for k in range(60):
                batch = list(runs)
                if (seed + k) % 2:
                    batch.reverse()
                else:
                    rng.shuffle(batch)
                try:
                    alive = await manual.heartbeat(c, schema, batch, lease=60)
                except psycopg.errors.DeadlockDetected as exc:
                    deadlocks.append(exc)
                    continue
                assert len(alive) == n
                beats += 1

    # A short deadlock_timeout on the hammering connections' server side is not needed:
    # a deadlock is detected after deadlock_timeout (1 s) and fails one of them.
    async with anyio.create_task_group() as tg:
        for seed in range(6):
            tg.start_soon(hammer, seed)
    assert deadlocks == [], f"{len(deadlocks)} deadlocks in {beats} heartbeats"


async def test_prepared_statements_false_with_a_callers_pool_is_refused(dsn: str) -> None:
    """The flag only shapes the pool the dispatcher opens; with the caller's pool it would
    be silently ignored (its connections prepare as the caller configured them)."""
    from psycopg_pool import AsyncConnectionPool

    async def agent(run: runrow.RunContext) -> None:
        return None

    pool: AsyncConnectionPool[psycopg.AsyncConnection] = AsyncConnectionPool(dsn, open=False)
    with pytest.raises(runrow.ConfigurationError, match="prepared_statements=False"):
        runrow.Dispatcher(pool, agent, prepared_statements=False)
