"""The reaper: runs whose worker is gone end honestly, once, and the next turn starts.

Every test of the reaper lives here (its module is ``runrow._engine.reaper``, its SQL
``reap_candidates`` and ``reap`` behind ``runrow._gateway.reaper``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest

import runrow
from runrow import _json, testing
from runrow._engine.flight import DEADLINE_ERROR
from runrow._engine.reaper import reap_expired
from runrow._gateway import _exec, endings

from . import manual
from .helpers import (
    assert_journal_sound,
    enqueue_turn,
    is_terminal,
    run_row,
    status_of,
    wait_for,
)

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}


async def _reap(conn: psycopg.AsyncConnection, schema: str, run_id: object) -> list[object]:
    row = await run_row(conn, schema, run_id)
    now = row["claim_expires_at"] + timedelta(seconds=10)
    ids = await manual.reap_candidates(conn, schema, grace=5, now=now)
    return list(await manual.reap(conn, schema, ids, grace=5, now=now))


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


async def test_reaped_run_lists_tool_calls_that_started_and_never_finished(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema, worker_id="doomed")
    token = claimed["claim_token"]
    assert await manual.append(
        conn,
        schema,
        run.id,
        token,
        [
            (3, "tool_call_started", {"tool_call_id": "t1", "name": "search"}),
            (4, "tool_call_finished", {"tool_call_id": "t1", "name": "search", "ok": True}),
            (5, "tool_call_started", {"tool_call_id": "t2", "name": "send_email", "args": {"to": "x"}}),
            (6, "tool_call_started", {"tool_call_id": "t3", "name": "charge_card"}),
            (7, "tool_call_started", {"name": "no id: cannot be matched, not listed"}),
            (8, "content_delta", {"delta": "sending..."}),
        ],
    )
    assert await _reap(conn, schema, run.id) == [run.id]
    evs = await assert_journal_sound(conn, schema, run.id)
    end = evs[-1][2]
    assert end["status"] == "failed" and end["reason"] == "worker_lost"
    assert end["error"]["type"] == "worker_lost"
    assert end["uncertain_tool_calls"] == [
        {"tool_call_id": "t2", "name": "send_email"},
        {"tool_call_id": "t3", "name": "charge_card"},
    ]


async def test_a_reaped_run_without_tool_calls_says_so(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    await manual.claim(conn, schema, worker_id="doomed")
    assert await _reap(conn, schema, run.id) == [run.id]
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2]["uncertain_tool_calls"] == [] and evs[-1][2]["reason"] == "worker_lost"


async def test_a_reaped_run_that_was_being_stopped_is_cancelled_and_still_lists_them(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema, worker_id="doomed")
    await manual.append(
        conn,
        schema,
        run.id,
        claimed["claim_token"],
        [(3, "tool_call_started", {"tool_call_id": 7, "name": "n"})],
    )
    await runrow.cancel_run(dsn, run.id, schema=schema)
    assert await _reap(conn, schema, run.id) == [run.id]
    end = (await assert_journal_sound(conn, schema, run.id))[-1][2]
    assert end["status"] == "cancelled" and end["uncertain_tool_calls"] == [{"tool_call_id": 7, "name": "n"}]


async def test_the_reaper_fails_a_run_past_its_deadline_even_with_a_live_lease(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="u", content="x", deadline=timedelta(seconds=10)
    )
    (claimed,) = await manual.claim(conn, schema, lease=3600, worker_id="stuck-worker")
    row = await run_row(conn, schema, run.id)
    # Within the grace after the deadline nothing happens; past it, the run fails.
    assert (
        await reap_expired(conn, schema=schema, grace=5, now=row["deadline_at"] + timedelta(seconds=4)) == []
    )
    reaped = await reap_expired(conn, schema=schema, grace=5, now=row["deadline_at"] + timedelta(seconds=6))
    assert reaped == [run.id]
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "failed" and row["error"]["type"] == "deadline_exceeded"
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2]["reason"] == "deadline_exceeded"
    # The stuck worker is fenced out.
    assert not await manual.append(conn, schema, run.id, claimed["claim_token"], [(3, "x", {})])


@pytest.mark.parametrize(
    ("lease", "first"),
    [(1, "worker_lost"), (20, "deadline_exceeded")],
    ids=["lease-lapsed-first", "deadline-first"],
)
async def test_a_lost_run_past_its_deadline_records_one_cause_the_first_to_pass(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    caplog: pytest.LogCaptureFixture,
    lease: float,
    first: str,
) -> None:
    """A run whose lease lapsed and whose deadline passed, reaped late (after a deploy's
    downtime, say): the row's error, the terminal event's reason and the log line name one
    cause, whichever passed first, which is what a prompt reaper would have recorded."""
    run = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="u", content="x", deadline=timedelta(seconds=10)
    )
    await manual.claim(conn, schema, lease=lease, worker_id="dead-worker")
    row = await run_row(conn, schema, run.id)
    late = max(row["deadline_at"], row["claim_expires_at"]) + timedelta(seconds=6)
    with caplog.at_level("WARNING", logger="runrow.dispatcher"):
        assert await reap_expired(conn, schema=schema, grace=5, now=late) == [run.id]
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "failed" and row["error"]["type"] == first
    end = (await assert_journal_sound(conn, schema, run.id))[-1][2]
    assert end["reason"] == first and end["error"] == row["error"]
    (line,) = [r.getMessage() for r in caplog.records if "reaped run" in r.getMessage()]
    assert ("past its deadline" in line) == (first == "deadline_exceeded"), line


async def test_a_reaped_deadline_ending_is_not_read_back_as_the_worker_s_own(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A worker whose ending lost its answer reads back whether the recorded ending is its
    own (sql/endings.sql ending_landed). The reaper's deadline ending has the same status,
    error, seq and claim token as the worker's would; its terminal event tells them apart."""
    run = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="u", content="x", deadline=timedelta(seconds=10)
    )
    (claimed,) = await manual.claim(conn, schema, lease=3600, worker_id="w")
    row = await run_row(conn, schema, run.id)
    await reap_expired(conn, schema=schema, grace=5, now=row["deadline_at"] + timedelta(seconds=6))
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "failed" and row["error"] == DEADLINE_ERROR
    seq, _, recorded = (await assert_journal_sound(conn, schema, run.id))[-1]
    assert seq == claimed["last_seq"] + 1  # where the worker's own ending would have gone
    worker_s = {"status": "failed", "error": DEADLINE_ERROR, "reason": "deadline_exceeded"}

    def ending(terminal: dict[str, Any]) -> endings.Ending:
        return endings.Ending(
            run_id=run.id,
            claim_token=claimed["claim_token"],
            status="failed",
            error=None,
            partial=None,
            events=[(seq, "complete", _json.dumps(terminal, "event"))],
        )

    assert await _exec.run(conn, endings.landed(schema, ending(worker_s))) is None
    # The read-back does say yes to the ending actually recorded (and what it recorded).
    assert await _exec.run(conn, endings.landed(schema, ending(recorded))) == "failed"


