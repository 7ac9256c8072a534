"""Stop means stop: one transaction for a conversation, cooperative cancel of the running turn."""

from __future__ import annotations

import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._hub import RECONNECTED

from . import manual
from .helpers import assert_journal_sound, events, is_terminal, run_row, status_of, table, wait_for

pytestmark = pytest.mark.anyio
FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}
# A heartbeat too slow to be what delivers a stop within a test's wait.
SLOW_HEARTBEAT = {**FAST, "lease": 30.0, "heartbeat": 10.0, "grace": 30.0}


async def test_stop_cancels_queued_turns_returns_drafts_and_stops_the_running_one(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    seen_cancel: list[bool] = []

    async def agent(run: runrow.RunContext) -> None:
        await run.text("half an ans")
        await run.flush()
        try:
            await anyio.sleep_forever()
        finally:
            seen_cancel.append(run.cancel_requested)

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST) as d:
        first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="one")
        q1 = await runrow.enqueue(
            dsn, schema=schema, conversation_id="c", user_id="u", content={"text": "two"}
        )
        q2 = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="three")
        other = await runrow.enqueue(dsn, schema=schema, conversation_id="other", user_id="u", content="x")
        await wait_for(lambda: first.id in d.in_flight, what="the first turn to run")
        result = await runrow.stop_conversation(dsn, "c", schema=schema)
        assert result.cancelled == [q1.id, q2.id]
        assert result.cancel_requested == [first.id]
        assert [(dr.run_id, dr.content) for dr in result.drafts] == [
            (q1.id, {"text": "two"}),
            (q2.id, "three"),
        ]
        await wait_for(lambda: is_terminal(conn, schema, first.id), what="the running turn to stop")
        assert other.id in d.in_flight  # another conversation is not touched
        await runrow.stop_conversation(dsn, "other", schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, other.id), what="the other conversation to stop")
    assert seen_cancel == [True, True]
    row = await run_row(conn, schema, first.id)
    assert row["status"] == "cancelled" and row["cancel_requested"]
    evs = await assert_journal_sound(conn, schema, first.id)
    assert evs[-1][2] == {"status": "cancelled", "reason": "stopped"}
    for q in (q1, q2):
        assert await status_of(conn, schema, q.id) == "cancelled"
        assert (await run_row(conn, schema, q.id))["started_at"] is None  # never started
        qevs = await assert_journal_sound(conn, schema, q.id)
        assert qevs[-1][2] == {"status": "cancelled", "reason": "stopped_before_start"}
    # The partial answer stays; the drafts leave the transcript.
    msgs = await runrow.transcript(dsn, "c", schema=schema)
    assert [(m.role, m.content, m.status) for m in msgs] == [
        ("user", "one", "sent"),
        ("assistant", "half an ans", "partial"),
    ]


async def test_stopping_a_finished_run_or_idle_conversation_is_a_noop(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema)
    assert await manual.finalize(conn, schema, run.id, claimed["claim_token"], "completed", 3)
    assert (await runrow.cancel_run(dsn, run.id, schema=schema)).noop
    assert (await runrow.stop_conversation(dsn, "c", schema=schema)).noop
    assert (await runrow.stop_conversation(dsn, "never-seen", schema=schema)).noop
    assert await status_of(conn, schema, run.id) == "completed"
    assert len(await events(conn, schema, run.id)) == 3
    with pytest.raises(runrow.RunNotFound):
        await runrow.cancel_run(dsn, uuid.uuid4(), schema=schema)
    with pytest.raises(runrow.InvalidInput):
        await runrow.stop_conversation(dsn, "", schema=schema)


async def test_cancel_run_on_a_queued_run_returns_its_draft(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="never mind")
    result = await runrow.cancel_run(dsn, str(run.id), schema=schema)
    assert result.cancelled == [run.id] and [dr.content for dr in result.drafts] == ["never mind"]
    assert await status_of(conn, schema, run.id) == "cancelled"
    # A cancelled run can be retried by a person; the draft becomes a sent message again.
    again = await runrow.retry_run(dsn, run.id, schema=schema)
    assert [m.content for m in await runrow.transcript(dsn, "c", schema=schema)] == ["never mind"]
    assert again.status == "queued"


