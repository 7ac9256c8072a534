"""Batched writers against each other on real connections: no deadlocks, and one run's
conflict does not hold back a reaper pass's other runs."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest

import runrow
from runrow._engine.dispatcher import reap_expired

from . import manual
from .helpers import assert_journal_sound, enqueue_turn, status_of, wait_for

pytestmark = pytest.mark.anyio


async def test_one_runs_seq_collision_does_not_hold_back_a_reaper_pass(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A dying worker's last append (seq max+1) commits while the reaper's pass is
    writing its terminal event at the same seq: that run's insert hits the primary key.
    The pass must still reap the other runs of its batch (and may take the victim again)."""
    for c in ("a", "b", "c"):
        await enqueue_turn(dsn, schema, c)
    claimed = await manual.claim(conn, schema, limit=3, lease=30, worker_id="dead-worker")
    assert len(claimed) == 3
    victim = claimed[0]
    later = await manual.db_now(conn) + timedelta(hours=1)
    racer = await psycopg.AsyncConnection.connect(dsn)  # its append stays uncommitted
    try:
        assert await manual.append(
            racer,
            schema,
            victim["id"],
            victim["claim_token"],
            [(int(victim["last_seq"]) + 1, "content_delta", {"delta": "last words"})],
        )
        reaped: list[Any] = []

        async def reap() -> None:
            reaped.extend(await reap_expired(dsn, schema=schema, grace=1.0, now=later))

        async def waiting_on_racer() -> bool:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (racer.info.backend_pid,),
            )
            row = await cur.fetchone()
            return bool(row and row[0])

        async with anyio.create_task_group() as tg:
            tg.start_soon(reap)
            await wait_for(waiting_on_racer, what="the reaper waiting on the racing append")
            await racer.commit()
    finally:
        await racer.close()
    others = {r["id"] for r in claimed[1:]}
    assert others <= set(reaped), f"the pass reaped {reaped}, not the other runs {others}"
    for r in claimed[1:]:
        assert await status_of(conn, schema, r["id"]) == "failed"
        await assert_journal_sound(conn, schema, r["id"])


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