async def test_reaper_fails_an_orphan_and_the_next_turn_runs(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    ran: list[object] = []

    async def agent(run: runrow.RunContext) -> None:
        ran.append(run.content)

    orphan = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="orphan")
    nxt = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="next")
    (claimed,) = await manual.claim(conn, schema, lease=0.2, worker_id="dead-worker")
    assert await manual.append(
        conn, schema, orphan.id, claimed["claim_token"], [(3, "content_delta", {"delta": "half"})]
    )
    d = runrow.Dispatcher(dsn, agent, schema=schema, **{**FAST, "grace": 0.3})
    sig = testing.signals(d)
    async with d:
        # This dispatcher's own reaper ends the orphan, then the next turn is claimed
        # and completes.
        await sig.reaped.wait(lambda ids: orphan.id in ids)
        await sig.claimed.wait(lambda ids: nxt.id in ids)
        assert (await sig.ended.wait(lambda e: e.run_id == nxt.id)).recorded == "completed"
        assert ran == ["next"] and d.get_stats()["reaped"] == 1
    row = await run_row(conn, schema, orphan.id)
    assert row["status"] == "failed" and row["error"]["type"] == "worker_lost"
    evs = await assert_journal_sound(conn, schema, orphan.id)
    assert evs[-1][2]["reason"] == "worker_lost" and evs[-1][0] == 4
    assert await status_of(conn, schema, nxt.id) == "completed"


