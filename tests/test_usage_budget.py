"""Usage budgets (#42 point 5): enqueue refuses a tenant whose budget for the current
period is spent (runrow.Overloaded, reason "usage_budget"), in its own statement, and
admits it again in the next period. Precision: checked at enqueue against the usage
recorded (committed) so far."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import is_terminal, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}


async def _spender(run: runrow.RunContext) -> None:
    spend = run.request or {}
    run.record_usage(input_tokens=spend.get("tokens", 0), cost=spend.get("cost", 0.0))


async def _spend(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, tenant: str | None, **spend: Any
) -> None:
    async with runrow.Dispatcher(dsn, _spender, schema=schema, **FAST):
        run = await runrow.enqueue(
            dsn,
            schema=schema,
            conversation_id=f"spend-{time.monotonic_ns()}",
            user_id="u",
            content="go",
            tenant_id=tenant,
            request=spend,
        )
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the spending run")


async def _enqueue(dsn: str, schema: str, tenant: str | None, **kw: Any) -> runrow.Run:
    return await runrow.enqueue(
        dsn,
        schema=schema,
        conversation_id=f"c-{time.monotonic_ns()}",
        user_id="u",
        content="x",
        tenant_id=tenant,
        **kw,
    )


async def _next_period(conn: psycopg.AsyncConnection, schema: str, seconds: int) -> None:
    """As if the period had passed: the usage recorded so far moves back one period."""
    await conn.execute(
        sql.SQL("UPDATE {} SET bucket = bucket - make_interval(secs => %s)").format(
            table(schema, "usage_rollup")
        ),
        (seconds,),
    )


async def test_a_spent_token_budget_refuses_enqueue_until_the_next_period(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    budget = await runrow.set_usage_budget(dsn, "t1", tokens=100, schema=schema)
    assert (budget.tenant_id, budget.tokens, budget.cost, budget.period_seconds) == ("t1", 100, None, 86400)
    assert not budget.spent
    await _spend(dsn, schema, conn, "t1", tokens=60)
    await _enqueue(dsn, schema, "t1")  # 60 of 100: admitted
    await _spend(dsn, schema, conn, "t1", tokens=40)
    with pytest.raises(runrow.Overloaded) as caught:
        await _enqueue(dsn, schema, "t1")
    exc = caught.value
    assert (exc.reason, exc.scope, exc.key) == ("usage_budget", "tenant", "t1")
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    assert exc.resets_at == midnight
    assert 1 <= exc.retry_after <= 86400
    await _enqueue(dsn, schema, "t2")  # another tenant: no budget
    await _enqueue(dsn, schema, None)  # the default tenant: none either
    got = await runrow.get_usage_budget(dsn, "t1", schema=schema)
    assert got is not None and got.spent and (got.spent_tokens, got.period_ends_at) == (100, midnight)
    await _next_period(conn, schema, 86400)
    await _enqueue(dsn, schema, "t1")
    got = await runrow.get_usage_budget(dsn, "t1", schema=schema)
    assert got is not None and not got.spent and got.spent_tokens == 0


async def test_a_cost_budget_per_hour_and_its_removal(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await runrow.set_usage_budget(dsn, None, cost=1.5, per="hour", schema=schema)
    await _spend(dsn, schema, conn, None, cost=1.5)
    with pytest.raises(runrow.Overloaded) as caught:
        await _enqueue(dsn, schema, None)
    assert caught.value.reason == "usage_budget" and caught.value.retry_after <= 3600
    # An idempotent repeat of an accepted turn still answers with its run.
    await runrow.set_usage_budget(dsn, None, cost=100, per=7200, schema=schema)
    first = await _enqueue(dsn, schema, None, idempotency_key="k")
    await runrow.set_usage_budget(dsn, None, cost=1, per=7200, schema=schema)
    again = await runrow.enqueue(
        dsn,
        schema=schema,
        conversation_id=first.conversation_id,
        user_id="u",
        content="x",
        idempotency_key="k",
    )
    assert (again.id, again.created) == (first.id, False)
    assert await runrow.remove_usage_budget(dsn, None, schema=schema)
    assert not await runrow.remove_usage_budget(dsn, None, schema=schema)
    assert await runrow.get_usage_budget(dsn, None, schema=schema) is None
    await _enqueue(dsn, schema, None)


async def test_queue_limit_refusals_keep_their_reason(dsn: str, schema: str) -> None:
    await _enqueue(dsn, schema, "t", max_queued_per_tenant=1)
    with pytest.raises(runrow.Overloaded) as caught:
        await _enqueue(dsn, schema, "t", max_queued_per_tenant=1)
    assert (caught.value.reason, caught.value.limit, caught.value.resets_at) == ("queue_limit", 1, None)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "tokens"),
        ({"tokens": -1}, "tokens"),
        ({"tokens": 1.5}, "tokens"),
        ({"cost": math.nan}, "cost"),
        ({"cost": -1}, "cost"),
        ({"tokens": 1, "per": 1800}, "per"),
        ({"tokens": 1, "per": "week"}, "per"),
        ({"tokens": 1, "per": 400 * 86400}, "per"),
    ],
)
async def test_bad_budgets_are_refused_naming_the_field(
    dsn: str, schema: str, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(runrow.InvalidInput) as caught:
        await runrow.set_usage_budget(dsn, "t", schema=schema, **kwargs)
    assert caught.value.field == field
    assert await runrow.get_usage_budget(dsn, "t", schema=schema) is None


async def test_concurrent_enqueues_at_the_budget_edge(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Sixteen real connections enqueue for the tenant while a run records the usage
    that spends its budget: every enqueue that started after that usage committed is
    refused, and the ones before it were admitted (the budget reserves nothing at
    enqueue, so concurrent enqueues cannot overshoot it; only recorded usage counts)."""
    await runrow.set_usage_budget(dsn, "edge", tokens=100, schema=schema)
    await _spend(dsn, schema, conn, "edge", tokens=99)
    committed_at: list[float] = []
    go = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        if run.conversation_id != "spender":
            return
        await go.wait()
        run.record_usage(input_tokens=1)
        await run.flush()
        committed_at.append(time.monotonic())

    outcomes: list[tuple[float, bool]] = []

    async def enqueuer(i: int) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            for n in range(40):
                started = time.monotonic()
                try:
                    await runrow.enqueue(
                        c,
                        schema=schema,
                        conversation_id=f"e{i}-{n}",
                        user_id="u",
                        content="x",
                        tenant_id="edge",
                    )
                    outcomes.append((started, True))
                except runrow.Overloaded as exc:
                    assert exc.reason == "usage_budget"
                    outcomes.append((started, False))
                if n == 10 and i == 0:
                    go.set()
                await anyio.sleep(0.005)

    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=1, **FAST):
        # (the spender's run goes first: 99 of 100, admitted)
        await runrow.enqueue(
            dsn, schema=schema, conversation_id="spender", user_id="u", content="x", tenant_id="edge"
        )
        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(enqueuer, i)
    assert committed_at, "the spending run never recorded"
    after = [ok for started, ok in outcomes if started > committed_at[0]]
    before = [ok for started, ok in outcomes if started < committed_at[0]]
    assert after and not any(after)
    assert before and any(before)
    got = await runrow.get_usage_budget(dsn, "edge", schema=schema)
    assert got is not None and got.spent_tokens == 100
