"""Tails on one pool share their reads (issue #24): one statement for the tails woken
together, with each tail's stream exactly what it would read alone."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from typing import Any

import anyio
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

import runrow
from runrow import _tailbatch
from runrow._gateway import journal, statement_text
from runrow._gateway import tail as _gw
from runrow._gateway._exec import run
from runrow._names import Channels
from runrow._tail import read_plan

from . import manual
from .helpers import empty, events, table, wait_for

pytestmark = pytest.mark.anyio


async def _live_run(
    conn: psycopg.AsyncConnection, schema: str, n_events: int, ending: str | None
) -> uuid.UUID:
    """A run claimed with ``n_events`` journaled after its first two, then ended as asked:
    "completed" (journaled), "failed" (status only: the tail synthesises the ending),
    "queued" (never claimed), or None (still running)."""
    r = await runrow.enqueue(conn, schema=schema, conversation_id=uuid.uuid4().hex, user_id="u", content="x")
    if ending == "queued":
        return r.id
    (claimed,) = await manual.claim(conn, schema)
    token = claimed["claim_token"]
    if n_events:
        evs = [(3 + i, "content_delta", {"delta": f"d{i}"}) for i in range(n_events)]
        assert await manual.append(conn, schema, r.id, token, evs)
    if ending == "completed":
        assert await manual.finalize(conn, schema, r.id, token, "completed", 3 + n_events)
    elif ending == "failed":
        await conn.execute(
            sql.SQL("UPDATE {} SET status = 'failed', finished_at = now() WHERE id = %s").format(
                table(schema, "agent_run")
            ),
            (r.id,),
        )
    return r.id


async def _single(conn: psycopg.AsyncConnection, schema: str, req: _gw.ReadRequest) -> Any:
    try:
        return await run(conn, read_plan(schema, req.run_id, req.after, req.limit))
    except runrow.RunNotFound:
        return None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    runs=st.lists(
        st.tuples(st.integers(0, 6), st.sampled_from([None, "completed", "failed", "queued"])),
        min_size=1,
        max_size=5,
    ),
    picks=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 12), st.integers(1, 5)), min_size=1, max_size=12
    ),
)
async def test_a_batched_read_returns_what_single_reads_return(
    dsn: str, schema: str, runs: list[tuple[int, str | None]], picks: list[tuple[int, int, int]]
) -> None:
    """Random journals (live, ended with or without a journaled ending, queued), random
    cursors (past the end too) and batch sizes, an unknown run, the same run twice: the
    one statement answers every request as the tail's own read does."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await empty(conn, schema)
        # (Queued runs last: a later claim would take them.)
        ids = [
            await _live_run(conn, schema, n, end) for n, end in sorted(runs, key=lambda r: r[1] == "queued")
        ]
        ids.append(uuid.uuid4())  # no such run
        requests = [_gw.ReadRequest(ids[i % len(ids)], after, limit) for i, after, limit in picks]
        batched = await run(conn, _gw.read_events_many(schema, requests))
        assert batched == [await _single(conn, schema, req) for req in requests]