@pytest.mark.parametrize("notifications", [True, False], ids=["hub", "poll"])
async def test_cancel_reaches_the_agent_fast_with_the_hub_and_within_a_heartbeat_without(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, notifications: bool
) -> None:
    cancelled_at: list[float] = []

    async def agent(run: runrow.RunContext) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            cancelled_at.append(anyio.current_time())

    heartbeat = 0.5
    async with runrow.Dispatcher(
        dsn, agent, schema=schema, notifications=notifications, **{**FAST, "heartbeat": heartbeat}
    ) as d:
        if notifications:
            await wait_for(lambda: d.hub is not None and d.hub.connected, what="hub")
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(lambda: run.id in d.in_flight, what="running")
        asked = anyio.current_time()
        await runrow.cancel_run(dsn, run.id, schema=schema)
        await wait_for(lambda: cancelled_at, timeout=5, what="the agent to be cancelled")
    latency = cancelled_at[0] - asked
    # With the hub: a NOTIFY round trip (the benchmark measures p50/p99). Without: the
    # heartbeat re-reads the flag, so at most one heartbeat (plus scheduling slack).
    assert latency < (1.0 if notifications else heartbeat + 1.0), latency
    assert await status_of(conn, schema, run.id) == "cancelled"


async def test_a_closed_client_connection_is_not_a_stop(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    gate = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        await run.text("streaming")
        await run.flush()
        await gate.wait()

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as viewer:
            async for ev in runrow.tail(viewer, run.id, schema=schema):
                if ev.type == "content_delta":
                    break  # the browser tab closes
        gate.set()
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run to finish anyway")
    assert await status_of(conn, schema, run.id) == "completed"


async def test_stop_racing_the_running_turn_finishing_200_times(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Whatever the timing, no queued turn starts after the stop, and every run ends exactly once.

    Each turn must be exactly one of: cancelled by the stop (never started), running at
    the stop (asked to stop), or finished before the stop committed.
    """
    rng = random.Random(7)

    async def agent(run: runrow.RunContext) -> None:
        # Even rounds hold turn 1 long enough for the stop to find queued turns behind
        # it; odd rounds are left to chance, so stops also land around each ending.
        held = run.content == 0 and int(run.conversation_id.split("-")[1]) % 2 == 0
        await anyio.sleep(0.1 if held else rng.random() * 0.008)

    rounds = []
    stopper = await psycopg.AsyncConnection.connect(dsn, autocommit=True)  # no connect in the race window
    async with stopper, runrow.Dispatcher(dsn, agent, schema=schema, concurrency=4, **FAST) as d:
        for i in range(200):
            conv = f"race-{i}"
            turns = [
                await runrow.enqueue(dsn, schema=schema, conversation_id=conv, user_id="u", content=k)
                for k in range(3)
            ]
            await wait_for(
                lambda t=turns: t[0].id in d.in_flight or is_terminal(conn, schema, t[0].id),
                interval=0.001,
                what="turn 1 to start",
            )
            if i % 2:
                await anyio.sleep(rng.random() * 0.012)
            result = await runrow.stop_conversation(stopper, conv, schema=schema)
            stopped_by = await manual.db_now(conn)  # a later transaction: after the stop's commit
            rounds.append((turns, result, stopped_by))
        await wait_for(lambda: not d.in_flight, what="all running turns to end")
    ids = [t.id for turns, _, _ in rounds for t in turns]
    cur = await conn.execute(
        sql.SQL("SELECT id, status, started_at, finished_at FROM {} WHERE id = ANY(%s)").format(
            table(schema, "agent_run")
        ),
        (ids,),
    )
    state = {r[0]: r[1:] for r in await cur.fetchall()}
    cur = await conn.execute(
        sql.SQL(
            "SELECT run_id, count(*) FILTER (WHERE type = 'complete'), max(seq), count(*), "
            "max(seq) FILTER (WHERE type = 'complete') FROM {} WHERE run_id = ANY(%s) GROUP BY run_id"
        ).format(table(schema, "run_event")),
        (ids,),
    )
    journal = {r[0]: r[1:] for r in await cur.fetchall()}
    kinds: dict[str, int] = {"cancelled": 0, "stopped while running": 0, "finished before": 0}
    for turns, result, stopped_by in rounds:
        for t in turns:
            status, started, finished = state[t.id]
            assert status in ("completed", "cancelled", "failed") and finished is not None
            terminals, max_seq, n, terminal_seq = journal[t.id]
            assert terminals == 1 and max_seq == n == terminal_seq  # one ending, last, gap-free
            if t.id in result.cancelled:
                assert started is None and status == "cancelled"
                kinds["cancelled"] += 1
            elif t.id in result.cancel_requested:
                assert started is not None and started < stopped_by
                kinds["stopped while running"] += 1
            else:
                assert finished < stopped_by, (t, state[t.id], stopped_by)
                kinds["finished before"] += 1
    # The race really happened: every kind of outcome showed up.
    assert all(kinds.values()), kinds


async def test_a_stop_that_lands_during_a_drain_still_ends_the_run_cancelled(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    unwinding = anyio.Event()
    gate = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):  # a slow clean-up after the drain's cut
                unwinding.set()
                await gate.wait()
            raise

    d = runrow.Dispatcher(dsn, agent, schema=schema, **FAST)
    async with d:
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(lambda: run.id in d.in_flight, what="running")
        async with anyio.create_task_group() as tg:
            tg.start_soon(d.stop, 0.05)  # the drain budget runs out at once
            await unwinding.wait()
            try:
                await runrow.stop_conversation(dsn, "c", schema=schema)  # the user presses Stop
                await wait_for(
                    lambda: d._parts.roster.runs[run.id].reason == "cancel",
                    timeout=5,
                    what="the stop to be seen",
                )
            finally:
                gate.set()
    assert await status_of(conn, schema, run.id) == "cancelled"
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2] == {"status": "cancelled", "reason": "stopped"}


async def _stop_right_after_the_claim(
    d: runrow.Dispatcher, race: Callable[[list[Any]], Awaitable[None]]
) -> list[bool]:
    """Makes a running dispatcher's next claim that takes runs, once it has committed and
    before the claimed runs are registered, let the test commit a real stop and wait
    until the stop's NOTIFY has been handled by the cancel watcher: the race, made
    deterministic. The returned flag is set once the race ran.

    Returns once the claim loop has entered the wrapped claim: a claim already in flight
    when the wrapper went in (the loop claims on every poll tick) could otherwise take a
    run enqueued right after, without the race."""
    claimer = d._parts.claimer
    plain = claimer._claim
    ran = [False]
    entered = anyio.Event()

    async def claim(limit: int) -> list[Any]:
        entered.set()
        rows = await plain(limit)
        if rows and not ran[0]:
            ran[0] = True
            await race(rows)
        return rows

    claimer._claim = claim  # type: ignore[method-assign]
    with anyio.fail_after(10):
        await entered.wait()  # (the idle claim loop ticks every poll: 0.5 s here)
    return ran


async def test_a_stop_committed_between_claim_and_registration_is_not_lost(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The stop's NOTIFY reaches the worker before it has registered the run it just
    claimed; the stop must still reach the agent at once, not at the next heartbeat (#17)."""
    started = anyio.Event()
    cancelled_at: list[float] = []

    async def agent(run: runrow.RunContext) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled_at.append(anyio.current_time())

    d = runrow.Dispatcher(dsn, agent, schema=schema, **SLOW_HEARTBEAT)
    async with d:
        hub = d.hub
        assert hub is not None
        channel = d.settings.channels.cancel
        async with hub.subscribe(channel) as mine:
            await wait_for(lambda: hub.connected, what="the hub")
            assert await mine.receive() == RECONNECTED

            async def race(rows: list[Any]) -> None:
                run_id = rows[0].id
                assert run_id not in d.in_flight  # claimed, committed, not yet registered
                result = await runrow.cancel_run(dsn, run_id, schema=schema)
                assert result.cancel_requested == [run_id]
                with anyio.fail_after(5):
                    while await mine.receive() != str(run_id):
                        pass
                # The same hint went to the watcher; wait until it has handled it (its
                # buffer is empty and it waits for the next one).
                (watcher,) = [s for s in hub._subs[channel] if s is not mine]
                await wait_for(
                    lambda: not watcher._hints and len(watcher._waiters) == 1,
                    what="the watcher to handle the stop's NOTIFY",
                )

            ran = await _stop_right_after_the_claim(d, race)
            run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
            asked = anyio.current_time()
            await wait_for(lambda: is_terminal(conn, schema, run.id), timeout=5, what="the stop to end it")
    assert ran[0]  # the race did run
    assert await status_of(conn, schema, run.id) == "cancelled"
    assert not started.is_set() or cancelled_at[0] - asked < 5
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2] == {"status": "cancelled", "reason": "stopped"}


async def test_a_run_claimed_with_its_cancel_flag_set_is_cancelled_without_running(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The claim returns cancel_requested; a run claimed with it already true ends
    cancelled at once, and its agent is never called (#17)."""
    ran: list[uuid.UUID] = []

    async def agent(run: runrow.RunContext) -> None:
        ran.append(run.run_id)
        await anyio.sleep_forever()

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    await conn.execute(
        sql.SQL("UPDATE {} SET cancel_requested = true WHERE id = %s").format(table(schema, "agent_run")),
        (run.id,),
    )
    async with runrow.Dispatcher(dsn, agent, schema=schema, **SLOW_HEARTBEAT) as d:
        await wait_for(lambda: is_terminal(conn, schema, run.id), timeout=5, what="the run to be cancelled")
        assert d.get_stats()["claimed"] == 1
    assert ran == []
    assert await status_of(conn, schema, run.id) == "cancelled"
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2] == {"status": "cancelled", "reason": "stopped"}


async def test_an_agent_that_fails_once_the_stop_reached_it_ends_cancelled(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A stop reaches the agent inside a shielded write that then fails (a timeout, a cut
    connection): the agent raises instead of being cancelled. The user asked to stop, and
    the run ends cancelled, not failed (seen once in the long chaos run)."""
    seen: list[runrow.RunContext] = []
    go = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        seen.append(run)
        with anyio.CancelScope(shield=True):  # as write_message shields its write
            await go.wait()
            raise TimeoutError("the write outlived its budget")

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, agent, schema=schema, poll=0.1, heartbeat=0.2, lease=2.0) as d:
        await wait_for(lambda: seen, what="the agent to start")
        assert (await runrow.cancel_run(dsn, run.id, schema=schema)).cancel_requested == [run.id]
        await wait_for(lambda: seen[0].cancel_requested, what="the stop to reach the worker")
        go.set()
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run to end")
        # (The counter follows the commit: the writer's callback runs once the batch returns.)
        await wait_for(lambda: d.get_stats()["cancelled"] == 1, what="the run counted cancelled")
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "cancelled" and row["error"] is None
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2] == {"status": "cancelled", "reason": "stopped"}


async def test_a_failure_that_meets_a_stop_the_worker_never_saw_is_recorded_cancelled(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The stop commits, and the agent raises before the worker hears of it (its
    notification and its next heartbeat are still to come). The ending the worker asks
    for is `failed`; the database records the stop's `cancelled`, as the reaper would
    (seen twice in the long chaos run, under a proxy delay that timed out a write)."""
    go = anyio.Event()
    started = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        await run.text("partial ")
        started.set()
        await go.wait()
        raise TimeoutError("the write outlived its budget")

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    # Long heartbeats and no notification: the stop cannot reach the worker in time.
    async with runrow.Dispatcher(
        dsn, agent, schema=schema, poll=0.1, heartbeat=10.0, lease=60.0, notifications=False
    ) as d:
        await started.wait()
        await conn.execute(
            sql.SQL("UPDATE {} SET cancel_requested = true WHERE id = %s").format(table(schema, "agent_run")),
            (run.id,),
        )
        go.set()
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run to end")
        await wait_for(lambda: d.get_stats()["cancelled"] == 1, what="the run counted cancelled")
        assert d.get_stats()["failed"] == 0
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "cancelled" and row["error"] is None
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][1:] == ("complete", {"status": "cancelled", "reason": "stopped"})


async def test_a_stopped_failure_is_not_retried_and_reads_back_as_cancelled(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """At the statement: a retryable failure of a run whose stop is asked for lands as
    cancelled with no retry, and a worker whose answer was lost reads back that its own
    ending landed, as cancelled (sql/endings.sql finalize and ending_landed)."""
    from runrow._gateway import _exec, endings

    from .test_retry import NOW

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema, lease=60, retry_policy=NOW.stamp())
    assert (await runrow.cancel_run(dsn, run.id, schema=schema)).cancel_requested == [run.id]
    seq = int(claimed["last_seq"]) + 1
    error = {"type": "TimeoutError", "message": "slow"}
    ending = endings.Ending(
        run_id=run.id,
        claim_token=claimed["claim_token"],
        status="failed",
        error=runrow._json.dumps(error, "error"),
        partial="partial",
        events=[(seq, "complete", runrow._json.dumps({"status": "failed", "error": error}, "event"))],
        retry=True,
    )
    channels = runrow._names.Channels.for_schema(schema)
    assert await endings.finalize(conn, schema, [ending], channels=channels) == {run.id: "cancelled"}
    assert await endings.finalize(conn, schema, [ending], channels=channels) == {}  # sticky
    assert await _exec.run(conn, endings.landed(schema, ending)) == "cancelled"
    runs = await runrow.list_runs(dsn, schema=schema, conversation_id="c")
    assert [(r.id, r.status) for r in runs] == [(run.id, "cancelled")]  # no retry queued
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1] == (seq, "complete", {"status": "cancelled", "reason": "stopped"})
