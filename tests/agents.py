"""Agents used by the tests, importable by worker processes (`runrow worker tests.agents:NAME`).

They record real side effects in a table of the test's schema (`side_effect`), so a test
can count executions, see order and overlap, and wait on progress without sleeping.
The schema comes from the RUNROW_TEST_SCHEMA environment variable in worker processes.
"""

from __future__ import annotations

import os
import random

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


async def _stepped(run: runrow.RunContext, name: str) -> str:
    """A step's side effect (a row per run and step), then a short random pause, so
    that a kill can land inside a step as well as between steps."""
    await record(run, name)
    await anyio.sleep(random.uniform(0, 0.03))
    return name


async def step_agent(run: runrow.RunContext) -> None:
    """RUNROW_TEST_STEPS steps (default 6), every third one idempotent, each followed by
    a pause of RUNROW_TEST_STEP_PAUSE seconds (default 0), then an answer made of every
    step's result."""
    got = []
    pause = float(os.environ.get("RUNROW_TEST_STEP_PAUSE", "0"))
    for i in range(int(os.environ.get("RUNROW_TEST_STEPS", "6"))):
        call = run.idempotent_step if i % 3 == 2 else run.step
        got.append(await call(f"s{i}", _stepped, run, f"s{i}"))
        await anyio.sleep(pause)
    await run.write_message(" ".join(got))


async def approval_agent(run: runrow.RunContext) -> None:
    """Streams, takes a step (its side effect: a row), waits for a person's approval,
    then writes an answer with the value and records an "after" side effect. Replayed
    after the approval, the step and the text before the wait must not repeat."""
    await run.text("asking ")
    planned = await run.step("plan", _stepped, run, "plan")
    await run.emit({"type": "tool_call_started", "tool_call_id": "send-1", "name": "send"})
    value = await run.wait_for_input("approve:send-1", {"kind": "approval", "tool": "send", "plan": planned})
    await run.emit(
        {"type": "tool_call_finished", "tool_call_id": "send-1", "ok": bool(value.get("approved"))}
    )
    await run.text(f"approved={value.get('approved')}")
    await record(run, "after")


async def failing_agent(run: runrow.RunContext) -> None:
    """Raises an error that quotes what the user wrote."""
    raise RuntimeError(f"the tool broke on {run.content!r}")


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


async def tree_parent(run: runrow.RunContext) -> None:
    """Spawns RUNROW_TEST_CHILDREN (default 3) children of agent key ``tree_child``, runs
    on for RUNROW_TEST_PARENT_PAUSE seconds (default 0), waits for them, and answers with
    their answers, in order."""
    n = int(os.environ.get("RUNROW_TEST_CHILDREN", "3"))
    kids = await run.spawn_many([("tree_child", f"c{i}") for i in range(n)])
    await anyio.sleep(float(os.environ.get("RUNROW_TEST_PARENT_PAUSE", "0")))
    results = await run.wait_for_children(kids)
    await run.write_message([r.get() for r in results])


async def tree_child(run: runrow.RunContext) -> None:
    """Three idempotent steps, each followed by a pause of RUNROW_TEST_STEP_PAUSE seconds,
    then the answer ``done <content>``."""
    pause = float(os.environ.get("RUNROW_TEST_STEP_PAUSE", "0"))
    for i in range(3):
        await run.idempotent_step(f"s{i}", _named, f"s{i}")
        await anyio.sleep(pause)
    await run.write_message(f"done {run.content}")


async def _named(name: str) -> str:
    await anyio.sleep(random.uniform(0, 0.03))
    return name


async def steer_agent(run: runrow.RunContext) -> None:
    """RUNROW_TEST_STEERS (default 8) rounds of an idempotent step, a steering delivery
    and a pause of RUNROW_TEST_STEP_PAUSE seconds (default 0); then answers with every
    delivery's contents, in order (a list of lists: the place of each message)."""
    pause = float(os.environ.get("RUNROW_TEST_STEP_PAUSE", "0"))
    got = []
    for i in range(int(os.environ.get("RUNROW_TEST_STEERS", "8"))):
        await run.idempotent_step(f"s{i}", _named, f"s{i}")
        got.append([m.content for m in await run.steering()])
        await anyio.sleep(pause)
    await run.write_message(got)
