"""Back-pressure (#42): an agent's RetryLater puts its run back in the queue for a while,
holding no worker and spending no attempt, its steps replayed when it resumes; with a
key, every queued run under that key waits out the same window (the key's gate)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._gateway import claims

from .helpers import events, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.1, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}


async def _row(conn: psycopg.AsyncConnection, schema: str, run_id: Any) -> dict[str, Any]:
    cur = await conn.execute(
        sql.SQL("SELECT status, attempt, resumes, not_before, claim_token FROM {} WHERE id = %s").format(
            table(schema, "agent_run")
        ),
        (run_id,),
    )
    row = await cur.fetchone()
    assert row is not None
    return dict(zip(("status", "attempt", "resumes", "not_before", "claim_token"), row, strict=True))


async def _statuses(conn: psycopg.AsyncConnection, schema: str) -> dict[str, int]:
    cur = await conn.execute(
        sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(table(schema, "agent_run"))
    )
    return {s: n for s, n in await cur.fetchall()}


async def test_a_burst_of_429s_parks_the_keys_runs_without_failures_or_spent_attempts(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    calls: dict[str, int] = {}
    steps: dict[str, int] = {}
    refused_once: set[str] = set()

    async def agent(run: runrow.RunContext) -> None:
        name = str(run.content)
        calls[name] = calls.get(name, 0) + 1

        async def plan() -> str:
            steps[name] = steps.get(name, 0) + 1
            return f"plan-{name}"

        planned = await run.step("plan", plan)
        if name.startswith("p") and name not in refused_once:
            refused_once.add(name)
            # The provider says 429 with Retry-After: 1 (as an httpx response).
            raise runrow.retry_later_from(httpx.Response(429, headers={"Retry-After": "1"}), key="prov")
        await run.text(planned)

    retry = runrow.RetryPolicy(max_attempts=1)  # a spent attempt would fail the run
    provider = [
        await runrow.enqueue(
            dsn, conversation_id=f"p{i}", user_id="u", content=f"p{i}", limit_key="prov", schema=schema
        )
        for i in range(8)
    ]
    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=4, retry=retry, **FAST) as d:
        await wait_for(lambda: len(refused_once) >= 1, what="a 429")
        others = [
            await runrow.enqueue(dsn, conversation_id=f"o{i}", user_id="u", content=f"o{i}", schema=schema)
            for i in range(6)
        ]

        async def others_done() -> bool:
            return all([(await _row(conn, schema, r.id))["status"] == "completed" for r in others])

        await wait_for(others_done, timeout=10, what="the other key's runs")
        # The gate is shut: the provider's runs are queued, not failed, holding no worker.
        gates = {g.key: g for g in await runrow.list_rate_limits(dsn, schema=schema)}
        assert gates["prov"].gate_until is not None and gates["prov"].runs is None
        mid = await _statuses(conn, schema)
        assert mid.get("failed", 0) == 0 and mid.get("queued", 0) >= 1

        async def all_done() -> bool:
            return (await _statuses(conn, schema)) == {"completed": 14}

        await wait_for(all_done, timeout=20, what="every run completed after the window")
        # (A run leaves in_flight once its ending's commit has returned to the worker, a
        # moment after another connection can see it: CI on 3.13 once caught it between.)
        await wait_for(lambda: d.in_flight == [], timeout=5, what="the dispatcher to let go of every run")
    for r in provider:
        row = await _row(conn, schema, r.id)
        assert row["attempt"] == 1  # no retry attempt spent: the same run
        evs = [e[1] for e in await events(conn, schema, r.id)]
        if str(r.id) and row["resumes"] > 0:
            assert "retry_later" in evs and evs[-1] == "complete"
    # At most a burst's worth of 429s (those claimed before the gate shut), not one per
    # run per retry; and each refused run's step ran once and was replayed.
    assert len(refused_once) >= 1
    for name in refused_once:
        assert calls[name] == 2 and steps[name] == 1


async def test_retry_later_without_a_key_delays_only_its_run_and_a_stop_ends_it(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        if run.content == "later":
            raise runrow.RetryLater(after=3600)

    later = await runrow.enqueue(dsn, conversation_id="a", user_id="u", content="later", schema=schema)
    now = await runrow.enqueue(dsn, conversation_id="b", user_id="u", content="now", schema=schema)
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):

        async def queued_again() -> bool:
            return (await _row(conn, schema, later.id))["resumes"] == 1

        await wait_for(queued_again, what="the run queued again")
        await wait_for(lambda: _is(conn, schema, now.id, "completed"), what="the other run")
        row = await _row(conn, schema, later.id)
        assert row["status"] == "queued" and row["claim_token"] is None
        assert row["not_before"] > datetime.now(UTC) + timedelta(minutes=50)
        assert await runrow.list_rate_limits(dsn, schema=schema) == []  # no key, no gate
        stopped = await runrow.cancel_run(dsn, later.id, schema=schema)
        assert stopped.cancelled == [later.id]


async def _is(conn: psycopg.AsyncConnection, schema: str, run_id: Any, status: str) -> bool:
    return (await _row(conn, schema, run_id))["status"] == status


async def test_a_gate_holds_the_claim_until_it_opens(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await conn.execute(
        sql.SQL("INSERT INTO {} (key, gate_until) VALUES ('tenant:T', %s)").format(
            table(schema, "rate_limit")
        ),
        (datetime(2030, 1, 1, 0, 1, tzinfo=UTC),),
    )
    await runrow.enqueue(dsn, conversation_id="t", user_id="u", content="t", tenant_id="T", schema=schema)
    t0 = datetime(2030, 1, 1, tzinfo=UTC)

    async def claim(now: datetime) -> int:
        rows = await claims.claim(
            conn, schema, order="fair", limit=5, lease_seconds=30, worker_id="w", now=now
        )
        return len(rows)

    assert await claim(t0 + timedelta(seconds=59)) == 0
    assert await claim(t0 + timedelta(seconds=60)) == 1


def _exc_with(headers: dict[str, str]) -> Exception:
    class StatusError(Exception):
        def __init__(self) -> None:
            super().__init__("429")
            self.response = httpx.Response(429, headers=headers)

    return StatusError()


@pytest.mark.parametrize(
    ("headers", "after"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": "2.5"}, 2.5),
        ({"Retry-After": "Wed, 01 Jan 2031 00:00:30 GMT"}, 30.0),
        ({"Retry-After": "Wed, 01 Jan 2031 00:00:00 GMT", "retry-after-ms": "1500"}, 1.5),
        ({"Retry-After": "garbage"}, 1.0),
        ({}, 1.0),
        ({"Retry-After": "99999999"}, 7 * 86400.0),
    ],
)
def test_retry_later_from_reads_retry_after(headers: dict[str, str], after: float) -> None:
    now = datetime(2031, 1, 1, tzinfo=UTC)
    assert runrow.retry_later_from(_exc_with(headers), now=now).after == after
    assert runrow.retry_later_from(httpx.Response(429, headers=headers), now=now, key="k").key == "k"


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"after": -1}, "after"),
        ({"after": float("nan")}, "after"),
        ({"after": 10**9}, "after"),
        ({"after": 1, "key": ""}, "key"),
    ],
)
def test_bad_retry_later_is_refused(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(runrow.InvalidInput) as e:
        runrow.RetryLater(**kw)
    assert e.value.field == field


@pytest.mark.parametrize("etype", ["retry_later", "complete", "children_awaited"])
def test_an_agent_cannot_emit_runrows_own_events(etype: str) -> None:
    from runrow._events import RETRY_LATER, validate_event

    assert RETRY_LATER == "retry_later"
    with pytest.raises(runrow.InvalidInput, match="reserved"):
        validate_event({"type": etype}, 100)