async def test_reaper_heartbeat_race_heartbeat_wins(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The reaper reads an expired lease; a heartbeat lands; the reaper's write must no-op."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    now = await manual.db_now(conn)
    (claimed,) = await manual.claim(conn, schema, lease=30, now=now - timedelta(minutes=5))
    later = now + timedelta(seconds=1)
    # 1. The reaper's read: expired long ago.
    assert await manual.reap_candidates(conn, schema, grace=30, now=later) == [run.id]
    # 2. The worker wakes from its pause and heartbeats before the reaper writes.
    assert await manual.heartbeat(conn, schema, [(run.id, claimed["claim_token"])], now=now) == {
        run.id: False
    }
    # 3. The reaper's write re-checks the expiry against the row as it is now: nothing happens.
    assert await manual.reap(conn, schema, [run.id], grace=30, now=later) == []
    assert await status_of(conn, schema, run.id) == "running"
    # Without the heartbeat, the same write reaps.
    assert await manual.reap(conn, schema, [run.id], grace=30, now=now + timedelta(minutes=5)) == [run.id]


async def test_a_run_whose_row_a_heartbeat_holds_is_left_to_the_next_pass(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The same race with real locks: the heartbeat holds the row; the reap skips it
    (it does not wait), and once the heartbeat commits the run has a fresh lease, so
    the next pass leaves it alone too."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema, lease=0.01)
    await wait_for(lambda: manual.reap_candidates(conn, schema, grace=0.01), what="the lease to lapse")
    beat = await psycopg.AsyncConnection.connect(dsn)
    try:
        await beat.execute("BEGIN")
        assert await manual.heartbeat(beat, schema, [(run.id, claimed["claim_token"])], lease=60)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as rc:
            with anyio.fail_after(10):  # (waiting on the row would hang here until the commit)
                assert await manual.reap(rc, schema, [run.id], grace=0.01) == []
            await beat.execute("COMMIT")
            assert await manual.reap(rc, schema, [run.id], grace=0.01) == []
    finally:
        await beat.close()
    assert await status_of(conn, schema, run.id) == "running"


async def test_a_frozen_transaction_holding_one_lost_run_does_not_hold_back_the_others(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Chaos found reaps 2.3 s late: a worker frozen (SIGSTOP) between its fold's
    pipelined statements and their sync keeps the rows its finalize touched locked, and
    a reap that waited for one such row held back every lost run of its batch, on every
    reaper, until the frozen process woke. Now the held run waits for the next pass alone."""
    for c in ("a", "b", "c"):
        await enqueue_turn(dsn, schema, c)
    claimed = await manual.claim(conn, schema, limit=3, lease=30, worker_id="dead-worker")
    held, *others = claimed
    later = await manual.db_now(conn) + timedelta(hours=1)
    frozen = await psycopg.AsyncConnection.connect(dsn)  # its transaction stays open
    try:
        await frozen.execute(
            f'SELECT 1 FROM "{schema}".agent_run WHERE id = %s FOR NO KEY UPDATE', (held["id"],)
        )
        with anyio.fail_after(10):
            reaped = await reap_expired(dsn, schema=schema, grace=1.0, now=later)
        assert sorted(map(str, reaped)) == sorted(str(r["id"]) for r in others)
        assert await status_of(conn, schema, held["id"]) == "running"
        await frozen.rollback()  # the frozen process wakes (or dies): its lock goes
        assert await reap_expired(dsn, schema=schema, grace=1.0, now=later) == [held["id"]]
    finally:
        await frozen.close()
    for r in claimed:
        assert await status_of(conn, schema, r["id"]) == "failed"
        await assert_journal_sound(conn, schema, r["id"])


async def test_heartbeat_and_reaper_keep_going_while_the_runs_hold_every_pooled_connection(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The heartbeat and the reaper take turns on a connection of their own: with every
    other connection of the pool checked out (runs busy in the database), the live run
    keeps its lease and a dead worker's run is still reaped on time."""
    from psycopg_pool import PoolTimeout

    release = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        await release.wait()

    # A dead worker's run, whose lease lapses once the pool below is exhausted.
    dead = await runrow.enqueue(dsn, schema=schema, conversation_id="dead", user_id="u", content="y")
    (claimed,) = await manual.claim(conn, schema, lease=2.5, worker_id="dead-worker")
    assert claimed["id"] == dead.id
    live = await runrow.enqueue(dsn, schema=schema, conversation_id="live", user_id="u", content="x")
    opts = {**FAST, "lease": 1.0, "heartbeat": 0.2, "grace": 0.3, "reap_interval": 0.1, "poll": 0.1}
    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=3, **opts) as d:
        await wait_for(lambda: live.id in d.in_flight, what="the live run to start")
        # Every connection the pool can still hand out is taken, and kept, by "the runs".
        held: list[psycopg.AsyncConnection] = []
        try:
            while True:
                held.append(await d.pool.getconn(timeout=0.3))
        except PoolTimeout:
            pass
        try:
            with pytest.raises(PoolTimeout):
                await d.pool.getconn(timeout=0.1)
            assert await status_of(conn, schema, dead.id) == "running"
            await wait_for(
                lambda: is_terminal(conn, schema, dead.id), what="the dead worker's run to be reaped"
            )
            assert await status_of(conn, schema, dead.id) == "failed"
            # Heartbeats go on: the live claim is extended well past three of its leases.
            first = (await run_row(conn, schema, live.id))["claim_expires_at"]

            async def extended() -> bool:
                row = await run_row(conn, schema, live.id)
                return row["status"] == "running" and row["claim_expires_at"] > first + timedelta(seconds=3)

            await wait_for(extended, what="heartbeats to extend the live run's lease")
            assert live.id in d.in_flight
        finally:
            for c in held:
                await d.pool.putconn(c)
        release.set()
        await wait_for(lambda: is_terminal(conn, schema, live.id), what="the live run to finish")
    assert await status_of(conn, schema, live.id) == "completed"
    assert d.get_stats()["lost"] == 0
