"""Queue position under the fair order, the estimated wait, and `runrow runs position`."""

from __future__ import annotations

import json
from datetime import timedelta

import anyio
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

import runrow
from runrow.cli import main

from . import manual
from .bulk import seed
from .helpers import empty, enqueue_turn, rows, table

pytestmark = pytest.mark.anyio


async def _positions(dsn: str, schema: str, runs: list[runrow.Run]) -> list[int | None]:
    return [(await runrow.queue_position(dsn, r.id, schema=schema)).position for r in runs]


async def test_one_tenant_counts_in_claim_order(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    runs = [await enqueue_turn(dsn, schema, f"c{i}") for i in range(4)]
    urgent = await enqueue_turn(dsn, schema, "urgent", priority=3)
    assert await _positions(dsn, schema, [*runs, urgent]) == [2, 3, 4, 5, 1]
    await manual.claim(conn, schema, limit=2)  # takes urgent and c0
    pos = await runrow.queue_position(dsn, runs[0].id, schema=schema)
    assert (pos.status, pos.position, pos.estimated_wait_seconds) == ("running", None, None)
    assert await _positions(dsn, schema, runs[1:]) == [1, 2, 3]


async def test_positions_follow_the_fair_order_across_tenants(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    for i in range(3):
        await enqueue_turn(dsn, schema, f"run{i}", tenant_id="hot")
    await manual.claim(conn, schema, limit=3)  # hot: 3 running
    hot = [await enqueue_turn(dsn, schema, f"h{i}", tenant_id="hot") for i in range(10)]
    cold = [await enqueue_turn(dsn, schema, f"k{i}", tenant_id="cold") for i in range(2)]
    got = await _positions(dsn, schema, [*hot[:3], *cold])
    # cold's loads are 0 and 1, hot's start at 3: cold goes first.
    assert got == [3, 4, 5, 1, 2]
    # The positions are the order the claim really takes them in.
    order = [(await manual.claim(conn, schema, limit=1))[0]["content"] for _ in range(5)]
    assert order == ["k0", "k1", "h0", "h1", "h2"]


async def test_weights_and_ties_match_the_claim(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    await runrow.set_tenant_policy(dsn, "A", weight=2, schema=schema)
    runs = []
    for i in range(4):
        runs.append(await enqueue_turn(dsn, schema, f"a{i}", tenant_id="A"))
        runs.append(await enqueue_turn(dsn, schema, f"b{i}", tenant_id="B", priority=1 if i == 3 else 0))
    positions = await _positions(dsn, schema, runs)
    predicted = [
        r.conversation_id for _, r in sorted(zip(positions, runs, strict=True), key=lambda x: x[0] or 0)
    ]
    assert sorted(p or 0 for p in positions) == list(range(1, 9))
    # Loads A: 0, 1/2, 1, 3/2; B: 0, 1, 2, 3 (b3 is B's first by priority). The tie at 0
    # goes to the higher priority (b3), the tie at 1 to the older run (b0 before a2).
    # Successive single claims take them in exactly that order.
    order = [(await manual.claim(conn, schema, limit=1))[0]["content"] for _ in range(8)]
    assert order == ["b3", "a0", "a1", "b0", "a2", "a3", "b1", "b2"]
    assert predicted == order


async def test_estimated_wait_uses_recent_throughput_and_not_before(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    empty = await enqueue_turn(dsn, schema, "first")
    assert (await runrow.queue_position(dsn, empty.id, schema=schema)).estimated_wait_seconds is None
    for i in range(10):
        await enqueue_turn(dsn, schema, f"done{i}")
    for row in await manual.claim(conn, schema, limit=11):
        assert await manual.finalize(conn, schema, row["id"], row["claim_token"], "completed", 3)
    runs = [await enqueue_turn(dsn, schema, f"q{i}") for i in range(3)]
    pos = await runrow.queue_position(dsn, runs[2].id, schema=schema)
    # 11 finished in the 5-minute window: 2.2 runs/min; #3 waits about 3 / (11/300) s.
    assert pos.position == 3 and pos.throughput_per_minute == pytest.approx(2.2)
    assert pos.estimated_wait_seconds == pytest.approx(3 / (11 / 300))
    later = await enqueue_turn(dsn, schema, "later", not_before=timedelta(hours=1))
    pos = await runrow.queue_position(dsn, later.id, schema=schema)
    assert pos.estimated_wait_seconds is not None and 3590 < pos.estimated_wait_seconds <= 3600


async def test_unknown_run_is_not_found(dsn: str, schema: str) -> None:
    with pytest.raises(runrow.RunNotFound):
        await runrow.queue_position(dsn, "00000000-0000-0000-0000-000000000000", schema=schema)


async def test_cli_runs_position(dsn: str, schema: str, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [await enqueue_turn(dsn, schema, f"c{i}") for i in range(3)]
    common = ["--database-url", dsn, "--schema", schema]
    # The CLI runs its own event loop: give it a thread.
    assert await anyio.to_thread.run_sync(main, ["runs", "position", str(runs[2].id), *common]) == 0
    assert "#3 in the queue" in capsys.readouterr().out
    assert await anyio.to_thread.run_sync(main, ["runs", "position", str(runs[0].id), *common, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["position"] == 1 and data["status"] == "queued"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    # (tenant, priority) per run, each in its own conversation so that every run is claimable.
    runs=st.lists(st.tuples(st.sampled_from("ABC"), st.sampled_from([0, 0, 1])), min_size=1, max_size=14),
    weights=st.tuples(*(st.integers(min_value=1, max_value=3) for _ in range(3))),
    started=st.integers(min_value=0, max_value=4),
)
async def test_exact_positions_are_the_successive_claim_order(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    runs: list[tuple[str, int]],
    weights: tuple[int, int, int],
    started: int,
) -> None:
    await empty(conn, schema)
    for tenant, weight in zip("ABC", weights, strict=True):
        await runrow.set_tenant_policy(dsn, tenant, weight=weight, schema=schema)
    made = [
        await enqueue_turn(dsn, schema, f"r{i}", tenant_id=tenant, priority=priority)
        for i, (tenant, priority) in enumerate(runs)
    ]
    for _ in range(started):  # some running runs shift the tenants' loads
        await manual.claim(conn, schema, limit=1)
    queued = [r for r in made if (await runrow.get_run(dsn, r.id, schema=schema)).status == "queued"]
    places = [await runrow.queue_position(dsn, r.id, schema=schema) for r in queued]
    assert all(p.exact for p in places)
    predicted = [
        r.conversation_id
        for _, r in sorted(zip([p.position for p in places], queued, strict=True), key=lambda x: x[0] or 0)
    ]
    assert sorted(p.position or 0 for p in places) == list(range(1, len(queued) + 1))
    order = [(await manual.claim(conn, schema, limit=1))[0]["content"] for _ in queued]
    assert predicted == order


async def test_a_deep_queue_is_estimated_past_the_first_thousand(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    # 3,000 of A's, then 2,000 of B's; weights 1, nothing running. Past 1,000 runs counted
    # the position is extrapolated and flagged, within a few percent here.
    await seed(conn, schema, tenant="A", n=3000, conversations=3000)
    await seed(conn, schema, tenant="B", n=2000, conversations=2000)
    ids = await rows(
        conn,
        sql.SQL("SELECT id, tenant_id FROM {} WHERE status = 'queued' ORDER BY queue_order").format(
            table(schema, "agent_run")
        ),
    )
    a = [r[0] for r in ids if r[1] == "A"]
    b = [r[0] for r in ids if r[1] == "B"]

    async def where(run_id: object) -> runrow.QueuePosition:
        return await runrow.queue_position(dsn, str(run_id), schema=schema)

    # A's 300th: 299 of A's ahead, and B's first 300 (B's 300th ties with it and loses: younger).
    first = await where(a[299])
    assert (first.exact, first.rank_in_tenant, first.position) == (True, 300, 599)
    # A's 2,500th: rank 2,500; B's runs with a load below 2,499: all 2,000 of them. True
    # position 4,500; both counts are estimated.
    deep = await where(a[2499])
    assert deep.exact is False
    assert deep.rank_in_tenant is not None and abs(deep.rank_in_tenant - 2500) <= 25
    assert deep.position is not None and abs(deep.position - 4500) <= 45
    # B's 1,500th: rank 1,500; A's 1,500 with loads 0..1,499 go first (the tie to the older A's).
    late = await where(b[1499])
    assert late.exact is False
    assert late.position is not None and abs(late.position - 3000) <= 30
