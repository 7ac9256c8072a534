"""A step's result goes back to the agent before its record lands (handed_records.py):
the record shares the next step's begun marker's commit, and nothing the run writes
after the step (an event, the ending) lands before it, even when its batch is held up
or its connection is cut."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import blocked_by, events, rows, run_row, status_of, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 4.0, "grace": 1.0, "reap_interval": 0.2}


async def test_a_record_shares_the_next_begun_markers_commit(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    seen: dict[str, Any] = {}
    step_rows = sql.SQL("SELECT key, status, xmin::text FROM {} WHERE run_id = %s ORDER BY position").format(
        table(schema, "run_step")
    )

    async def second(run_id: uuid.UUID) -> str:
        # Inside the second step: the first's record and this one's begun marker are in.
        seen["rows"] = await rows(conn, step_rows, (run_id,))
        return "b"

    async def agent(run: runrow.RunContext) -> None:
        seen["first"] = await run.step("one", lambda: {"bb": 1, "a": [1e16, -0.0]})
        await run.step("two", second, run.run_id)

    queued = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        await wait_for(lambda: _ended(conn, schema, queued.id), what="the run's ending")
    assert await status_of(conn, schema, queued.id) == "completed"
    (one, one_status, one_xmin), (two, two_status, two_xmin) = seen["rows"]
    assert (one, one_status, two, two_status) == ("one", "recorded", "two", "started")
    assert one_xmin == two_xmin, "the record and the next begun marker were committed apart"
    # The value handed back before the record landed is the one jsonb kept.
    assert seen["first"] == {"a": [10**16, 0.0], "bb": 1} and list(seen["first"]) == ["a", "bb"]
    recorded = await rows(
        conn,
        sql.SQL("SELECT result FROM {} WHERE run_id = %s AND key = 'one'").format(table(schema, "run_step")),
        (queued.id,),
    )
    assert recorded == [(seen["first"],)]


@pytest.mark.parametrize("cut", [False, True], ids=["held", "held-then-connection-cut"])
async def test_nothing_the_run_writes_after_a_step_lands_before_its_record(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, cut: bool
) -> None:
    """A transaction holds the step's row while its record is on its way: the event the
    agent emits next, and then its ending, wait for the record; with the record's
    connection cut meanwhile, the record is sent again, and then they land."""
    emitted = anyio.Event()
    async with await psycopg.AsyncConnection.connect(dsn) as holder:

        async def hold(run_id: uuid.UUID) -> str:
            # The begun marker has committed; lock its row until the test lets go.
            await holder.execute(
                sql.SQL("SELECT 1 FROM {} WHERE run_id = %s AND key = 'tool' FOR UPDATE").format(
                    table(schema, "run_step")
                ),
                (run_id,),
            )
            return "done"

        async def agent(run: runrow.RunContext) -> None:
            assert await run.step("tool", hold, run.run_id) == "done"
            await run.emit({"type": "after_step"})
            emitted.set()

        queued = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
        async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
            holder_pid = holder.info.backend_pid
            await wait_for(lambda: blocked_by(conn, holder_pid), what="the record waiting for the row")
            if cut:
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                    (holder_pid,),
                )
            with anyio.move_on_after(1.0):
                await emitted.wait()
            assert not emitted.is_set(), "the event went ahead of the step's record"
            assert "after_step" not in [t for _, t, _ in await events(conn, schema, queued.id)]
            assert await status_of(conn, schema, queued.id) == "running"
            await holder.rollback()
            await wait_for(lambda: _ended(conn, schema, queued.id), what="the run's ending")
    assert await status_of(conn, schema, queued.id) == "completed"
    assert await _steps(conn, schema, queued.id) == [("recorded", "done")]
    assert [t for _, t, _ in await events(conn, schema, queued.id)][-2:] == ["after_step", "complete"]


async def test_the_ending_waits_for_the_last_steps_record(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as holder:

        async def hold(run_id: uuid.UUID) -> int:
            await holder.execute(
                sql.SQL("SELECT 1 FROM {} WHERE run_id = %s FOR UPDATE").format(table(schema, "run_step")),
                (run_id,),
            )
            return 7

        async def agent(run: runrow.RunContext) -> None:
            await run.step("last", hold, run.run_id)  # and the agent returns at once

        queued = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
        async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
            holder_pid = holder.info.backend_pid
            await wait_for(lambda: blocked_by(conn, holder_pid), what="the record waiting for the row")
            assert await status_of(conn, schema, queued.id) == "running"
            await holder.rollback()
            await wait_for(lambda: _ended(conn, schema, queued.id), what="the run's ending")
    assert await status_of(conn, schema, queued.id) == "completed"
    assert await _steps(conn, schema, queued.id) == [("recorded", 7)]


async def _ended(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID) -> bool:
    return await status_of(conn, schema, run_id) not in ("queued", "running")


async def _steps(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return await rows(
        conn,
        sql.SQL("SELECT status, result FROM {} WHERE run_id = %s").format(table(schema, "run_step")),
        (run_id,),
    )


@pytest.mark.parametrize("then", ["emits", "returns"])
async def test_a_record_the_database_refuses_fails_the_run_at_its_next_write(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, then: str
) -> None:
    """A trigger refuses the record of the result "poison", after the step has returned
    it: the run's next write (an event; with nothing more, its ending) raises the
    refusal, the run ends failed with it, and nothing the agent wrote after the step
    lands."""
    await conn.execute(
        sql.SQL("""
        CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.result = '"poison"'::jsonb THEN RAISE EXCEPTION 'injected refusal of a step record'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_poison BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {fn}();
    """).format(fn=sql.Identifier(schema, "refuse_poison"), t=table(schema, "run_step"))
    )
    reached: list[str] = []

    async def agent(run: runrow.RunContext) -> None:
        assert await run.step("tool", lambda: "poison") == "poison"
        if then == "emits":
            await run.emit({"type": "after_step"})
            reached.append("the event was written")

    queued = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        await wait_for(lambda: _ended(conn, schema, queued.id), what="the run's ending")
    row = await run_row(conn, schema, queued.id)
    assert row["status"] == "failed", row
    assert "injected refusal of a step record" in row["error"]["message"], row["error"]
    assert reached == []
    assert "after_step" not in [t for _, t, _ in await events(conn, schema, queued.id)]
    assert await _steps(conn, schema, queued.id) == [("started", None)]
