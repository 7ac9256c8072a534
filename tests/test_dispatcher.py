"""The dispatcher in one process: claim, slots, order, fencing, reaper, drain, wake-ups."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import uuid
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

import runrow
from runrow._engine.reaper import reap_expired
from runrow._gateway._exec import configure_own
from runrow._gateway.journal import Appended

from . import manual
from .chaos.proxy import Proxy
from .helpers import (
    assert_journal_sound,
    blocked_by,
    events,
    is_terminal,
    run_row,
    status_of,
    table,
    wait_for,
)

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}


async def test_a_run_completes_with_a_sound_journal(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        assert run.content == "hi" and run.user_id == "u" and run.request == {"m": 1}
        await run.text("Hel")
        await run.text("lo")
        await run.emit({"type": "tool_call_started", "tool_call_id": "1", "name": "search"})
        await run.write_message("Hello")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST) as d:
        run = await runrow.enqueue(
            dsn, schema=schema, conversation_id="c", user_id="u", content="hi", request={"m": 1}
        )
        await wait_for(lambda: status_of(conn, schema, run.id), what="run to finish")
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="terminal")
    evs = await assert_journal_sound(conn, schema, run.id)
    assert [t for _, t, _ in evs] == [
        "user_message_created",
        "run_queued",
        "content_delta",
        "tool_call_started",
        "complete",
    ]
    assert evs[2][2] == {"delta": "Hello"}  # the two deltas merged into one row
    assert evs[-1][2] == {"status": "completed"}
    row = await run_row(conn, schema, run.id)
    assert row["worker_id"] == d.worker_id and row["finished_at"] is not None
    msgs = await runrow.transcript(dsn, "c", schema=schema)
    assert [(m.role, m.content, m.status) for m in msgs] == [
        ("user", "hi", "sent"),
        ("assistant", "Hello", "complete"),
    ]


async def test_a_raising_agent_fails_the_run_with_its_error(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.text("partial answer")
        raise ValueError("model exploded")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="terminal")
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "failed"
    # The error: type, message and (since #40) the traceback on the row; the ending's event
    # (streamed to the run's clients) carries the type and message only.
    traceback = row["error"].pop("traceback")
    assert traceback.rstrip().endswith("ValueError: model exploded") and "in agent" in traceback
    assert row["error"] == {"type": "ValueError", "message": "model exploded"}
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2] == {
        "status": "failed",
        "error": {"type": "ValueError", "message": "model exploded"},
    }
    assert evs[-2] == (3, "content_delta", {"delta": "partial answer"})  # flushed before the end
    msgs = await runrow.transcript(dsn, "c", schema=schema)
    assert [(m.content, m.status) for m in msgs if m.role == "assistant"] == [("partial answer", "partial")]


async def test_slots_are_taken_before_claiming(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    release = anyio.Event()
    seen_running: list[int] = []

    async def agent(run: runrow.RunContext) -> None:
        await release.wait()

    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=3, **FAST) as d:
        runs = [
            await runrow.enqueue(dsn, schema=schema, conversation_id=f"c{i}", user_id="u", content=i)
            for i in range(7)
        ]
        await wait_for(lambda: len(d.in_flight) == 3, what="three runs in flight")
        for _ in range(10):  # the process is full: it must not claim a fourth
            cur = await conn.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE status = 'running'").format(table(schema, "agent_run"))
            )
            seen_running.append((await cur.fetchone())[0])  # type: ignore[index]
            await anyio.sleep(0.02)
        release.set()
        await wait_for(lambda: _all_terminal(conn, schema, runs), what="all runs")
    assert max(seen_running) == 3
    # Claims are batched: fewer claim statements than runs claimed.
    assert d.get_stats()["claimed"] == 7 and d.get_stats()["completed"] == 7


async def _all_terminal(conn: psycopg.AsyncConnection, schema: str, runs: list[runrow.Run]) -> bool:
    return all([await is_terminal(conn, schema, r.id) for r in runs])


async def test_one_claim_statement_takes_many_runs(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    runs = [
        await runrow.enqueue(dsn, schema=schema, conversation_id=f"c{i}", user_id="u", content=i)
        for i in range(12)
    ]
    rows = await manual.claim(conn, schema, limit=8)
    assert len(rows) == 8
    assert len({r["conversation_id"] for r in rows}) == 8
    assert [r["id"] for r in rows] == [r.id for r in runs[:8]]  # oldest first


async def test_claim_takes_at_most_one_turn_per_conversation_in_order(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    a = [
        await runrow.enqueue(dsn, schema=schema, conversation_id="A", user_id="u", content=i)
        for i in range(3)
    ]
    b = await runrow.enqueue(dsn, schema=schema, conversation_id="B", user_id="u", content=0)
    rows = await manual.claim(conn, schema, limit=10)
    assert sorted(r["id"] for r in rows) == sorted([a[0].id, b.id])
    # A's first turn is running: nothing else of A is claimable until it ends.
    assert await manual.claim(conn, schema, limit=10) == []
    first = next(r for r in rows if r["id"] == a[0].id)
    assert await manual.finalize(conn, schema, first["id"], first["claim_token"], "completed", 3)
    nxt = await manual.claim(conn, schema, limit=10)
    assert [r["id"] for r in nxt] == [a[1].id]


async def test_turns_of_a_conversation_run_one_at_a_time_in_order(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    log: list[tuple[str, int]] = []
    active = {"n": 0, "max": 0}

    async def agent(run: runrow.RunContext) -> None:
        active["n"] += 1
        active["max"] = max(active["max"], active["n"])
        log.append(("start", run.content))
        await anyio.sleep(0.01)
        log.append(("end", run.content))
        active["n"] -= 1

    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=8, **FAST):
        runs = [
            await runrow.enqueue(dsn, schema=schema, conversation_id="one", user_id="u", content=i)
            for i in range(6)
        ]
        await wait_for(lambda: _all_terminal(conn, schema, runs), what="all runs")
    assert active["max"] == 1
    assert log == [(kind, i) for i in range(6) for kind in ("start", "end")]


async def test_the_unique_index_is_the_guarantee(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    r1 = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
    r2 = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=2)
    await manual.claim(conn, schema)
    # Bypass the claim's filter: the schema itself refuses a second running turn.
    with pytest.raises(psycopg.errors.UniqueViolation):
        await conn.execute(
            sql.SQL(
                "UPDATE {} SET status = 'running', claim_token = gen_random_uuid(), claim_expires_at = now(), "
                "started_at = now() WHERE id = %s"
            ).format(table(schema, "agent_run")),
            (r2.id,),
        )
    assert await status_of(conn, schema, r1.id) == "running"


async def test_a_claim_that_hits_the_unique_index_claims_nothing_and_carries_on(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A running turn the claim's snapshot cannot see (uncommitted) makes the claim collide."""
    done = []

    async def agent(run: runrow.RunContext) -> None:
        done.append(run.run_id)

    queued = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="queued")
    intruder = await psycopg.AsyncConnection.connect(dsn)
    try:
        await intruder.execute("BEGIN")
        # Another turn of the same conversation becomes running in a transaction not yet committed.
        other = await runrow.enqueue(
            intruder, schema=schema, conversation_id="c", user_id="u", content="other"
        )
        await intruder.execute(
            sql.SQL(
                "UPDATE {} SET status = 'running', claim_token = gen_random_uuid(), claim_expires_at = now() + interval '1 hour', "
                "started_at = now() WHERE id = %s"
            ).format(table(schema, "agent_run")),
            (other.id,),
        )
        async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST) as d:
            # The dispatcher's claim of `queued` now waits on the intruder's index entry.
            await wait_for(lambda: _waiting_on_lock(conn), what="the claim to block on the index")
            await intruder.execute("COMMIT")
            await wait_for(lambda: d.get_stats()["claim_conflicts"] >= 1, what="a claim conflict")
            assert await status_of(conn, schema, queued.id) == "queued"
            # End the intruder's turn: the queued one then runs.
            await conn.execute(
                sql.SQL("UPDATE {} SET status = 'completed', finished_at = now() WHERE id = %s").format(
                    table(schema, "agent_run")
                ),
                (other.id,),
            )
            await wait_for(lambda: queued.id in done, what="the queued turn to run")
    finally:
        await intruder.close()


