"""Rate limits at the claim (#42): N runs started per period per key, under the fair and
the FIFO claim, across worker processes and at a deep backlog; other keys unaffected."""

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
from runrow._gateway import claims

from . import bulk
from .helpers import table, wait_for
from .test_processes import Workers, workers  # noqa: F401  (the fixture)

pytestmark = pytest.mark.anyio

T0 = datetime(2030, 1, 1, tzinfo=UTC)


async def _enqueue(dsn: str, schema: str, name: str, **kw: Any) -> runrow.Run:
    return await runrow.enqueue(
        dsn, conversation_id=f"c-{name}", user_id="u", content=name, schema=schema, **kw
    )


async def _claim(
    conn: psycopg.AsyncConnection,
    schema: str,
    *,
    order: claims.ClaimOrder = "fair",
    limit: int = 50,
    now: datetime = T0,
) -> list[str]:
    rows = await claims.claim(
        conn, schema, order=order, limit=limit, lease_seconds=30, worker_id="t", now=now
    )
    return sorted(str(r.content) for r in rows)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"runs": 0, "per": 1}, "runs"),
        ({"runs": -3, "per": 1}, "runs"),
        ({"runs": 10**9, "per": 1}, "runs"),
        ({"runs": True, "per": 1}, "runs"),
        ({"runs": 1.5, "per": 1}, "runs"),
        ({"runs": 1, "per": 0}, "per"),
        ({"runs": 1, "per": -1}, "per"),
        ({"runs": 1, "per": math.inf}, "per"),
        ({"runs": 1, "per": math.nan}, "per"),
        ({"runs": 1, "per": 10**12}, "per"),
        ({"runs": 1, "per": "1"}, "per"),
        ({"runs": 1, "per": timedelta(days=-1)}, "per"),
    ],
)
async def test_bad_limits_are_refused_naming_the_field_and_write_nothing(
    dsn: str, schema: str, kw: dict[str, Any], field: str
) -> None:
    with pytest.raises(runrow.InvalidInput) as e:
        await runrow.set_rate_limit(dsn, "tenant:a", schema=schema, **kw)
    assert e.value.field == field
    assert await runrow.list_rate_limits(dsn, schema=schema) == []


@pytest.mark.parametrize("key", ["", None, 7, "x" * 301, "a\x00b"])
async def test_bad_keys_are_refused(dsn: str, schema: str, key: Any) -> None:
    with pytest.raises(runrow.InvalidInput) as e:
        await runrow.set_rate_limit(dsn, key, runs=1, per=1, schema=schema)
    assert e.value.field == "key"
    with pytest.raises(runrow.InvalidInput):
        await _enqueue(dsn, schema, "x", limit_key=key if key is not None else "")


async def test_set_list_remove_through_the_sync_api(dsn: str, schema: str) -> None:
    await anyio.to_thread.run_sync(_sync_round_trip, dsn, schema)


def _sync_round_trip(dsn: str, schema: str) -> None:
    from runrow import sync

    got = sync.set_rate_limit(dsn, "provider:openai", runs=60, per=timedelta(minutes=1), schema=schema)
    assert (got.key, got.runs, got.per_seconds, got.used) == ("provider:openai", 60, 60.0, 0)
    sync.set_rate_limit(dsn, "provider:openai", runs=30, per=1, schema=schema)  # replaced
    assert [(r.key, r.runs, r.per_seconds) for r in sync.list_rate_limits(dsn, schema=schema)] == [
        ("provider:openai", 30, 1.0)
    ]
    assert sync.remove_rate_limit(dsn, "provider:openai", schema=schema) is True
    assert sync.remove_rate_limit(dsn, "provider:openai", schema=schema) is False
    assert sync.list_rate_limits(dsn, schema=schema) == []


