"""Waiting for input beside other work of the same turn (parallel tool calls).

A park cuts the agent short; it must not cut a step runrow started itself and so turn it
uncertain. The park waits (bounded: half the lease) for the turn's steps in flight to
record their outcomes, begins no new step meanwhile, and then parks. Parallel waits are
all asked: each is recorded waiting, and the host may answer them in any order.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import assert_journal_sound, is_terminal, rows, run_row, status_of, table, wait_for

pytestmark = pytest.mark.anyio

# A lease long enough that the park's bound (half the lease) never runs out while a test
# lets a step finish, however busy the machine is.
ROOMY = {"poll": 0.2, "heartbeat": 0.2, "lease": 10.0, "grace": 1.0, "reap_interval": 0.1}
# A short lease: the park's bound (1 s) runs out while a step hangs.
TIGHT = {"poll": 0.2, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}


async def _steps(conn: psycopg.AsyncConnection, schema: str) -> dict[str, str]:
    """Every step row of the test's schema: key -> status."""
    got = await rows(conn, sql.SQL("SELECT key, status FROM {}").format(table(schema, "run_step")))
    return {k: s for k, s in got}


async def _waiting_again(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID, resumes: int) -> bool:
    row = await run_row(conn, schema, run_id)
    return bool(row["status"] == "waiting" and row["resumes"] == resumes)