async def _waiting_on_lock(conn: psycopg.AsyncConnection) -> bool:
    cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
    row = await cur.fetchone()
    return bool(row and row[0] > 0)


async def test_a_lost_claim_stops_the_agent_and_writes_nothing_more(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    step = anyio.Event()
    outcome: list[str] = []

    async def agent(run: runrow.RunContext) -> None:
        await run.emit({"type": "step", "n": 1})
        await step.wait()
        try:
            await run.emit({"type": "step", "n": 2})
        except runrow.LeaseLost:
            outcome.append("lease lost")
            raise
        outcome.append("kept writing")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST) as d:
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(lambda: _has_event(conn, schema, run.id, "step"), what="first step")
        # Someone else took the run over (a reaper plus a new claim would do this).
        await conn.execute(
            sql.SQL("UPDATE {} SET claim_token = gen_random_uuid() WHERE id = %s").format(
                table(schema, "agent_run")
            ),
            (run.id,),
        )
        step.set()
        await wait_for(lambda: outcome, what="the agent's second write")
        await wait_for(lambda: not d.in_flight, what="the worker to stand down")
        assert d.get_stats()["lost"] >= 1
    assert outcome == ["lease lost"]
    assert await status_of(conn, schema, run.id) == "running"  # the worker wrote no ending
    assert [t for _, t, _ in await events(conn, schema, run.id)] == [
        "user_message_created",
        "run_queued",
        "step",
    ]


async def _has_event(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID, etype: str) -> bool:
    return any(t == etype for _, t, _ in await events(conn, schema, run_id))


async def test_terminal_states_are_sticky(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema, lease=0.01)
    token = claimed["claim_token"]
    assert await manual.finalize(conn, schema, run.id, token, "completed", 3)
    # A zombie's late ending, a reap and a stop all leave it as it is.
    assert not await manual.finalize(conn, schema, run.id, token, "failed", 4)
    assert (
        await reap_expired(conn, schema=schema, grace=0, now=await manual.db_now(conn) + timedelta(hours=1))
        == []
    )
    assert (await runrow.cancel_run(conn, run.id, schema=schema)).noop
    assert await status_of(conn, schema, run.id) == "completed"
    await assert_journal_sound(conn, schema, run.id)


async def test_retry_creates_one_linked_run_for_the_same_message(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="u", content="x", tenant_id="t"
    )
    with pytest.raises(runrow.InvalidInput, match="only failed, cancelled or expired"):
        await runrow.retry_run(dsn, run.id, schema=schema)
    (claimed,) = await manual.claim(conn, schema)
    assert await manual.finalize(conn, schema, run.id, claimed["claim_token"], "failed", 3)
    again = await runrow.retry_run(dsn, run.id, schema=schema)
    assert again.created and again.status == "queued" and again.user_message_id == run.user_message_id
    assert (await run_row(conn, schema, again.id))["retry_of"] == run.id
    twice = await runrow.retry_run(dsn, str(run.id), schema=schema)
    assert twice.id == again.id and not twice.created
    with pytest.raises(runrow.RunNotFound):
        await runrow.retry_run(dsn, uuid.uuid4(), schema=schema)
    with pytest.raises(runrow.RunNotFound):
        await runrow.retry_run(dsn, "not-a-uuid", schema=schema)


async def test_a_finished_turn_wakes_the_next_one_in_the_same_process(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """With a one-minute poll tick and no notifications at all, turn 2 still starts as
    soon as turn 1 ends: the finishing run wakes its own dispatcher's claim loop."""
    order: list[object] = []

    async def agent(run: runrow.RunContext) -> None:
        order.append(run.content)

    runs = [
        await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=i)
        for i in range(3)
    ]
    async with runrow.Dispatcher(dsn, agent, schema=schema, notifications=False, **{**FAST, "poll": 60.0}):
        # The first claim at start-up takes turn 0; turns 1 and 2 can only start in time
        # if each ending wakes the claim loop (the tick is 60 s away).
        await wait_for(lambda: _all_terminal(conn, schema, runs), timeout=20, what="all turns")
    assert order == [0, 1, 2]


