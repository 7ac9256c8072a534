"""Agents used by the tests, importable by worker processes (`runrow worker tests.agents:NAME`).

They record real side effects in a table of the test's schema (`side_effect`), so a test
can count executions, see order and overlap, and wait on progress without sleeping.
The schema comes from the RUNROW_TEST_SCHEMA environment variable in worker processes.
"""

from __future__ import annotations

import os

import anyio
import psycopg
from psycopg import sql

import runrow
from runrow.demo.agent import DemoAgent

SIDE_EFFECT_DDL = """
CREATE TABLE IF NOT EXISTS {t} (
    run_id uuid NOT NULL,
    step text NOT NULL,
    conversation_id text NOT NULL,
    pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run_id, step)
)"""


def side_effect_table(schema: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier("side_effect"))


async def record(run: runrow.RunContext, step: str) -> None:
    """One real side effect; the primary key makes a second execution an error."""
    schema = os.environ["RUNROW_TEST_SCHEMA"]
    dsn = os.environ["RUNROW_TEST_DSN"]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("INSERT INTO {} (run_id, step, conversation_id, pid) VALUES (%s, %s, %s, %s)").format(
                side_effect_table(schema)
            ),
            (run.run_id, step, run.conversation_id, os.getpid()),
        )


async def record_agent(run: runrow.RunContext) -> None:
    """Records start and end side effects around a short stream."""
    await record(run, "start")
    await run.text("hello ")
    await run.emit({"type": "tool_call_started", "tool_call_id": "t1", "name": "noop"})
    await run.text("world")
    await record(run, "end")


async def hang_agent(run: runrow.RunContext) -> None:
    """Records that it started, then waits forever (until killed or cancelled)."""
    await record(run, "start")
    await anyio.sleep_forever()


async def chatty_agent(run: runrow.RunContext) -> None:
    """Streams a structural event every 50 ms for a few seconds, then answers."""
    await record(run, "start")
    for i in range(int(os.environ.get("RUNROW_TEST_STEPS", "100"))):
        await run.emit({"type": "tick", "i": i})
        await anyio.sleep(0.05)
    await run.write_message("done")
    await record(run, "end")


async def slow_agent(run: runrow.RunContext) -> None:
    """Takes about a second, then answers."""
    await record(run, "start")
    await anyio.sleep(float(os.environ.get("RUNROW_TEST_SLEEP", "1.0")))
    await run.write_message("slow answer")
    await record(run, "end")


demo_agent = DemoAgent()
"""The demo's agent (save_note tool), configured by DATABASE_URL and RUNROW_DEMO_SCHEMA."""
