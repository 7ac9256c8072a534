"""Test signals: the engine's named points fire with what happened there, and only when
a test asked for them."""

from __future__ import annotations

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow import testing
from runrow._engine.signals import Signal

from . import manual
from .helpers import table

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 0.3, "reap_interval": 0.2}


async def test_claims_and_endings_fire_with_their_runs(dsn: str, schema: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        if run.content == "bad":
            raise ValueError("no")

    d = runrow.Dispatcher(dsn, agent, schema=schema, **FAST)
    sig = testing.signals(d)
    async with d:
        ok = await runrow.enqueue(dsn, schema=schema, conversation_id="a", user_id="u", content="ok")
        bad = await runrow.enqueue(dsn, schema=schema, conversation_id="b", user_id="u", content="bad")
        assert (await sig.ended.wait(lambda e: e.run_id == ok.id)).recorded == "completed"
        assert (await sig.ended.wait(lambda e: e.run_id == bad.id)).recorded == "failed"
    claimed = {i for ids in sig.claimed.seen for i in ids}
    assert {ok.id, bad.id} <= claimed
    assert len(sig.ended.seen) == 2, sig.ended.seen  # one per run, none twice


async def test_a_reaper_pass_fires_with_the_runs_it_ended(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        pass

    orphan = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    await manual.claim(conn, schema, lease=0.2, worker_id="dead-worker")
    d = runrow.Dispatcher(dsn, agent, schema=schema, **FAST)
    sig = testing.signals(d)
    async with d:
        assert orphan.id in await sig.reaped.wait(lambda ids: orphan.id in ids)
    # Reaped, not run: the dispatcher never claimed it, so it has no ending of its own.
    assert not any(orphan.id in ids for ids in sig.claimed.seen)
    assert not any(e.run_id == orphan.id for e in sig.ended.seen)


async def test_a_lost_claim_ends_with_nothing_recorded(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    started = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        started.set()
        await anyio.sleep_forever()

    d = runrow.Dispatcher(dsn, agent, schema=schema, **FAST)
    sig = testing.signals(d)
    async with d:
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await started.wait()
        # Another worker takes the claim over: the heartbeat finds it gone.
        await conn.execute(
            sql.SQL("UPDATE {} SET claim_token = gen_random_uuid() WHERE id = %s").format(
                table(schema, "agent_run")
            ),
            (run.id,),
        )
        assert (await sig.ended.wait(lambda e: e.run_id == run.id)).recorded is None


async def test_a_wait_sees_what_fired_before_it_and_times_out_on_nothing() -> None:
    signal: Signal[int] = Signal("numbers")
    signal.fire(1)
    signal.fire(2)
    assert await signal.wait(lambda n: n > 1) == 2
    assert await signal.wait() == 1
    with pytest.raises(TimeoutError):
        await signal.wait(lambda n: n > 2, timeout=0.05)

    async def later() -> None:
        await anyio.sleep(0.01)
        signal.fire(3)

    async with anyio.create_task_group() as tg:
        tg.start_soon(later)
        assert await signal.wait(lambda n: n > 2) == 3


async def test_signals_are_attached_before_the_start_and_only_on_request(dsn: str, schema: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        pass

    plain = runrow.Dispatcher(dsn, agent, schema=schema, **FAST)
    async with plain:
        assert plain._running().kit.signals is None  # production carries none
        with pytest.raises(RuntimeError, match="before the dispatcher starts"):
            testing.signals(plain)