async def test_a_remote_finalize_wakes_the_next_turn(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Turn 1 is held by another worker (here: by hand); when it ends, its NOTIFY wakes
    this dispatcher, which starts turn 2 at once instead of on its 60 s tick."""
    started: dict[object, float] = {}

    async def agent(run: runrow.RunContext) -> None:
        started[run.content] = anyio.current_time()

    t1 = await runrow.enqueue(dsn, schema=schema, conversation_id="e", user_id="u", content="t1")
    t2 = await runrow.enqueue(dsn, schema=schema, conversation_id="e", user_id="u", content="t2")
    (held,) = await manual.claim(conn, schema)
    assert held["id"] == t1.id
    async with runrow.Dispatcher(
        dsn, agent, schema=schema, **{**FAST, "poll": 60.0, "reap_interval": 60.0}
    ) as d:
        await wait_for(lambda: d.hub is not None and d.hub.connected, what="the hub")
        # The claim loop has found nothing and parked: its first claim statement is
        # counted as it returns, and nothing is awaited between that and the park.
        await wait_for(lambda: d.get_stats()["claims"] >= 1, what="the claim loop to park")
        ended_at = anyio.current_time()
        assert await manual.finalize(conn, schema, t1.id, held["claim_token"], "completed", 3)
        await wait_for(lambda: "t2" in started, timeout=5, what="the next turn after a remote finalize")
    assert started["t2"] - ended_at < 5  # far below the 60 s poll tick
    assert await status_of(conn, schema, t2.id) == "completed"


async def test_drain_lets_runs_finish_within_the_budget(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    go = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        await go.wait()
        await anyio.sleep(0.05)

    d = runrow.Dispatcher(dsn, agent, schema=schema, concurrency=4, **FAST)
    async with d:
        runs = [
            await runrow.enqueue(dsn, schema=schema, conversation_id=f"c{i}", user_id="u", content=i)
            for i in range(4)
        ]
        await wait_for(lambda: len(d.in_flight) == 4, what="four runs in flight")
        go.set()
        report = await d.stop(drain_timeout=10)
        assert await d.stop() is report  # idempotent
        late = await runrow.enqueue(dsn, schema=schema, conversation_id="late", user_id="u", content="late")
    assert sorted(report.finished) == sorted(r.id for r in runs)
    assert report.interrupted == [] and report.left_for_reaper == []
    for r in runs:
        assert await status_of(conn, schema, r.id) == "completed"
    assert await status_of(conn, schema, late.id) == "queued"  # stopped claiming


async def test_drain_budget_spent_interrupts_and_records_the_rest(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.text("working on it")
        await anyio.sleep_forever()

    d = runrow.Dispatcher(dsn, agent, schema=schema, concurrency=2, **FAST)
    async with d:
        runs = [
            await runrow.enqueue(dsn, schema=schema, conversation_id=f"c{i}", user_id="u", content=i)
            for i in range(2)
        ]
        await wait_for(lambda: len(d.in_flight) == 2, what="two runs in flight")
        report = await d.stop(drain_timeout=0.2)
    assert sorted(report.interrupted) == sorted(r.id for r in runs)
    for r in runs:
        row = await run_row(conn, schema, r.id)
        assert row["status"] == "failed" and row["error"]["type"] == "worker_shutdown"
        evs = await assert_journal_sound(conn, schema, r.id)
        assert evs[-2][2] == {"delta": "working on it"}


async def test_an_agent_deaf_to_cancellation_cannot_hold_shutdown_forever(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """An agent that shields itself from cancellation outlives the drain and the finalize
    budget; leaving the dispatcher still ends, within those budgets plus the last-resort
    cancel, and the run is left to the reaper (never recorded as anything it was not)."""
    reached_end = False
    cancelled = False

    async def agent(run: runrow.RunContext) -> None:
        nonlocal reached_end, cancelled
        try:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(3600)
        except BaseException:
            cancelled = True
            raise
        reached_end = True

    d = runrow.Dispatcher(dsn, agent, schema=schema, finalize_timeout=0.5, **FAST)
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="deaf", user_id="u", content=1)
    t0 = anyio.current_time()
    with anyio.fail_after(30):
        async with d:
            await wait_for(lambda: d.in_flight == [run.id], what="the run in flight")
            report = await d.stop(drain_timeout=0.2)
    # drain 0.2 + finalize budget 0.5 (+1) inside stop(), then at most 0.5 in __aexit__
    assert anyio.current_time() - t0 < 15
    assert report.left_for_reaper == [run.id] and report.interrupted == [] and report.finished == []
    assert cancelled and not reached_end  # its task was cancelled, not abandoned
    assert await status_of(conn, schema, run.id) == "running"  # the reaper's to end


async def test_an_ending_whose_connection_dies_is_retried_and_lands(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """The second run's agent, as its last act, kills every connection of its worker:
    the ending writer's connection (kept since the first run's ending) is dead, so the
    first attempt fails, a retry on a fresh connection lands it, and the run completes
    once."""
    app = f"rr-victim-{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.WARNING, logger="runrow")

    async def agent(run: runrow.RunContext) -> None:
        if run.content == "warm":  # its ending puts the writer's connection in use
            return
        await run.text("done")
        await run.flush()
        cur = await conn.execute(
            "SELECT array_agg(pid) FROM pg_stat_activity WHERE application_name = %s", (app,)
        )
        pids = (await cur.fetchone())[0]  # type: ignore[index]
        assert pids
        await conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))

        async def gone() -> bool:
            cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,))
            return (await cur.fetchone())[0] == 0  # type: ignore[index]

        await wait_for(gone, what="the worker's backends to exit")

    pool: AsyncConnectionPool[psycopg.AsyncConnection] = AsyncConnectionPool(
        dsn, min_size=4, max_size=8, open=False, kwargs={"autocommit": True, "application_name": app}
    )
    async with pool, runrow.Dispatcher(pool, agent, schema=schema, notifications=False, **FAST) as d:
        warm = await runrow.enqueue(dsn, schema=schema, conversation_id="w", user_id="u", content="warm")
        await wait_for(lambda: d.get_stats()["completed"] == 1, what="the warm-up run")
        assert await status_of(conn, schema, warm.id) == "completed"
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
        await wait_for(lambda: is_terminal(conn, schema, run.id), timeout=15, what="the run's ending")
        await wait_for(lambda: not d.in_flight, what="the run released")
    assert await status_of(conn, schema, run.id) == "completed"
    assert d.get_stats()["completed"] == 2 and d.get_stats()["lost"] == 0
    evs = await assert_journal_sound(conn, schema, run.id)
    assert [t for _, t, _ in evs][-2:] == ["content_delta", "complete"]
    assert any(f"finalize of run {run.id} failed (attempt 1)" in r.getMessage() for r in caplog.records)


async def test_an_ending_that_committed_but_lost_its_answer_is_counted_once(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker reaches the server through a proxy that lets the ending through and
    then drops the server's answer, closing the connection: the ending has committed,
    but the worker sees a dead connection. Its retry's fence matches nothing; the worker
    reads back that the ending recorded is its own and counts the run failed, once,
    never "lost" (nor unrecorded)."""
    caplog.set_level(logging.INFO, logger="runrow")
    marker = f"answer-lost-{uuid.uuid4().hex}"

    async def agent(run: runrow.RunContext) -> None:
        raise RuntimeError(marker)  # the ending's error carries the marker

    finished: list[bool] = []

    class Recorded(runrow.Observer):
        def run_finished(
            self, run: runrow.RunContext, *, status: str, seconds: float, recorded: bool
        ) -> None:
            finished.append(recorded)

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    host = str(params.get("host") or "127.0.0.1")
    proxy = Proxy("127.0.0.1" if host.startswith("/") else host, int(params.get("port") or 5432))
    async with anyio.create_task_group() as tg:
        port = await proxy.start(tg)
        # (In the clear: the proxy looks for the marker in what the worker sends.)
        proxied = psycopg.conninfo.make_conninfo(
            dsn, host="127.0.0.1", port=port, sslmode="disable", gssencmode="disable"
        )
        proxy.lose_answer_to(marker.encode())
        d = runrow.Dispatcher(
            proxied, agent, schema=schema, notifications=False, observers=[Recorded()], **FAST
        )
        async with d:
            run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
            await wait_for(lambda: bool(finished), timeout=15, what="the run's ending answered")
        tg.cancel_scope.cancel()
    assert proxy.answers_lost == 1
    assert finished == [True]
    assert d.get_stats()["failed"] == 1 and d.get_stats()["lost"] == 0
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "failed" and marker in row["error"]["message"]
    evs = await assert_journal_sound(conn, schema, run.id)
    assert sum(1 for _, t, _ in evs if t == "complete") == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"finalize of run {run.id} failed (attempt 1)" in m for m in messages)
    assert any(f"finalize of run {run.id}: an earlier attempt had landed" in m for m in messages)


