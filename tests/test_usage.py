"""Usage accounting (#42 point 5): RunContext.record_usage journals ``usage`` events that
ride the run's next journal write, the same statement adds them to the per-tenant, per
agent key, per hour rollup, and nothing is counted twice across a resume or a retry."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import events, is_terminal, rows, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}
AgentFn = Callable[[runrow.RunContext], Awaitable[None]]


async def _one_turn(dsn: str, schema: str, agent: AgentFn, conn: psycopg.AsyncConnection, **kw: Any) -> Any:
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="go", **kw)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run's end")
    return run


async def _rollup(conn: psycopg.AsyncConnection, schema: str) -> list[tuple[Any, ...]]:
    return await rows(
        conn,
        sql.SQL(
            "SELECT tenant_key, agent_key, sum(input_tokens)::bigint, sum(output_tokens)::bigint,"
            " sum(cost)::float8, sum(records)::bigint FROM {} GROUP BY 1, 2 ORDER BY 1, 2"
        ).format(table(schema, "usage_rollup")),
    )


async def test_usage_rides_the_next_flush_and_is_rolled_up(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    seen: list[int] = []

    async def agent(run: runrow.RunContext) -> None:
        run.record_usage(input_tokens=10, output_tokens=5, cost=0.25)
        seen.append(len(await events(conn, schema, run.run_id)))  # not written by itself
        await run.emit({"type": "message_done"})  # a structural event: usage rides it
        seen.append(len(await events(conn, schema, run.run_id)))
        run.record_usage(input_tokens=1, output_tokens=2)  # rides the ending
        await run.text("answer")

    run = await _one_turn(dsn, schema, agent, conn, tenant_id="t1")
    assert seen == [2, 4]  # seq 1-2 of the enqueue; then the usage and message_done together
    journal = await events(conn, schema, run.id)
    usage = [(p["input_tokens"], p["output_tokens"], p["cost"]) for _, t, p in journal if t == "usage"]
    assert usage == [(10, 5, 0.25), (1, 2, 0.0)]
    assert journal[-1][1] == "complete"
    assert await runrow.run_usage(dsn, run.id, schema=schema) == runrow.RunUsage(11, 7, 0.25, 2)
    assert await _rollup(conn, schema) == [("t1", "", 11, 7, 0.25, 2)]
    (total,) = await runrow.usage_totals(dsn, schema=schema)
    assert (total.tenant_id, total.agent_key, total.tokens, total.cost, total.records) == (
        "t1",
        None,
        18,
        0.25,
        2,
    )
    assert await runrow.usage_totals(dsn, tenant="other", schema=schema) == []
    later = datetime.now(UTC) + timedelta(hours=2)
    assert await runrow.usage_totals(dsn, since=later, schema=schema) == []
    assert len(await runrow.usage_totals(dsn, until=later, schema=schema)) == 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"input_tokens": -1}, "input_tokens"),
        ({"output_tokens": 10**10}, "output_tokens"),
        ({"input_tokens": 1.5}, "input_tokens"),
        ({"input_tokens": True}, "input_tokens"),
        ({"cost": math.nan}, "cost"),
        ({"cost": math.inf}, "cost"),
        ({"cost": -0.01}, "cost"),
        ({"cost": 1e7}, "cost"),
        ({"cost": "1"}, "cost"),
    ],
)
async def test_bad_usage_is_refused_naming_the_field(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, kwargs: dict[str, Any], field: str
) -> None:
    caught: list[str] = []

    async def agent(run: runrow.RunContext) -> None:
        try:
            run.record_usage(**kwargs)
        except runrow.InvalidInput as exc:
            caught.append(exc.field)

    run = await _one_turn(dsn, schema, agent, conn)
    assert caught == [field]
    assert [t for _, t, _ in await events(conn, schema, run.id) if t == "usage"] == []
    assert await _rollup(conn, schema) == []


async def test_only_runrow_writes_usage_events(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    caught: list[str] = []

    async def agent(run: runrow.RunContext) -> None:
        try:
            await run.emit({"type": "usage", "input_tokens": 10**12})
        except runrow.InvalidInput as exc:
            caught.append(str(exc))

    await _one_turn(dsn, schema, agent, conn)
    assert caught and "reserved" in caught[0]
    assert await _rollup(conn, schema) == []


async def test_a_resumed_runs_replay_does_not_record_again(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        run.record_usage(input_tokens=100, output_tokens=10, cost=1.0)  # before the pause
        await run.wait_for_input("approve")
        run.record_usage(input_tokens=7, output_tokens=3, cost=0.5)  # after it

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="go")

        async def waiting() -> bool:
            return (await runrow.get_run(dsn, run.id, schema=schema)).status == "waiting"

        await wait_for(waiting, what="the park")
        assert await runrow.run_usage(dsn, run.id, schema=schema) == runrow.RunUsage(100, 10, 1.0, 1)
        assert await runrow.provide_input(dsn, run.id, "approve", True, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the resumed run's end")
    assert await runrow.run_usage(dsn, run.id, schema=schema) == runrow.RunUsage(107, 13, 1.5, 2)
    assert await _rollup(conn, schema) == [("", "", 107, 13, 1.5, 2)]


async def test_a_retry_counts_what_ran_again_and_not_what_its_steps_replayed(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """What counts: every usage event that landed in some run's journal, once. A step
    recorded by an earlier attempt replays without running, so usage recorded inside it
    is not recorded again; a model call made again outside a step was paid for again."""

    async def model_call(run: runrow.RunContext) -> str:
        run.record_usage(input_tokens=1000, output_tokens=100, cost=2.0)
        return "plan"

    async def agent(run: runrow.RunContext) -> None:
        await run.step("plan", model_call, run)
        run.record_usage(input_tokens=1, output_tokens=1, cost=0.01)  # outside any step
        await run.flush()
        if run.attempt == 1:
            raise RuntimeError("failed after the plan")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="go")
        await wait_for(lambda: is_terminal(conn, schema, first.id), what="the first attempt")
        again = await runrow.retry_run(dsn, first.id, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, again.id), what="the retry")
    assert await runrow.run_usage(dsn, first.id, schema=schema) == runrow.RunUsage(1001, 101, 2.01, 2)
    assert await runrow.run_usage(dsn, again.id, schema=schema) == runrow.RunUsage(1, 1, 0.01, 1)
    assert await _rollup(conn, schema) == [("", "", 1002, 102, 2.02, 3)]


async def test_a_fenced_out_flush_counts_nothing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A worker that lost its claim (reaped, stopped) writes no usage: its events and its
    rollup rows are one statement, fenced together."""
    lost: list[type[BaseException]] = []

    async def agent(run: runrow.RunContext) -> None:
        run.record_usage(input_tokens=5)
        await run.flush()
        await conn.execute(
            sql.SQL("UPDATE {} SET claim_token = gen_random_uuid() WHERE id = %s").format(
                table(schema, "agent_run")
            ),
            (run.run_id,),
        )
        run.record_usage(input_tokens=500)
        try:
            await run.flush()
        except runrow.LeaseLost as exc:
            lost.append(type(exc))
            raise

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="go")
        await wait_for(lambda: bool(lost), what="the fenced flush")
        await runrow.cancel_run(dsn, run.id, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run's end")
    assert lost == [runrow.LeaseLost]
    assert await runrow.run_usage(dsn, run.id, schema=schema) == runrow.RunUsage(5, 0, 0.0, 1)
    assert await _rollup(conn, schema) == [("", "", 5, 0, 0.0, 1)]
