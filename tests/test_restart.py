"""Signals are hints, rows are truth: killing the listener or restarting the whole server
costs latency, never correctness. These tests own a PostgreSQL server they can restart."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import psycopg
import pytest

import runrow
from runrow.embedded import EmbeddedPostgres

from .helpers import assert_journal_sound, status_of, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
SCHEMA = "restart_test"


@pytest.fixture
def server(restartable_server: EmbeddedPostgres) -> EmbeddedPostgres:
    return restartable_server


@pytest.fixture
async def dsn(server: EmbeddedPostgres) -> AsyncIterator[str]:
    await runrow.migrate(server.conninfo(), schema=SCHEMA)
    yield server.conninfo()


async def _run_fifty_through(dsn: str, hub: runrow.NotifyHub, disrupt: object) -> runrow.Dispatcher:
    gate = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        await gate.wait()
        await run.text(f"answer {run.content}")
        await run.emit({"type": "tool_call_started", "tool_call_id": "1"})

    finished: dict[str, list[runrow.Event]] = {}
    async with runrow.Dispatcher(
        dsn, agent, schema=SCHEMA, hub=hub, concurrency=50, lease=30, heartbeat=1, poll=30, reap_interval=30
    ) as d:
        runs = [
            await runrow.enqueue(dsn, schema=SCHEMA, conversation_id=f"c{i}", user_id="u", content=i)
            for i in range(50)
        ]

        async def follow(run: runrow.Run) -> None:
            finished[str(run.id)] = [
                e async for e in runrow.tail(dsn, run.id, hub=hub, schema=SCHEMA, poll=0.2) if not e.keepalive
            ]

        async with anyio.create_task_group() as tg:
            for r in runs:
                tg.start_soon(follow, r)
            await wait_for(lambda: len(d.in_flight) == 50, timeout=20, what="50 runs in flight")
            await disrupt()  # type: ignore[operator]
            gate.set()
        # Every tail saw its whole journal and its ending.
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for r in runs:
                evs = await assert_journal_sound(conn, SCHEMA, r.id)
                assert [e.seq for e in finished[str(r.id)]] == [s for s, _, _ in evs]
                assert await status_of(conn, SCHEMA, r.id) == "completed"
        # Fast wake-ups are back: a new run starts long before the 30 s poll tick.
        await wait_for(lambda: hub.connected, timeout=20, what="the hub to reconnect")
        t0 = anyio.current_time()
        gate_run = await runrow.enqueue(
            dsn, schema=SCHEMA, conversation_id="after", user_id="u", content="after"
        )
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await wait_for(lambda: _done(conn, gate_run.id), timeout=10, what="a run after recovery")
        assert anyio.current_time() - t0 < 10
    return d


async def _done(conn: psycopg.AsyncConnection, run_id: object) -> bool:
    return await status_of(conn, SCHEMA, run_id) == "completed"


async def test_killing_the_hub_backend_under_fifty_tails_and_a_dispatcher(dsn: str) -> None:
    async with runrow.NotifyHub(dsn, probe_interval=1) as hub:
        await wait_for(lambda: hub.connected, what="hub")
        before = hub.reconnects

        async def kill_listener() -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
                await c.execute("SELECT pg_terminate_backend(%s)", (hub.backend_pid,))
            await wait_for(lambda: hub.reconnects > before, timeout=20, what="the hub to reconnect")

        await _run_fifty_through(dsn, hub, kill_listener)


async def test_a_full_server_restart_under_fifty_tails_and_a_dispatcher(
    dsn: str, server: EmbeddedPostgres
) -> None:
    async with runrow.NotifyHub(dsn, probe_interval=1, max_backoff=0.5) as hub:
        await wait_for(lambda: hub.connected, what="hub")

        async def restart() -> None:
            keep, server.cleanup = server.cleanup, False
            await anyio.to_thread.run_sync(server.stop)  # a clean shutdown: every connection drops
            server.start()  # from the main thread, which owns the server's parent-death signal
            server.cleanup = keep

        d = await _run_fifty_through(dsn, hub, restart)
        assert d.get_stats()["completed"] == 51 and d.get_stats()["lost"] == 0