@pytest.mark.parametrize("connections", ["own", "unprepared", "host_pool"])
async def test_an_ending_that_cannot_land_is_given_up_within_its_budget(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture, connections: str
) -> None:
    """The run's own row is locked by another transaction as its agent returns, so its
    ending blocks. A drain does not cut it (its agent is done), the ending is given up
    finalize_timeout after it was handed over, and the drain reports it for the reaper:
    neither finished nor interrupted; observers are told recorded=False.

    "Given up" must hold on the server too: the ending must not be left waiting for the
    lock and commit once it goes. The worker reaches the server through a proxy that
    refuses new connections once the ending waits, so a client-side cancel request
    (which needs one) cannot land, as on a loaded host where it is cut short: only a
    bound the server itself keeps can end the statement.

    Whoever owns the connections: the dispatcher's own pool (JIT off for the session),
    its own pool without prepared statements (as behind a transaction pooler: every
    statement carries its JIT guard) and the host's pool. The last two used to lose the
    bound: the JIT guard's nested pipeline synced the budget's implicit transaction
    away before the ending ran."""
    caplog.set_level(logging.WARNING, logger="runrow")
    finished: list[bool] = []

    class Recorded(runrow.Observer):
        def run_finished(
            self, run: runrow.RunContext, *, status: str, seconds: float, recorded: bool
        ) -> None:
            finished.append(recorded)

    locker = await psycopg.AsyncConnection.connect(dsn)
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    host = str(params.get("host") or "127.0.0.1")
    proxy = Proxy("127.0.0.1" if host.startswith("/") else host, int(params.get("port") or 5432))

    async def waiting_on_locker() -> int:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
            (locker.info.backend_pid,),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    try:

        async def agent(run: runrow.RunContext) -> None:
            await locker.execute(
                sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(table(schema, "agent_run")),
                (run.run_id,),
            )

        async with anyio.create_task_group() as tg:
            port = await proxy.start(tg)
            proxied = psycopg.conninfo.make_conninfo(
                dsn, host="127.0.0.1", port=port, sslmode="disable", gssencmode="disable"
            )
            host_pool: AsyncConnectionPool[psycopg.AsyncConnection] | None = None
            if connections == "host_pool":
                host_pool = AsyncConnectionPool(
                    proxied, min_size=4, max_size=8, kwargs={"autocommit": True}, open=False
                )
                await host_pool.open(wait=True)
            d = runrow.Dispatcher(
                proxied if host_pool is None else host_pool,
                agent,
                schema=schema,
                finalize_timeout=1.0,
                notifications=False,
                observers=[Recorded()],
                prepared_statements=connections != "unprepared",
                **FAST,
            )
            async with d:
                run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
                await wait_for(waiting_on_locker, what="the ending waiting on the lock")
                proxy.refuse_new = True
                t0 = anyio.current_time()
                report = await d.stop(drain_timeout=0.2)
                took = anyio.current_time() - t0
                # Given up, and dead on the server: nothing of the ending still waits.
                assert await waiting_on_locker() == 0, "a given-up ending is still waiting on the server"
            if host_pool is not None:
                await host_pool.close(timeout=1.0)
            tg.cancel_scope.cancel()
        assert report.left_for_reaper == [run.id]
        assert report.interrupted == [] and report.finished == []
        assert finished == [False]
        assert took < 5  # about finalize_timeout, not drain + finalize budgets stacked
        assert any(
            f"finalize of run {run.id} given up: no attempt landed within finalize_timeout" in r.getMessage()
            for r in caplog.records
        )
    finally:
        await locker.rollback()
        await locker.close()
    # Lock the row ourselves: a write still queued for it would go first and commit.
    async with conn.transaction():
        cur = await conn.execute(
            sql.SQL("SELECT status FROM {} WHERE id = %s FOR UPDATE").format(table(schema, "agent_run")),
            (run.id,),
        )
        assert (await cur.fetchone()) == ("running",)  # the reaper's to end


async def _refuse_completions(conn: psycopg.AsyncConnection, schema: str) -> None:
    """From now on the server refuses every ending as completed (a trigger raises)."""
    await conn.execute(
        sql.SQL("""
        CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status = 'completed' THEN RAISE EXCEPTION 'injected refusal'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_completion BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {fn}();
    """).format(fn=sql.Identifier(schema, "refuse_completion"), t=table(schema, "agent_run"))
    )