async def test_a_wait_beside_a_running_step_parks_once_the_step_is_recorded(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Issue #36 (2): the park used to cancel the step in flight, leaving it begun and never
    recorded, and every resume then failed StepUncertain."""
    calls: list[str] = []
    release = anyio.Event()

    async def tool(name: str) -> dict[str, str]:
        await release.wait()
        calls.append(name)
        return {"tool": name}

    async def agent(run: runrow.RunContext) -> None:
        done, answer = await asyncio.gather(
            run.step("t1", tool, "t1"), run.wait_for_input("approve:t2", {"tool": "t2"})
        )
        await run.write_message({"t1": done, "t2": answer})

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **ROOMY):
        await wait_for(lambda: _has(conn, schema, "approve:t2", "waiting"), what="the input marked waiting")
        # The step still runs: the run has not parked under it.
        assert await status_of(conn, schema, run.id) == "running"
        assert (await _steps(conn, schema))["t1"] == "started"
        release.set()
        await wait_for(lambda: _waiting_again(conn, schema, run.id, 0), what="the run to park")
        assert await _steps(conn, schema) == {"t1": "recorded", "approve:t2": "waiting"}
        assert await runrow.provide_input(dsn, run.id, "approve:t2", "yes", schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the resumed run to end")
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "completed", row["error"]
    assert calls == ["t1"]  # ran once: the resume replayed its record
    said = [m.content for m in await runrow.transcript(dsn, "c", schema=schema) if m.role == "assistant"]
    assert said == [{"t1": {"tool": "t1"}, "t2": "yes"}]
    await assert_journal_sound(conn, schema, run.id)


async def _has(conn: psycopg.AsyncConnection, schema: str, key: str, status: str) -> bool:
    return (await _steps(conn, schema)).get(key) == status


async def test_a_park_begins_no_new_step_and_the_resume_begins_it(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A branch whose step settles while the park waits goes on to its next step: that
    one is not begun (no row, not called) and runs once, on the resume."""
    calls: list[str] = []
    release = anyio.Event()

    async def tool(name: str) -> str:
        if name == "a":
            await release.wait()
        calls.append(name)
        return name

    async def branch(run: runrow.RunContext) -> list[str]:
        return [await run.step("a", tool, "a"), await run.step("b", tool, "b")]

    async def agent(run: runrow.RunContext) -> None:
        done, answer = await asyncio.gather(branch(run), run.wait_for_input("ok", "?"))
        await run.write_message({"done": done, "answer": answer})

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **ROOMY):
        await wait_for(lambda: _has(conn, schema, "ok", "waiting"), what="the input marked waiting")
        release.set()
        await wait_for(lambda: _waiting_again(conn, schema, run.id, 0), what="the run to park")
        assert calls == ["a"]
        assert await _steps(conn, schema) == {"a": "recorded", "ok": "waiting"}  # b not begun
        assert await runrow.provide_input(dsn, run.id, "ok", 1, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the resumed run to end")
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "completed", row["error"]
    assert calls == ["a", "b"]
    said = [m.content for m in await runrow.transcript(dsn, "c", schema=schema) if m.role == "assistant"]
    assert said == [{"done": ["a", "b"], "answer": 1}]


async def test_a_step_that_outlasts_the_parks_bound_is_cut_and_stays_uncertain(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture
) -> None:
    """Past half the lease the park goes ahead: the step still running is cut. Its effect
    may have happened, so it stays begun (uncertain) and says so in the log; the resume
    raises StepUncertain at it (an agent may catch that) and never runs it again."""
    calls: list[str] = []
    seen: list[str] = []

    async def hangs(name: str) -> str:
        calls.append(name)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def agent(run: runrow.RunContext) -> None:
        async def guarded() -> str:
            try:
                return str(await run.step("slow", hangs, "slow"))
            except runrow.StepUncertain as exc:
                seen.append(type(exc).__name__)
                return "uncertain"

        done, answer = await asyncio.gather(guarded(), run.wait_for_input("ok", "?"))
        await run.write_message({"slow": done, "answer": answer})

    caplog.set_level(logging.WARNING, logger="runrow.run")
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **TIGHT):
        await wait_for(lambda: _waiting_again(conn, schema, run.id, 0), what="the run to park")
        assert await _steps(conn, schema) == {"slow": "started", "ok": "waiting"}
        assert any("'slow'" in r.getMessage() and "uncertain" in r.getMessage() for r in caplog.records)
        assert await runrow.provide_input(dsn, run.id, "ok", 1, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the resumed run to end")
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "completed", row["error"]
    assert calls == ["slow"] and seen == ["StepUncertain"]


@pytest.mark.parametrize("first", ["t1", "t2"])
async def test_two_parallel_approvals_are_both_asked_and_answered_in_either_order(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, first: str
) -> None:
    """Two tool calls of one turn wait for approval at once: both inputs are waiting when
    the run parks; answering one resumes the run, which parks again on the other; t1 is
    approved and t2 denied, and only t1's tool runs, once."""
    calls: list[str] = []
    answers = {"t1": {"approved": True}, "t2": {"approved": False}}

    async def agent(run: runrow.RunContext) -> None:
        got = await asyncio.gather(
            run.wait_for_input("approve:t1", {"tool": "t1"}),
            run.wait_for_input("approve:t2", {"tool": "t2"}),
        )
        done = {}
        for tid, answer in zip(("t1", "t2"), got, strict=True):
            done[tid] = await run.step(f"do:{tid}", calls.append, tid) if answer["approved"] else "denied"
        await run.write_message(done)

    second = "t2" if first == "t1" else "t1"
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **ROOMY):
        await wait_for(lambda: _waiting_again(conn, schema, run.id, 0), what="the run to park")
        pending = await runrow.waiting_inputs(dsn, run_id=run.id, schema=schema)
        assert sorted(p.key for p in pending) == ["approve:t1", "approve:t2"]
        assert await runrow.provide_input(dsn, run.id, f"approve:{first}", answers[first], schema=schema)
        await wait_for(lambda: _waiting_again(conn, schema, run.id, 1), what="the run to park again")
        pending = await runrow.waiting_inputs(dsn, run_id=run.id, schema=schema)
        assert [p.key for p in pending] == [f"approve:{second}"]
        assert await runrow.provide_input(dsn, run.id, f"approve:{second}", answers[second], schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run to end")
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "completed", row["error"]
    assert calls == ["t1"]
    said = [m.content for m in await runrow.transcript(dsn, "c", schema=schema) if m.role == "assistant"]
    assert said == [{"t1": None, "t2": "denied"}]
    evs = await assert_journal_sound(conn, schema, run.id)
    provided = [p["key"] for _, t, p in evs if t == "input_provided"]
    assert provided == [f"approve:{first}", f"approve:{second}"]


async def test_a_wait_cut_by_the_agent_before_its_park_lets_the_turn_go_on(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A wait still waiting for the steps beside it to settle, cancelled by the agent's
    own code (its task group's scope, say), must not leave the turn parking: its steps
    would wait for a park that never comes, and the run would hang until its deadline."""
    release, cut, was_cut = anyio.Event(), anyio.Event(), anyio.Event()

    async def slow() -> int:
        await release.wait()
        return 1

    async def agent(run: runrow.RunContext) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run.step, "slow", slow)
            with anyio.CancelScope() as asking:
                tg.start_soon(cut_when_told, asking)
                await run.wait_for_input("approve", {"q": "?"})
            was_cut.set()
        after = await run.step("after", lambda: 2)
        await run.write_message(f"went on: {after}")

    async def cut_when_told(scope: anyio.CancelScope) -> None:
        await cut.wait()
        scope.cancel()

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **ROOMY):
        # The wait is marked and waits for "slow" to settle: the agent cuts it there.
        await wait_for(lambda: _has(conn, schema, "approve", "waiting"), what="the input marked waiting")
        assert (await _steps(conn, schema))["slow"] == "started"
        cut.set()
        with anyio.fail_after(10):
            await was_cut.wait()
        release.set()  # only now: "slow" settles after the wait was cut, not before
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run to end")
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "completed", row["error"]
    said = [m.content for m in await runrow.transcript(dsn, "c", schema=schema) if m.role == "assistant"]
    assert said == ["went on: 2"]
    assert (await _steps(conn, schema))["after"] == "recorded"