@pytest.mark.parametrize("order", ["fair", "fifo"])
async def test_a_spent_window_holds_its_key_while_other_keys_pass(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, order: claims.ClaimOrder
) -> None:
    await runrow.set_rate_limit(dsn, "p", runs=2, per=60, schema=schema)
    for i in range(5):
        await _enqueue(dsn, schema, f"p{i}", limit_key="p")
    for i in range(3):
        await _enqueue(dsn, schema, f"q{i}", limit_key="q")
    assert await _claim(conn, schema, order=order) == ["p0", "p1", "q0", "q1", "q2"]
    assert await _claim(conn, schema, order=order, now=T0 + timedelta(seconds=59)) == []
    assert await _claim(conn, schema, order=order, now=T0 + timedelta(seconds=60)) == ["p2", "p3"]
    (lim,) = await runrow.list_rate_limits(dsn, schema=schema)
    assert (lim.used, lim.window_start) == (2, T0 + timedelta(seconds=60))
    await runrow.remove_rate_limit(dsn, "p", schema=schema)
    assert await _claim(conn, schema, order=order, now=T0 + timedelta(seconds=61)) == ["p4"]


async def test_single_claims_count_one_by_one_and_tenant_and_agent_keys_limit_too(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await runrow.set_rate_limit(dsn, "tenant:A", runs=1, per=60, schema=schema)
    await runrow.set_rate_limit(dsn, "tenant:", runs=2, per=60, schema=schema)  # the default tenant
    for i in range(3):
        await _enqueue(dsn, schema, f"a{i}", tenant_id="A")
        await _enqueue(dsn, schema, f"b{i}", tenant_id="B")
        await _enqueue(dsn, schema, f"d{i}")
    got = [await _claim(conn, schema, limit=1) for _ in range(9)]
    assert sorted(x for g in got for x in g) == ["a0", "b0", "b1", "b2", "d0", "d1"]
    # An agent key: the claim of a worker serving it.
    await runrow.set_rate_limit(dsn, "agent:k", runs=1, per=60, schema=schema)
    for i in range(2):
        await _enqueue(dsn, schema, f"k{i}", tenant_id="K", agent_key="k")
    rows = await claims.claim(
        conn,
        schema,
        order="fair",
        limit=10,
        lease_seconds=30,
        worker_id="t",
        now=T0,
        agent_keys=("k",),
        serves_default=False,
    )
    assert [r.content for r in rows] == ["k0"]


async def test_a_run_under_two_keys_needs_both(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    await runrow.set_rate_limit(dsn, "tenant:A", runs=5, per=60, schema=schema)
    await runrow.set_rate_limit(dsn, "p", runs=1, per=60, schema=schema)
    for i in range(3):
        await _enqueue(dsn, schema, f"ap{i}", tenant_id="A", limit_key="p")
    await _enqueue(dsn, schema, "a", tenant_id="A")
    assert await _claim(conn, schema) == ["a", "ap0"]


@pytest.mark.parametrize("order", ["fair", "fifo"])
async def test_at_a_deep_backlog_the_claim_finds_runs_under_open_keys(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, order: claims.ClaimOrder
) -> None:
    await bulk.seed(conn, schema, tenant=None, n=10_000, conversations=10_000, prefix="hot")
    await conn.execute(sql.SQL("UPDATE {} SET limit_key = 'hot'").format(table(schema, "agent_run")))
    for i in range(3):
        await _enqueue(dsn, schema, f"cold{i}", limit_key="cold")
    await runrow.set_rate_limit(dsn, "hot", runs=1, per=3600, schema=schema)
    first = await _claim(conn, schema, order=order, limit=2)
    assert first.count("seeded") == 1  # the oldest hot run (and maybe the oldest cold one)
    started = time.monotonic()
    second = await _claim(conn, schema, order=order, limit=10)
    assert sorted(first + second) == ["cold0", "cold1", "cold2", "seeded"]
    assert time.monotonic() - started < 5.0


async def _started(conn: psycopg.AsyncConnection, schema: str, key: str) -> list[float]:
    cur = await conn.execute(
        sql.SQL(
            "SELECT extract(epoch FROM started_at)::float8 FROM {} WHERE limit_key = %s AND status = 'completed' "
            "ORDER BY started_at"
        ).format(table(schema, "agent_run")),
        (key,),
    )
    return [r[0] for r in await cur.fetchall()]


@pytest.mark.slow
async def test_a_limit_of_n_per_second_holds_across_four_processes(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    workers: Workers,  # noqa: F811
) -> None:
    n, per, total = 3, 1.0, 12
    await runrow.set_rate_limit(dsn, "slow", runs=n, per=per, schema=schema)
    for i in range(total):
        await _enqueue(dsn, schema, f"s{i}", limit_key="slow")
        await _enqueue(dsn, schema, f"f{i}", limit_key="free")
    for _ in range(4):
        workers.start("record_agent", concurrency=4, poll=0.2)

    async def free_done() -> bool:
        return len(await _started(conn, schema, "free")) == total

    await wait_for(free_done, timeout=30)

    async def all_done() -> bool:
        return len(await _started(conn, schema, "slow")) == total

    await wait_for(all_done, timeout=60)
    starts = await _started(conn, schema, "slow")
    # Windows of one period each hold at most n starts, so any 2n+1 consecutive starts
    # span three windows: more than one period; and the 12 starts span four windows.
    for i in range(total - 2 * n):
        assert starts[i + 2 * n] - starts[i] > per, (i, starts)
    assert starts[-1] - starts[0] > (total // n - 2) * per
    # The free key's runs did not wait for the slow key's windows (they all started in
    # the first one, whatever share of the workers the slow key's runs took).
    assert max(await _started(conn, schema, "free")) < starts[0] + per


@pytest.mark.parametrize("order", ["fair", "fifo"])
async def test_the_claim_without_limit_steps_takes_nothing_once_a_limit_is_defined(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, order: claims.ClaimOrder
) -> None:
    """The claimer's cheaper claim (no rate-limit steps, ``limits=False``) is safe only
    because it takes nothing at all while any limit or gate is defined; each claimed run
    says whether one was (``limited``), which is how the claimer picks its next claim."""
    for i in range(4):
        await _enqueue(dsn, schema, f"a{i}", tenant_id="A")
    req = claims.ClaimRequest(order, 1, 30.0, "t", now=T0, limits=False)
    (row,) = await claims.run(conn, schema, req)
    assert (row.content, row.limited) == ("a0", False)
    await runrow.set_rate_limit(dsn, "unrelated", runs=1, per=60, schema=schema)
    assert await claims.run(conn, schema, req) == []
    (row,) = await claims.run(conn, schema, req._replace(limits=True))
    assert (row.content, row.limited) == ("a1", True)
    await runrow.set_rate_limit(dsn, "tenant:A", runs=1, per=60, schema=schema)
    assert await claims.run(conn, schema, req) == []
    (row,) = await claims.run(conn, schema, req._replace(limits=True, limit=5))
    assert (row.content, row.limited) == ("a2", True)  # (tenant A's window: one run)
    assert await claims.run(conn, schema, req._replace(limits=True)) == []


async def test_a_limit_defined_mid_backlog_holds_for_a_running_dispatcher(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A dispatcher that had been claiming without the limit steps (no limit defined)
    honours a limit defined while it works through a backlog: the ending that would have
    claimed the next run without them takes nothing, and the full claim counts."""
    total = 12
    for i in range(total):
        await _enqueue(dsn, schema, f"r{i}", tenant_id="A")
    started: list[str] = []

    async def agent(ctx: runrow.RunContext) -> None:
        started.append(str(ctx.content))
        if len(started) == 3:
            await runrow.set_rate_limit(dsn, "tenant:A", runs=1, per=3600, schema=schema)

    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=1, poll=0.1, lease=10, heartbeat=2):
        await anyio.sleep(1.5)  # (15 polls: time enough for any claim that would not count)
        assert started == ["r0", "r1", "r2", "r3"]  # (the window's one run, then none)
        await runrow.remove_rate_limit(dsn, "tenant:A", schema=schema)

        async def drained() -> bool:
            return len(started) == total

        await wait_for(drained, timeout=20)