async def test_a_batched_read_walks_the_primary_key(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SET enable_seqscan = off")  # (a tiny table: make the choice visible)
        text = statement_text("read_events_many", schema)
        cur = await conn.execute(
            b"EXPLAIN " + text,
            {"run_ids": [uuid.uuid4()], "afters": [0], "limits": [5]},
        )
        plan = "\n".join(r[0] for r in await cur.fetchall())
    assert "run_event_pkey" in plan and "agent_run_pkey" in plan, plan


async def _tail_all(
    pool: AsyncConnectionPool,
    hub: runrow.NotifyHub,
    schema: str,
    ids: list[uuid.UUID],
    got: dict[uuid.UUID, list[int]],
) -> None:
    async def one(rid: uuid.UUID) -> None:
        async for ev in runrow.tail(pool, rid, hub=hub, schema=schema, poll=0.05, batch=3):
            if not ev.keepalive:
                got[rid].append(ev.seq)

    async with anyio.create_task_group() as tg:
        for rid in ids:
            tg.start_soon(one, rid)


async def test_many_tails_on_one_pool_each_get_their_stream_exactly_once(dsn: str, schema: str) -> None:
    """300 tails on one pool of 3 and one hub while their runs append concurrently: each
    gets its run's whole journal once, in order, and their reads share statements."""
    n = 300
    ids, tokens = await _claimed_runs(dsn, schema, n)
    got: dict[uuid.UUID, list[int]] = {rid: [] for rid in ids}
    rng = random.Random(24)

    async def writer(rids: list[uuid.UUID]) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as w:
            seq = dict.fromkeys(rids, 3)
            for _ in range(6):
                for rid in rids:
                    size = rng.randint(1, 4)  # (a batch of 3 per read: some reads continue)
                    evs = [(seq[rid] + k, "content_delta", {"delta": "x"}) for k in range(size)]
                    assert await manual.append(w, schema, rid, tokens[rid], evs)
                    seq[rid] += size
                await anyio.sleep(0.01)
            for rid in rids:
                assert await manual.finalize(w, schema, rid, tokens[rid], "completed", seq[rid])

    async with (
        AsyncConnectionPool(dsn, min_size=1, max_size=3, open=False, kwargs={"autocommit": True}) as pool,
        runrow.NotifyHub(dsn) as hub,
    ):
        await wait_for(lambda: hub.connected, what="the hub connected")
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_tail_all, pool, hub, schema, ids, got)
                for k in range(4):
                    tg.start_soon(writer, ids[k::4])
        b = _tailbatch.batcher(pool, schema)
        assert not b.busy
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for rid in ids:
            assert got[rid] == [s for s, _, _ in await events(conn, schema, rid)]
            assert got[rid][-1] > 3
    # Shared, not one each (how much depends on timing: the exact rule is proven by
    # test_reads_queued_while_one_is_in_flight_ride_the_next_statement).
    assert b.statements < b.reads, (b.statements, b.reads)


async def test_reads_queued_while_one_is_in_flight_ride_the_next_statement(dsn: str, schema: str) -> None:
    """The batching rule, without timing: a lone read goes out at once; the 49 reads queued
    while it waits (here, for the pool's only connection) go together as the next one."""
    ids, _ = await _claimed_runs(dsn, schema, 50)
    async with AsyncConnectionPool(
        dsn, min_size=1, max_size=1, open=False, kwargs={"autocommit": True}
    ) as pool:
        b = _tailbatch.batcher(pool, schema)
        held = await pool.getconn()
        got: dict[uuid.UUID, list[int]] = {}

        async def read(rid: uuid.UUID) -> None:
            rows, _ = await b.read(rid, 0, 10)
            got[rid] = [e.seq for e in rows]

        async with anyio.create_task_group() as tg:
            tg.start_soon(read, ids[0])
            await wait_for(lambda: b.busy and b.statements == 1, what="the first read sent")
            for rid in ids[1:]:
                tg.start_soon(read, rid)
            await wait_for(
                lambda: len(b._queue) == len(ids) - 1, what="every read queued behind the one in flight"
            )
            await pool.putconn(held)
        assert (b.statements, b.reads) == (2, 50)
        assert all(got[rid] == [1, 2] for rid in ids), got


