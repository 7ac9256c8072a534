"""Per-run deadlines: enforced by the dispatcher, and by the reaper when the worker is gone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import psycopg
import pytest

import runrow

from .helpers import assert_journal_sound, run_row, status_of, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}


async def _terminal(conn: psycopg.AsyncConnection, schema: str, run: runrow.Run) -> bool:
    return await status_of(conn, schema, run.id) in ("completed", "failed", "cancelled")


async def test_a_run_past_its_deadline_is_cancelled_and_fails(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    cancelled = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        await run.text("working")
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        run = await runrow.enqueue(
            dsn, schema=schema, conversation_id="c", user_id="u", content="x", deadline=timedelta(seconds=1)
        )
        await wait_for(lambda: _terminal(conn, schema, run), timeout=10, what="the deadline")
    assert cancelled.is_set()  # cooperatively: the agent saw the cancellation
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "failed" and row["error"]["type"] == "deadline_exceeded"
    # Not before the deadline (both times from the database's clock).
    assert row["finished_at"] >= row["deadline_at"]
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2]["reason"] == "deadline_exceeded"
    msgs = await runrow.transcript(dsn, "c", schema=schema)
    assert [(m.content, m.status) for m in msgs if m.role == "assistant"] == [("working", "partial")]


async def test_a_run_claimed_after_its_deadline_never_calls_the_agent(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    called: list[object] = []

    async def agent(run: runrow.RunContext) -> None:
        called.append(run.content)

    late = await runrow.enqueue(
        dsn,
        schema=schema,
        conversation_id="c",
        user_id="u",
        content="late",
        deadline=datetime.now(UTC) - timedelta(seconds=5),
    )
    fine = await runrow.enqueue(
        dsn, schema=schema, conversation_id="d", user_id="u", content="fine", deadline=timedelta(minutes=5)
    )
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        await wait_for(lambda: _terminal(conn, schema, late), what="late run")
        await wait_for(lambda: _terminal(conn, schema, fine), what="fine run")
    assert called == ["fine"]
    assert (await run_row(conn, schema, late.id))["error"]["type"] == "deadline_exceeded"
    assert await status_of(conn, schema, fine.id) == "completed"


async def test_a_run_that_finishes_in_time_completes(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.write_message("quick")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        run = await runrow.enqueue(
            dsn, schema=schema, conversation_id="c", user_id="u", content="x", deadline=timedelta(seconds=30)
        )
        await wait_for(lambda: _terminal(conn, schema, run), what="run")
    assert await status_of(conn, schema, run.id) == "completed"
