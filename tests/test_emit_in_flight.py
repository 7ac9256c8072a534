"""An agent's emit waits for its append without a shielded scope (#39: entering one was
a third of an emit's CPU). A cancellation that comes while the append is in flight still
learns the append's outcome before it goes on, so the writer's numbering holds and the
worker writes the run's ending itself, right after the append."""

from __future__ import annotations

from datetime import timedelta

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import assert_journal_sound, blocked_by, is_terminal, table, wait_for

pytestmark = pytest.mark.anyio

# A lease far longer than the test: only the worker can end the run in time (a writer
# that lost track of its numbering would leave the ending to the reaper).
SETTINGS = {"poll": 0.5, "heartbeat": 1.0, "lease": 60.0, "grace": 1.0, "reap_interval": 0.2}


async def test_a_deadline_during_an_emit_in_flight_counts_the_append_and_ends_the_run(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    started, go = anyio.Event(), anyio.Event()
    seen: list[BaseException] = []

    async def agent(run: runrow.RunContext) -> None:
        await run.emit({"type": "tool_call", "name": "first"})
        started.set()
        await go.wait()
        try:
            await run.emit({"type": "tool_call", "name": "held"})
        except BaseException as exc:
            seen.append(exc)
            raise
        await anyio.sleep(60)  # (never: the deadline is past when the append returns)

    async with (
        await psycopg.AsyncConnection.connect(dsn) as locker,
        runrow.Dispatcher(dsn, agent, schema=schema, **SETTINGS) as d,
    ):
        run = await runrow.enqueue(
            dsn, schema=schema, conversation_id="c", user_id="u", content="hi", deadline=timedelta(seconds=2)
        )
        with anyio.fail_after(10):
            await started.wait()
        # The journal is locked: the second emit's append waits in the database.
        await locker.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(table(schema, "run_event")))
        pid = locker.info.backend_pid
        go.set()

        async def append_blocked() -> bool:
            return await blocked_by(conn, pid)

        await wait_for(append_blocked, what="the append to wait for the lock")

        def cancelled() -> bool:
            active = d._parts.roster.runs.get(run.id)
            return active is not None and active.reason == "deadline"

        await wait_for(cancelled, timeout=10, what="the deadline to cancel the agent")
        assert not seen  # the cancelled emit is still waiting for its append's outcome
        await locker.rollback()  # the append lands now
        await wait_for(lambda: is_terminal(conn, schema, run.id), timeout=10, what="the worker's ending")
        # Written by the worker's ending, not left to the reaper (which would also end a
        # run past its deadline, with the same reason).
        assert run.id not in d._parts.roster.unrecorded
        assert d.get_stats()["reaped"] == 0
    assert len(seen) == 1 and isinstance(seen[0], BaseException)
    evs = await assert_journal_sound(conn, schema, run.id)
    names = [p.get("name") for _, t, p in evs if t == "tool_call"]
    assert names == ["first", "held"]  # the held append landed, numbered before the ending
    assert evs[-1][2].get("reason") == "deadline_exceeded", evs[-1]


async def test_an_emit_after_the_cancellation_raises_before_writing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The other side of the unshielded wait: an agent already cancelled (here, by its
    deadline) that emits anyway, say in a cleanup handler, gets the cancellation at once,
    and nothing of that emit reaches the journal."""
    outcome: list[str] = []

    async def agent(run: runrow.RunContext) -> None:
        try:
            await anyio.sleep(60)
        except BaseException:
            try:
                await run.emit({"type": "tool_call", "name": "after"})
                outcome.append("written")
            except BaseException:
                outcome.append("raised")
                raise
            raise

    async with runrow.Dispatcher(dsn, agent, schema=schema, **SETTINGS):
        run = await runrow.enqueue(
            dsn, schema=schema, conversation_id="c", user_id="u", content="hi", deadline=timedelta(seconds=1)
        )
        await wait_for(lambda: is_terminal(conn, schema, run.id), timeout=10, what="the worker's ending")
    assert outcome == ["raised"]
    evs = await assert_journal_sound(conn, schema, run.id)
    assert [t for _, t, _ in evs] == ["user_message_created", "run_queued", "complete"]