async def test_a_batch_that_fails_on_a_dropped_connection_lets_each_tail_recover(
    dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The pool's connections die under the tails: the batch that meets them fails for
    every tail in it, each retries, and each still gets its whole stream once."""
    n = 40
    ids, tokens = await _claimed_runs(dsn, schema, n)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        got: dict[uuid.UUID, list[int]] = {rid: [] for rid in ids}
        app = f"tailbatch_{uuid.uuid4().hex[:8]}"
        caplog.set_level(logging.INFO, logger="runrow.journal")
        async with (
            AsyncConnectionPool(
                f"{dsn} application_name={app}", min_size=2, max_size=2, kwargs={"autocommit": True}
            ) as pool,
            runrow.NotifyHub(dsn) as hub,
            anyio.create_task_group() as tg,
        ):
            await wait_for(lambda: hub.connected, what="the hub connected")
            tg.start_soon(_tail_all, pool, hub, schema, ids, got)
            await wait_for(lambda: all(len(s) == 2 for s in got.values()), what="the catch-up")
            await anyio.sleep(0.2)  # (the subscriptions' first wakes read nothing new)
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (app,)
            )
            # One statement for every run: their tails wake together, into one batch.
            rows = [(3, "x", "{}")]
            appended = [journal.Appended(rid, tokens[rid], rows) for rid in ids]
            assert (
                len(await run(conn, journal.append(schema, appended, channels=Channels.for_schema(schema))))
                == n
            )
            await wait_for(lambda: all(len(s) == 3 for s in got.values()), what="the recovery")
            for rid in ids:
                assert await manual.finalize(conn, schema, rid, tokens[rid], "completed", 4)
        assert all(s == [1, 2, 3, 4] for s in got.values()), got
        failed = [r for r in caplog.records if "cannot read" in r.getMessage()]
        assert len(failed) > 1, "expected a batch of many reads to fail on the dead connections"


def _drains() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if "ReadBatcher._drain" in repr(t.get_coro())]


async def test_tails_that_stop_leave_no_task_behind(dsn: str, schema: str) -> None:
    """Tails cancelled mid-read (their batch in flight) and tails cancelled while idle:
    afterwards no read task is left, and the batcher serves new tails again."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        ids = [
            (await runrow.enqueue(conn, schema=schema, conversation_id=f"c{i}", user_id="u", content="x")).id
            for i in range(50)
        ]
    got: dict[uuid.UUID, list[int]] = {rid: [] for rid in ids}
    async with (
        AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool,
        runrow.NotifyHub(dsn) as hub,
    ):
        b = _tailbatch.batcher(pool, schema)
        # Cancelled while their catch-up statement is in flight: it ends, and its task too.
        async with anyio.create_task_group() as tg:
            tg.start_soon(_tail_all, pool, hub, schema, ids, got)
            with anyio.fail_after(5):
                while not b.busy:
                    await anyio.sleep(0)
            (in_flight,) = _drains()
            tg.cancel_scope.cancel()
        await wait_for(lambda: not b.busy and not _drains(), what="the read task ended")
        assert in_flight.done() and not in_flight.cancelled() and in_flight.exception() is None
        # Cancelled while idle, waiting for their hub.
        with anyio.move_on_after(0.5):
            await _tail_all(pool, hub, schema, ids, got)
        await wait_for(lambda: not b.busy and not _drains(), what="the read task ended")
        assert all(s[:2] == [1, 2] for s in got.values())
        # Alone again: a single tail's read is a statement of its own.
        before = b.statements
        seen = []
        with anyio.move_on_after(0.3):
            async for ev in runrow.tail(pool, ids[0], hub=hub, schema=schema):
                seen.append(ev.seq)
        assert seen == [1, 2] and b.statements > before
        assert not b.busy and not _drains()


async def test_tails_on_a_pool_name_a_missing_schema(dsn: str) -> None:
    """The batched read keeps the schema guard: every tail of the batch learns the fix."""
    missing = f"nope_{uuid.uuid4().hex[:8]}"
    raised: list[BaseException] = []

    async def one() -> None:
        try:
            async for _ in runrow.tail(pool, uuid.uuid4(), schema=missing):
                pass
        except runrow.SchemaOutOfDate as exc:
            raised.append(exc)

    async with (
        AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool,
        anyio.create_task_group() as tg,
    ):
        for _ in range(5):
            tg.start_soon(one)
    assert len(raised) == 5


async def test_a_statement_holds_a_bounded_number_of_rows(dsn: str, schema: str) -> None:
    """Reads queued together share a statement up to MAX_ROWS rows by their limits."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        ids = [await _live_run(conn, schema, 1, None) for _ in range(3)]
    async with AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
        b = _tailbatch.batcher(pool, schema)
        for limit, statements in ((10, 1), (_tailbatch.MAX_ROWS // 2 + 1, 3)):
            before = b.statements
            results: list[Any] = []

            async def one(rid: uuid.UUID, limit: int = limit, results: list[Any] = results) -> None:
                results.append(await b.read(rid, 0, limit))

            async with anyio.create_task_group() as tg:
                for rid in ids:
                    tg.start_soon(one, rid)
            assert b.statements - before == statements
            assert sorted(len(rows) for rows, _ in results) == [3, 3, 3]


async def _claimed_runs(dsn: str, schema: str, n: int) -> tuple[list[uuid.UUID], dict[uuid.UUID, uuid.UUID]]:
    """``n`` runs, one conversation each, claimed by hand: their ids, and their claim tokens."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        ids = [
            (await runrow.enqueue(conn, schema=schema, conversation_id=f"c{i}", user_id="u", content="x")).id
            for i in range(n)
        ]
        tokens = {c["id"]: c["claim_token"] for c in await manual.claim(conn, schema, limit=n)}
    return ids, tokens