async def test_the_ending_writers_session_bound_never_reaches_other_statements(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The ending writer's kept connection carries the ending's server-side bound for its
    session (statement_timeout and lock_timeout), so that an ending sent at once costs
    its statement alone. No other statement may run under that bound: the pool's other
    connections never carry it, nor does the kept one once it is given back (here after
    a refused ending): the bound is taken off first (or the connection closed)."""

    async def agent(run: runrow.RunContext) -> None:
        return None

    async def pool_settings(d: runrow.Dispatcher) -> list[tuple[str, str]]:
        # At least one connection (waiting for it if the pool is busy at this instant:
        # the claimer's poll and the lease keeper's beat borrow one now and then), then
        # every other one that is idle now.
        taken = [await d.pool.getconn(timeout=10.0)]
        try:
            while d.pool.get_stats().get("pool_available", 0) > 0:
                taken.append(await d.pool.getconn(timeout=1.0))
            found = []
            for c in taken:
                cur = await c.execute(
                    "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
                )
                found.append(await cur.fetchone())
            return found  # type: ignore[return-value]
        finally:
            for c in taken:
                await d.pool.putconn(c)

    # A pool of a fixed size, set up as the dispatcher sets up its own: one that may grow
    # would hand the writer a new connection whenever another service (the registry's
    # beat, a schedules pass) has borrowed the one the last part of this test offers it.
    pool: AsyncConnectionPool[psycopg.AsyncConnection] = AsyncConnectionPool(
        dsn, min_size=10, max_size=10, open=False, kwargs={"autocommit": True}, configure=configure_own
    )
    async with pool, runrow.Dispatcher(pool, agent, schema=schema, notifications=False, **FAST) as d:
        first = await runrow.enqueue(dsn, schema=schema, conversation_id="a", user_id="u", content=1)
        await wait_for(lambda: is_terminal(conn, schema, first.id), what="the first ending")
        # The pool hands the released connection to the ending writer again: its session no
        # longer carries the bound, so the next ending must set it again, not go alone. Other
        # services borrow and give back connections at any instant (the registry's beat, a
        # schedules pass), so the writer may be handed another one: each try is a whole
        # cycle (a refused ending lets the connection go, then the pool offers it back), and
        # the test fails if five tries in a row never hand the writer its old connection.
        for attempt in range(5):
            kept = d._parts.endings.conn._conn
            assert kept is not None
            cur = await kept.execute("SELECT current_setting('statement_timeout')")
            assert (await cur.fetchone()) != ("0",), "the kept connection carries no session bound"
            found = await pool_settings(d)
            assert found and all(f == ("0", "0") for f in found), found

            # A refused ending gives the kept connection back to the pool.
            claimed = d.get_stats()["claimed"]
            await _refuse_completions(conn, schema)
            refused = await runrow.enqueue(
                dsn, schema=schema, conversation_id=f"b{attempt}", user_id="u", content=1
            )
            await wait_for(
                lambda claimed=claimed: d.get_stats()["claimed"] == claimed + 1 and not d.in_flight,
                what="the refused run let go",
            )
            assert await status_of(conn, schema, refused.id) == "running"
            assert d._parts.endings.conn._conn is not kept
            if not kept.closed:
                cur = await kept.execute(
                    "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
                )
                assert await cur.fetchone() == ("0", "0"), "the kept connection went back with its bound"
            found = await pool_settings(d)
            assert found and all(f == ("0", "0") for f in found), found

            await conn.execute(
                sql.SQL("DROP TRIGGER refuse_completion ON {t}; DROP FUNCTION {fn}()").format(
                    t=table(schema, "agent_run"), fn=sql.Identifier(schema, "refuse_completion")
                )
            )
            assert not kept.closed  # a healthy connection: its bound came off, it went back open
            others = []
            try:
                # Hold every idle connection but that one (the writer may have taken others
                # since: a refused ending is written again alone after the claim it carried).
                taken = [
                    await d.pool.getconn(timeout=1.0) for _ in range(d.pool.get_stats()["pool_available"])
                ]
                while kept not in taken:  # borrowed for a moment by another service
                    taken.append(await d.pool.getconn(timeout=5.0))
                others = [c for c in taken if c is not kept]
                await d.pool.putconn(kept)
                again = await runrow.enqueue(
                    dsn, schema=schema, conversation_id=f"c{attempt}", user_id="u", content=1
                )
                await wait_for(
                    lambda again=again: is_terminal(conn, schema, again.id), what="the next ending"
                )
            finally:
                for c in others:
                    await d.pool.putconn(c)
            writer = d._parts.endings.conn._conn
            assert writer is not None
            cur = await writer.execute("SELECT current_setting('statement_timeout')")
            assert (await cur.fetchone()) != ("0",), "an ending went out on a pooled connection unbounded"
            if writer is kept:
                break
        else:
            pytest.fail("five tries, and the ending writer never took its old connection back")


async def test_a_clean_shutdown_logs_no_warning(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """Runs end, the dispatcher stops: nothing went wrong, so nothing is logged at
    WARNING or above, by runrow or by the pool (a connection handed back closed makes
    psycopg_pool warn "discarding closed connection")."""
    caplog.set_level(logging.WARNING)

    async def agent(run: runrow.RunContext) -> None:
        await run.text("hi")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST) as d:
        for k in range(3):
            await runrow.enqueue(dsn, schema=schema, conversation_id=f"c{k}", user_id="u", content=k)
        await wait_for(lambda: d.get_stats()["completed"] == 3, what="three endings")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def _noop(run: runrow.RunContext) -> None:
    return None


async def _stop_while_held(
    dsn: str, d: runrow.Dispatcher, locker: psycopg.AsyncConnection, what: str
) -> None:
    """With a service's statement waiting on ``locker``'s lock: the stop waits for it
    (not done 0.3 s on), and lands once the lock goes and the statement ends."""
    pid = locker.info.backend_pid
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watcher:
        await wait_for(lambda: blocked_by(watcher, pid), what=f"{what} to wait")
        stopped = anyio.Event()

        async def stop() -> None:
            await d.stop()
            stopped.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop)
            await anyio.sleep(0.3)
            assert not stopped.is_set(), f"the stop did not wait for {what} in flight"
            await locker.rollback()  # the statement goes on and ends; then the stop lands
            with anyio.fail_after(10):
                await stopped.wait()


async def test_a_stop_waits_for_a_services_statement_instead_of_cutting_it(
    dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The schema watch's read is held in flight (a lock on the version table) when the
    dispatcher stops: the stop lets the read finish and lands after it. (Cut by anyio's
    cancellation, psycopg's cancel request is interrupted too: the connection is closed
    with two warnings. Under load CI saw this from a clean shutdown.)"""
    caplog.set_level(logging.WARNING)
    async with await psycopg.AsyncConnection.connect(dsn) as locker:
        d = runrow.Dispatcher(dsn, _noop, schema=schema, **{**FAST, "heartbeat": 0.5})
        await d.__aenter__()
        try:
            await locker.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table(schema, "schema_version"))
            )
            await _stop_while_held(dsn, d, locker, "the schema watch's read")
        finally:
            await d.__aexit__(None, None, None)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_stop_waits_for_the_partition_upkeep_instead_of_cutting_it(
    dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The reaper's upkeep of the journal's partitions (at its start, then every few
    minutes) is held in flight (its advisory lock, taken here) when the dispatcher stops:
    as for the schema watch, the stop lets the statement end and lands after it, and
    nothing is logged. (Unshielded, the stop cut it: 'query cancellation interrupted'.)"""
    caplog.set_level(logging.WARNING)
    async with await psycopg.AsyncConnection.connect(dsn) as locker:
        await locker.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s || ':runrow.journal_partitions', 0))", (schema,)
        )
        d = runrow.Dispatcher(dsn, _noop, schema=schema, **FAST)
        await d.__aenter__()
        try:
            await _stop_while_held(dsn, d, locker, "the partition upkeep")
        finally:
            await d.__aexit__(None, None, None)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_rejected_ending_is_left_to_the_reaper(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """The server refuses the ending (here: a trigger): the worker does not retry a
    refusal, says so, lets the run go, and the reaper records it failed, exactly once."""
    caplog.set_level(logging.WARNING, logger="runrow")
    await _refuse_completions(conn, schema)

    async def agent(run: runrow.RunContext) -> None:
        return None

    # A short lease and grace: the test waits for the reap, not for its timing.
    async with runrow.Dispatcher(dsn, agent, schema=schema, **{**FAST, "lease": 1.0, "grace": 0.5}) as d:
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
        await wait_for(lambda: d.get_stats()["claimed"] == 1 and not d.in_flight, what="the run let go")
        assert await status_of(conn, schema, run.id) == "running"
        # lease 1 s + grace 0.5 s, then the reaper (every 0.2 s) ends it
        await wait_for(lambda: is_terminal(conn, schema, run.id), timeout=15, what="the reaper")
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "failed" and row["error"]["type"] == "worker_lost"
    evs = await assert_journal_sound(conn, schema, run.id)
    assert sum(1 for _, t, _ in evs if t == "complete") == 1
    assert d.get_stats()["completed"] == 0
    assert any(f"finalize of run {run.id} rejected" in r.getMessage() for r in caplog.records)


async def test_bad_configuration_is_refused(dsn: str, schema: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        return None

    with pytest.raises(runrow.ConfigurationError, match="half the lease"):
        runrow.Dispatcher(dsn, agent, schema=schema, lease=10, heartbeat=6)
    with pytest.raises(runrow.ConfigurationError):
        runrow.Dispatcher(dsn, agent, schema=schema, concurrency=0)
    with pytest.raises(runrow.ConfigurationError):
        runrow.Dispatcher(dsn, agent, schema=schema, poll=0)
    with pytest.raises(runrow.InvalidInput):
        runrow.Dispatcher(dsn, "not callable", schema=schema)  # type: ignore[arg-type]


def _sync_agent(run: runrow.RunContext) -> None:
    return None


async def _two_args(run: runrow.RunContext, extra: int) -> None:
    return None


async def _no_args() -> None:
    return None


class _SyncCallable:
    def __call__(self, run: runrow.RunContext) -> None:
        return None


@pytest.mark.parametrize(
    "agent",
    [_sync_agent, _two_args, _no_args, _SyncCallable(), lambda run: None],
    ids=["def", "two-args", "no-args", "sync-callable-object", "lambda"],
)
def test_an_agent_that_cannot_be_awaited_with_one_run_is_refused_at_once(agent: Any) -> None:
    """A plain function (or one with the wrong signature) used to be accepted, and then
    every run it was given failed with TypeError. It is refused when the Dispatcher is
    built, with a message that says what an agent must be."""
    with pytest.raises(runrow.InvalidInput, match=r"agent.*async def"):
        runrow.Dispatcher("dbname=unused", agent)


class _AsyncCallable:
    async def __call__(self, run: runrow.RunContext) -> None:
        return None


async def _with_default(run: runrow.RunContext, extra: int = 1) -> None:
    return None


@pytest.mark.parametrize(
    "agent",
    [_with_default, _AsyncCallable(), functools.partial(_two_args, extra=1)],
    ids=["default-arg", "async-callable-object", "partial"],
)
def test_every_async_agent_shape_is_accepted(agent: Any) -> None:
    runrow.Dispatcher("dbname=unused", agent)


@pytest.mark.parametrize(
    ("opt_in", "message", "expected"),
    [
        (None, "model exploded", "failed: ValueError: model exploded (details: runrow runs show {id})"),
        (False, "model exploded", "failed: ValueError (details: runrow runs show {id})"),
        (True, "model exploded", "failed: ValueError: model exploded (details: runrow runs show {id})"),
        # One line, at most 300 characters, however the agent wrote it.
        (True, "line one\n  line two", "failed: ValueError: line one line two (details: runrow runs"),
        (True, "x" * 1000, "failed: ValueError: " + "x" * 297 + "... (details: runrow runs"),
    ],
    ids=["message-by-default", "type-only-when-off", "on", "one-line", "cut-short"],
)
async def test_a_failed_run_logs_its_error(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    caplog: pytest.LogCaptureFixture,
    opt_in: bool | None,
    message: str,
    expected: str,
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        raise ValueError(message)

    with caplog.at_level(logging.INFO, logger="runrow.dispatcher"):
        switch = {} if opt_in is None else {"log_error_messages": opt_in}
        async with runrow.Dispatcher(dsn, agent, schema=schema, **switch, **FAST):
            run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
            await wait_for(lambda: is_terminal(conn, schema, run.id), what="terminal")
            await wait_for(
                lambda: any(f"run {run.id} failed" in r.getMessage() for r in caplog.records),
                what="the log line",
            )
    (line,) = [r for r in caplog.records if f"run {run.id} failed" in r.getMessage()]
    # By default the line says what failed it, type and message, on one short line, and
    # where to read the rest. log_error_messages=False keeps the message (which may quote
    # a user) out of logs, in the row only (tests/test_logging.py).
    assert expected.format(id=run.id) in line.getMessage()
    assert (message[:8] in line.getMessage()) is (opt_in is not False)
    assert "\n" not in line.getMessage() and len(line.getMessage()) < 450
    assert line.levelno == logging.WARNING


@pytest.mark.parametrize(
    ("held", "what"),
    [("message", "a transcript write (write_message)"), ("run_step", "a step's record (run.step)")],
    ids=["transcript-write", "step-record"],
)
async def test_a_write_that_outlives_its_budget_fails_the_run_with_an_error_that_names_it(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, held: str, what: str
) -> None:
    """The budget's deadline used to surface as a bare TimeoutError, recorded with an
    empty message: the run's row (and the log line) then said nothing about what timed
    out. It is still a TimeoutError (a retry policy's retry_on matches it as before)."""
    go = anyio.Event()
    seen: list[BaseException] = []

    async def agent(run: runrow.RunContext) -> None:
        await go.wait()
        try:
            if held == "message":
                await run.write_message("the answer")
            else:
                await run.step("lookup", lambda: 42)
        except BaseException as exc:
            seen.append(exc)
            raise

    settings = {**FAST, "lease": 3.0, "heartbeat": 0.3}  # each write may take lease / 2 = 1.5 s
    async with (
        await psycopg.AsyncConnection.connect(dsn) as locker,
        runrow.Dispatcher(dsn, agent, schema=schema, **settings),
    ):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")

        async def claimed() -> bool:
            return await status_of(conn, schema, run.id) == "running"

        await wait_for(claimed, what="the claim")
        # The write's table is locked until the write has given up: it cannot land.
        await locker.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(table(schema, held)))
        go.set()
        await wait_for(lambda: seen, what="the write to give up")
        await locker.rollback()
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the ending")
    assert isinstance(seen[0], TimeoutError)
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "failed"
    assert row["error"]["type"] == "TimeoutError"
    assert row["error"]["message"] == (
        f"{what} did not land within 1.5s (half the lease): the database was slow or unreachable"
    )


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize(
    "option", ["lease", "heartbeat", "grace", "poll", "reap_interval", "flush_interval", "finalize_timeout"]
)
async def test_timing_options_must_be_finite(option: str, value: float) -> None:
    """lease=inf used to be accepted (its claims then never expire and the claim loop's
    deadline is infinite), and reap_interval was not checked at all."""

    async def agent(run: runrow.RunContext) -> None:
        return None

    with pytest.raises(runrow.ConfigurationError, match=f"{option} must be a finite"):
        runrow.Dispatcher("dbname=unused", agent, **{option: value})
    with pytest.raises(runrow.ConfigurationError, match="reap_interval must be a finite"):
        runrow.Dispatcher("dbname=unused", agent, reap_interval=0)


async def test_finalize_timeout_must_leave_the_ending_time_to_land_before_the_reaper() -> None:
    """The lease is not rolled once a run's ending is handed over, and was last rolled up
    to 2 x heartbeat before; so the reaper may take the run lease + grace - 2 x heartbeat
    after the hand-over. A finalize_timeout past that would let a live worker's ending be
    reaped while it is still in flight."""

    async def agent(run: runrow.RunContext) -> None:
        return None

    timing = {"lease": 2.0, "heartbeat": 0.2, "grace": 1.0}  # bound: 2 + 1 - 0.4 = 2.6
    with pytest.raises(runrow.ConfigurationError, match=r"finalize_timeout \(2.7s\) must be at most 2.6s"):
        runrow.Dispatcher("dbname=unused", agent, finalize_timeout=2.7, **timing)
    assert (
        runrow.Dispatcher("dbname=unused", agent, finalize_timeout=2.6, **timing).settings.finalize_timeout
        == 2.6
    )
    # Unset, it is 10 s, or the bound if that is shorter.
    assert runrow.Dispatcher("dbname=unused", agent, **timing).settings.finalize_timeout == pytest.approx(2.6)
    assert runrow.Dispatcher("dbname=unused", agent).settings.finalize_timeout == 10.0


async def test_dispatcher_refuses_an_unmigrated_schema(dsn: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        return None

    with pytest.raises(runrow.SchemaOutOfDate, match="runrow migrate"):
        async with runrow.Dispatcher(dsn, agent, schema=f"nope_{uuid.uuid4().hex[:6]}"):
            pass


class _DeafHub(runrow.NotifyHub):
    """A hub whose subscriptions fail: a service that needs one fails as it starts."""

    def subscribe(self, *channels: str) -> Any:
        raise RuntimeError("no LISTEN today")


async def test_a_start_that_fails_half_way_leaves_nothing_running(dsn: str, schema: str) -> None:
    """The wake forwarder fails as it starts, after the writers, the heartbeat and the
    reaper are already running: the dispatcher must stop them, leave its task group and
    close its own pool before the error reaches the host, as if it had never started."""

    async def agent(run: runrow.RunContext) -> None:
        return None

    d = runrow.Dispatcher(dsn, agent, schema=schema, hub=_DeafHub(dsn), poll=0.2, reap_interval=0.05)
    with pytest.raises(RuntimeError, match="no LISTEN today"):
        async with d:
            pass
    assert d._parts is not None
    running = d._parts.services._running
    assert {"appends", "endings", "heartbeat", "reaper"} <= set(running)
    assert all(r.done.is_set() for r in running.values()), "a service is still running"
    assert d._tg is None
    assert d._pool is not None and d._pool.closed


async def test_a_stop_before_the_start_does_not_spoil_the_drain(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """stop() on a dispatcher that never started has nothing to drain; it used to keep its
    empty report, and the real shutdown later returned it without draining anything.
    (The run is held through the drain, so the report must name it: released before the
    stop, it could end before the drain looked, and the report rightly left it out.)"""

    async def agent(run: runrow.RunContext) -> None:
        await anyio.sleep_forever()

    d = runrow.Dispatcher(dsn, agent, schema=schema, **FAST)
    assert await d.stop() == runrow.DrainReport()
    async with d:
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(lambda: run.id in d.in_flight, what="the run to start")
        report = await d.stop(drain_timeout=0.2)
    assert report == runrow.DrainReport(interrupted=[run.id])
    assert await status_of(conn, schema, run.id) == "failed"


async def test_invalid_events_are_rejected_and_the_run_fails(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    errors: list[str] = []

    async def agent(run: runrow.RunContext) -> None:
        for bad in (
            {"no": "type"},
            {"type": "complete"},
            {"type": "content_delta", "delta": 3},
            {"type": "x", "v": "nul\x00"},
            {"type": "x", "v": object()},
        ):
            try:
                await run.emit(bad)
            except runrow.InvalidInput as exc:
                errors.append(exc.field)

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="terminal")
    assert errors == ["event"] * 5
    assert await status_of(conn, schema, run.id) == "completed"


async def test_stop_works_in_any_order_and_inside_the_hosts_own_scopes(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    ran: list[object] = []

    async def agent(run: runrow.RunContext) -> None:
        ran.append(run.content)

    settings = {**FAST, "poll": 0.2}  # a short tick: the negative check below waits past one
    async with (
        runrow.Dispatcher(dsn, agent, schema=schema, **settings) as first,
        runrow.Dispatcher(dsn, agent, schema=schema, **settings) as second,
    ):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(lambda: ran == ["x"], what="the run")
        with anyio.move_on_after(30):  # a host's own cancel scope around the stop
            assert (await first.stop()).left_for_reaper == []
        assert (await second.stop()).left_for_reaper == []
        late = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="late")
        # A negative check, so a fixed wait: past a claim tick (the enqueue's wake would
        # act at once), and neither stopped dispatcher may claim it.
        await anyio.sleep(1.5 * settings["poll"])
    assert await status_of(conn, schema, run.id) == "completed"
    assert await status_of(conn, schema, late.id) == "queued"


# A lease long enough that the reaper cannot be what ends a run within a test's wait.
SLOW_REAPER = {**FAST, "lease": 30.0, "heartbeat": 10.0, "grace": 30.0}


@pytest.mark.parametrize("bad_type", ["bad\ud800", "x\x00"], ids=["lone-surrogate", "nul"])
async def test_a_bad_event_type_fails_its_own_run_at_once(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, bad_type: str
) -> None:
    """An event type that is not an identifier is refused at emit (InvalidInput); an
    agent that lets the error escape fails its run at once, not through the reaper (#17)."""

    async def agent(run: runrow.RunContext) -> None:
        await run.text("so far")
        await run.emit({"type": bad_type})

    async with runrow.Dispatcher(dsn, agent, schema=schema, **SLOW_REAPER):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(lambda: is_terminal(conn, schema, run.id), timeout=8, what="the run to fail")
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "failed"
    assert row["error"]["type"] == "InvalidInput" and "type" in row["error"]["message"], row["error"]
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2]["status"] == "failed" and "reason" not in evs[-1][2]  # its worker's ending
    msgs = await runrow.transcript(dsn, "c", schema=schema)
    assert [(m.content, m.status) for m in msgs if m.role == "assistant"] == [("so far", "partial")]


async def test_an_item_the_journal_writer_cannot_encode_fails_alone_not_its_batch(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Two tenants' runs share a group-commit batch of the journal writer; one item
    cannot be encoded (fed to the writer directly: emit refuses it now). Only that item
    fails; the other tenant's rows land and both runs end normally (#17)."""
    gate = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        await gate.wait()

    async with runrow.Dispatcher(dsn, agent, schema=schema, **SLOW_REAPER) as d:
        a = await runrow.enqueue(
            dsn, schema=schema, conversation_id="ca", user_id="u", content=1, tenant_id="A"
        )
        b = await runrow.enqueue(
            dsn, schema=schema, conversation_id="cb", user_id="u", content=2, tenant_id="B"
        )

        def started() -> bool:  # (in flight once claimed; a run's journal comes as it starts)
            runs = d._parts.roster.runs
            return all(r in runs and runs[r].journal is not None for r in (a.id, b.id))

        await wait_for(started, what="both runs started")
        ra, rb = d._parts.roster.runs[a.id], d._parts.roster.runs[b.id]
        ja, jb = ra.journal, rb.journal
        assert ja is not None and jb is not None
        answers: dict[str, tuple[object, BaseException | None]] = {}
        batches = d._parts.appender.writer.batches
        # Handed over with no await in between: the writer takes them as one batch.
        d._parts.appender.writer.hand_over(
            Appended(a.id, ra.token, [(ja.next_seq, "bad\ud800", "{}")]),
            lambda r, e: answers.__setitem__("a", (r, e)),
        )
        d._parts.appender.writer.hand_over(
            Appended(b.id, rb.token, [(jb.next_seq, "fine", '{"v":1}')]),
            lambda r, e: answers.__setitem__("b", (r, e)),
        )
        await wait_for(lambda: len(answers) == 2, what="both items answered")
        assert d._parts.appender.writer.batches == batches + 1  # they did share one batch
        assert answers["b"] == (True, None), answers
        assert answers["a"][0] is None and isinstance(answers["a"][1], UnicodeEncodeError), answers
        jb.next_seq += 1  # the row fed directly is B's now
        gate.set()
        await wait_for(lambda: _all_terminal(conn, schema, [a, b]), timeout=8, what="both runs to end")
    for r in (a, b):
        assert await status_of(conn, schema, r.id) == "completed"
    evs_b = await assert_journal_sound(conn, schema, b.id)
    assert (evs_b[2][1], evs_b[2][2]) == ("fine", {"v": 1})
    assert [t for _, t, _ in await assert_journal_sound(conn, schema, a.id)] == [
        "user_message_created",
        "run_queued",
        "complete",
    ]


async def test_a_flush_the_database_refuses_leaves_the_journal_usable(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Rows refused for their content (by the driver before sending, or by the server)
    certainly did not land: the agent gets InvalidInput, the journal's numbering still
    holds, and the run carries on and ends normally (#17). The refused row is fed past
    emit's checks, which refuse it now."""
    refused: list[BaseException] = []

    async def agent(run: runrow.RunContext) -> None:
        try:
            await run._journal.flush(extra=("bad\ud800", {}))
        except Exception as exc:
            refused.append(exc)
        await run.emit({"type": "after", "ok": True})

    async with runrow.Dispatcher(dsn, agent, schema=schema, **SLOW_REAPER):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(lambda: is_terminal(conn, schema, run.id), timeout=8, what="the run to end")
    assert len(refused) == 1 and isinstance(refused[0], runrow.InvalidInput), refused
    assert await status_of(conn, schema, run.id) == "completed"
    evs = await assert_journal_sound(conn, schema, run.id)
    assert [t for _, t, _ in evs] == ["user_message_created", "run_queued", "after", "complete"]


async def test_an_agent_raising_cancelled_error_itself_fails_its_run_at_once(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """A CancelledError runrow did not ask for (the agent awaited a future that someone
    else cancelled) fails the run at once with agent_cancelled, keeps the partial answer,
    is logged, and the conversation's next turn starts without waiting for the reaper (#17)."""
    caplog.set_level(logging.WARNING, logger="runrow")

    async def agent(run: runrow.RunContext) -> None:
        if run.content == "next":
            return
        await run.text("half an answer")
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.cancel)  # someone else's cancellation
        await future

    async with runrow.Dispatcher(dsn, agent, schema=schema, **SLOW_REAPER) as d:
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        nxt = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="next")
        await wait_for(lambda: is_terminal(conn, schema, nxt.id), timeout=8, what="both turns to end")
        # (The counters follow the commit: the writer's callback runs once the batch returns.)
        await wait_for(
            lambda: d.get_stats()["failed"] == 1 and d.get_stats()["completed"] == 1, what="both counted"
        )
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "failed" and row["error"]["type"] == "agent_cancelled", row["error"]
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2]["error"]["type"] == "agent_cancelled" and "reason" not in evs[-1][2]
    assert await status_of(conn, schema, nxt.id) == "completed"
    msgs = await runrow.transcript(dsn, "c", schema=schema)
    assert [(m.content, m.status) for m in msgs if m.role == "assistant"] == [("half an answer", "partial")]
    assert any(
        f"run {run.id}" in r.getMessage() and "CancelledError" in r.getMessage() for r in caplog.records
    )


async def test_runrow_s_own_cancellations_still_end_as_before(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The other side of the line: a stop still ends the run cancelled, a deadline
    still ends it deadline_exceeded, even when the agent re-raises the CancelledError."""

    async def agent(run: runrow.RunContext) -> None:
        try:
            await anyio.sleep_forever()
        except asyncio.CancelledError:
            raise

    async with runrow.Dispatcher(dsn, agent, schema=schema, **SLOW_REAPER) as d:
        stopped = await runrow.enqueue(dsn, schema=schema, conversation_id="s", user_id="u", content="x")
        late = await runrow.enqueue(
            dsn, schema=schema, conversation_id="d", user_id="u", content="x", deadline=timedelta(seconds=0.5)
        )
        await wait_for(lambda: stopped.id in d.in_flight, what="running")
        await runrow.cancel_run(dsn, stopped.id, schema=schema)
        await wait_for(lambda: _all_terminal(conn, schema, [stopped, late]), timeout=8, what="both to end")
    assert await status_of(conn, schema, stopped.id) == "cancelled"
    row = await run_row(conn, schema, late.id)
    assert row["status"] == "failed" and row["error"]["type"] == "deadline_exceeded"
