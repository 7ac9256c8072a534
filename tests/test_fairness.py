"""The fair claim: tenants by running share and weight, caps, one statement, and the bound
that a hot tenant's 10,000 queued runs delay another tenant's run by at most one claim."""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime, timedelta

import anyio
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

import runrow

from . import manual
from .bulk import seed
from .helpers import assert_journal_sound, empty, rows, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}


async def _enqueue(dsn: str, schema: str, tenant: str | None, conversation: str, **kw: object) -> runrow.Run:
    return await runrow.enqueue(
        dsn,
        schema=schema,
        conversation_id=conversation,
        user_id="u",
        content=conversation,
        tenant_id=tenant,
        **kw,  # type: ignore[arg-type]
    )


async def _claim_one(conn: psycopg.AsyncConnection, schema: str) -> str:
    (row,) = await manual.claim(conn, schema, limit=1)
    return str(row["content"])


async def test_single_claims_go_to_the_tenant_with_the_smallest_share_then_the_oldest(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    for name in ("a1", "a2", "a3"):
        await _enqueue(dsn, schema, "A", name)
    for name in ("b1", "b2"):
        await _enqueue(dsn, schema, "B", name)
    await _enqueue(dsn, schema, None, "c1")  # the default tenant is a tenant like any other
    order = [await _claim_one(conn, schema) for _ in range(6)]
    # a1 (all idle, oldest); then B and the default tenant have nothing running; then
    # everyone has one running and age decides (a2 before b2); then A is the only one left.
    assert order == ["a1", "b1", "c1", "a2", "b2", "a3"]
    assert await manual.claim(conn, schema, limit=1) == []


async def test_one_batch_interleaves_tenants_by_share(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    for i in range(2):
        await _enqueue(dsn, schema, "A", f"a-run{i}")
    assert len(await manual.claim(conn, schema, limit=2)) == 2  # A has 2 running
    for i in range(5):
        await _enqueue(dsn, schema, "A", f"a{i}")
    for i in range(5):
        await _enqueue(dsn, schema, "B", f"b{i}")
    got = await manual.claim(conn, schema, limit=3)
    # B's shares 0 and 1 come first; at share 2, A's oldest ties B's third and is older.
    assert sorted(r["content"] for r in got) == ["a0", "b0", "b1"]
    assert len({r["conversation_id"] for r in got}) == 3


async def test_weights_scale_a_tenants_share(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    await runrow.set_tenant_policy(dsn, "A", weight=3, schema=schema)
    for i in range(8):
        await _enqueue(dsn, schema, "A", f"a{i}")
    for i in range(8):
        await _enqueue(dsn, schema, "B", f"b{i}")
    got = await manual.claim(conn, schema, limit=8)
    tenants = [r["tenant_id"] for r in got]
    # Loads A: 0, 1/3, 2/3, 1, 4/3, 5/3 ...; B: 0, 1, 2 ... -> A takes 6 of 8.
    assert tenants.count("A") == 6 and tenants.count("B") == 2
    assert await runrow.tenant_policies(dsn, schema=schema) == [runrow.TenantPolicy("A", 3, None)]


async def test_max_running_caps_a_tenant(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    await runrow.set_tenant_policy(dsn, "A", max_running=2, schema=schema)
    for i in range(5):
        await _enqueue(dsn, schema, "A", f"a{i}")
    await _enqueue(dsn, schema, "B", "b0")
    got = await manual.claim(conn, schema, limit=10)
    assert sorted(r["content"] for r in got) == ["a0", "a1", "b0"]
    assert await manual.claim(conn, schema, limit=10) == []  # A is at its cap
    first = next(r for r in got if r["content"] == "a0")
    assert await manual.finalize(conn, schema, first["id"], first["claim_token"], "completed", 3)
    assert [r["content"] for r in await manual.claim(conn, schema, limit=10)] == ["a2"]
    # Lifting the cap takes effect on the next claim.
    await runrow.set_tenant_policy(dsn, "A", max_running=None, schema=schema)
    assert sorted(r["content"] for r in await manual.claim(conn, schema, limit=10)) == ["a3", "a4"]


async def test_conversation_order_and_one_turn_per_conversation_still_hold(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    turns = [await _enqueue(dsn, schema, "A", "same") for _ in range(3)]
    await _enqueue(dsn, schema, "B", "other")
    got = await manual.claim(conn, schema, limit=10)
    assert sorted(r["id"] for r in got) == sorted(
        [turns[0].id, *[r["id"] for r in got if r["tenant_id"] == "B"]]
    )
    assert len(got) == 2
    mine = next(r for r in got if r["id"] == turns[0].id)
    assert await manual.finalize(conn, schema, mine["id"], mine["claim_token"], "completed", 3)
    assert [r["id"] for r in await manual.claim(conn, schema, limit=10)] == [turns[1].id]


async def test_a_hot_tenants_10000_runs_do_not_delay_another_tenants_run(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    assert await seed(conn, schema, tenant="hot", n=10_000, conversations=2_000) == 10_000
    assert len(await manual.claim(conn, schema, limit=8)) == 8  # the hot tenant is busy
    cold = await _enqueue(dsn, schema, "cold", "cold-1")
    (nxt,) = await manual.claim(conn, schema, limit=1)
    assert nxt["id"] == cold.id  # the very next claim
    # And the claim does not read the hot tenant's queue to find it: the plan's rows
    # out of agent_run stay far below 10,000.
    plan = await _explain_claim(conn, schema)
    assert plan["rows_from_agent_run"] < 500, plan


async def test_one_tenants_claim_reads_past_runs_another_claim_has_locked(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    # One tenant with queued work: the claim walks its queue in order and skips what a
    # concurrent claim holds, however much that is (no fixed pool of candidates to run
    # out of), and still takes the oldest runs it can.
    await seed(conn, schema, tenant=None, n=30, conversations=30)
    order = [
        r[0]
        for r in await rows(
            conn,
            sql.SQL("SELECT id FROM {} WHERE status = 'queued' ORDER BY queue_order").format(
                table(schema, "agent_run")
            ),
        )
    ]
    async with await psycopg.AsyncConnection.connect(dsn) as other, other.transaction():
        await other.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = ANY(%s) FOR UPDATE").format(table(schema, "agent_run")),
            [order[:20]],
        )
        got = await manual.claim(conn, schema, limit=2)
        assert sorted(r["id"] for r in got) == sorted(order[20:22])  # (a batch comes unordered)
    # With the locks gone, the claim starts again from the oldest.
    assert sorted(r["id"] for r in await manual.claim(conn, schema, limit=3)) == sorted(order[:3])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    # (conversation, priority, delayed an hour): enough conversations that several turns
    # are eligible at once, so that order, batch size and cap all decide something.
    turns=st.lists(
        st.tuples(st.sampled_from("abcdefgh"), st.sampled_from([0, 1, 5]), st.booleans()),
        min_size=2,
        max_size=16,
    ),
    started=st.integers(min_value=0, max_value=3),
    cap=st.none() | st.integers(min_value=1, max_value=5),
    limit=st.integers(min_value=1, max_value=5),
)
async def test_one_tenants_batch_is_exactly_the_documented_order(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    turns: list[tuple[str, int, bool]],
    started: int,
    cap: int | None,
    limit: int,
) -> None:
    # The claim of one tenant's runs against a model of the rules in runrow.tenants:
    # eligible = queued, due, its conversation's oldest queued turn with none running;
    # ranked by priority then age; at most the batch size and what the cap leaves.
    await empty(conn, schema)
    for conversation, priority, delayed in turns:
        await _enqueue(
            dsn,
            schema,
            None,
            conversation,
            priority=priority,
            not_before=timedelta(hours=1) if delayed else None,
        )
    for _ in range(started):
        await manual.claim(conn, schema, limit=1)
    if cap is not None:
        await runrow.set_tenant_policy(dsn, None, max_running=cap, schema=schema)
    state = await rows(
        conn,
        sql.SQL(
            "SELECT id, conversation_id, status, priority, queue_order, coalesce(not_before <= now(), true) FROM {}"
        ).format(table(schema, "agent_run")),
    )
    running = [r for r in state if r[2] == "running"]
    queued = [r for r in state if r[2] == "queued"]
    busy = {r[1] for r in running}
    oldest = {c: min(r[4] for r in queued if r[1] == c) for c in {r[1] for r in queued}}
    eligible = sorted(
        (r for r in queued if r[5] and r[1] not in busy and r[4] == oldest[r[1]]), key=lambda r: (-r[3], r[4])
    )
    room = limit if cap is None else max(0, min(limit, cap - len(running)))
    got = await manual.claim(conn, schema, limit=limit)
    assert sorted(r["id"] for r in got) == sorted(r[0] for r in eligible[:room])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    # (tenant, conversation, priority, delayed an hour): conversations belong to a tenant;
    # a few per tenant so that a tenant's first run is often blocked (its conversation busy,
    # an older turn waiting, or not yet due) and the claim must look past it.
    turns=st.lists(
        st.tuples(
            st.sampled_from(["A", "B", "C", None]),
            st.sampled_from("xyz"),
            st.sampled_from([0, 1]),
            st.booleans(),
        ),
        min_size=2,
        max_size=18,
    ),
    weights=st.fixed_dictionaries({"A": st.integers(1, 3), "B": st.integers(1, 3)}),
    cap=st.none() | st.integers(min_value=1, max_value=2),
    # after each claim: end the oldest running run first (True) or keep it running (False)
    ends=st.lists(st.booleans(), min_size=1, max_size=24),
)
async def test_every_single_claim_across_tenants_is_exactly_the_documented_pick(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    turns: list[tuple[str | None, str, int, bool]],
    weights: dict[str, int],
    cap: int | None,
    ends: list[bool],
) -> None:
    # Against a model of the rules in runrow.tenants: among each tenant's eligible runs
    # (queued, due, its conversation's oldest queued turn with none running), the first by
    # (priority DESC, age) is its offer; a tenant at its cap offers nothing; the claim takes
    # the offer with the smallest running / weight, then the highest priority, then the oldest.
    await empty(conn, schema)
    for tenant, conversation, priority, delayed in turns:
        await _enqueue(
            dsn,
            schema,
            tenant,
            f"{tenant}-{conversation}",
            priority=priority,
            not_before=timedelta(hours=1) if delayed else None,
        )
    for tenant, weight in weights.items():
        await runrow.set_tenant_policy(dsn, tenant, weight=weight, schema=schema)
    if cap is not None:
        await runrow.set_tenant_policy(dsn, "C", max_running=cap, schema=schema)
    weight_of = {**weights, "C": 1, "": 1}
    held: list[tuple[uuid.UUID, uuid.UUID]] = []  # running, oldest claim first
    for end_one in ends:
        state = await rows(
            conn,
            sql.SQL(
                "SELECT id, tenant_key, conversation_id, status, priority, queue_order,"
                " coalesce(not_before <= now(), true) FROM {}"
            ).format(table(schema, "agent_run")),
        )
        queued = [r for r in state if r[3] == "queued"]
        busy = {r[2] for r in state if r[3] == "running"}
        running: dict[str, int] = {}
        for r in state:
            if r[3] == "running":
                running[r[1]] = running.get(r[1], 0) + 1
        oldest = {c: min(r[5] for r in queued if r[2] == c) for c in {r[2] for r in queued}}
        offers = []
        for tenant in {r[1] for r in queued}:
            if tenant == "C" and cap is not None and running.get("C", 0) >= cap:
                continue
            eligible = sorted(
                (r for r in queued if r[1] == tenant and r[6] and r[2] not in busy and r[5] == oldest[r[2]]),
                key=lambda r: (-r[4], r[5]),
            )
            if eligible:
                first = eligible[0]
                offers.append((running.get(tenant, 0) / weight_of[tenant], -first[4], first[5], first[0]))
        got = await manual.claim(conn, schema, limit=1)
        assert [r["id"] for r in got] == ([min(offers)[3]] if offers else [])
        held += [(r["id"], r["claim_token"]) for r in got]
        if end_one and held:
            run_id, token = held.pop(0)
            assert await manual.finalize(conn, schema, run_id, token, "completed", 3)
        if not got and not held:
            break


async def _explain_claim(conn: psycopg.AsyncConnection, schema: str) -> dict[str, int]:
    from runrow._gateway import statement_text

    query = b"EXPLAIN (ANALYZE, FORMAT JSON) " + statement_text("claim", schema)
    row = None
    async with conn.transaction(force_rollback=True):  # EXPLAIN ANALYZE really claims: undo it
        cur = await conn.execute(
            query,
            {
                "limit": 8,
                "lease_seconds": 30,
                "worker_id": "explain",
                "now": None,
                "retry_policy": None,
                "version": None,
                "same_version": False,
                "agent_keys": [],
                "serves_default": True,
                "tree_cap": None,
            },
        )
        row = await cur.fetchone()
    assert row is not None
    total = 0

    def walk(node: dict[str, object]) -> None:
        nonlocal total
        if node.get("Relation Name") == "agent_run":
            total += int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))  # type: ignore[call-overload]
            total += int(node.get("Rows Removed by Filter", 0)) * int(node.get("Actual Loops", 1))  # type: ignore[call-overload]
        for child in node.get("Plans", []):  # type: ignore[attr-defined]
            walk(child)

    walk(row[0][0]["Plan"])
    return {"rows_from_agent_run": total}


async def _started(conn: psycopg.AsyncConnection, schema: str) -> list[tuple[str | None, str, datetime]]:
    return [
        (r[0], r[1], r[2])
        for r in await rows(
            conn,
            sql.SQL(
                "SELECT tenant_id, worker_id, started_at FROM {} WHERE started_at IS NOT NULL ORDER BY started_at"
            ).format(table(schema, "agent_run")),
        )
    ]


async def _db_clock(conn: psycopg.AsyncConnection) -> datetime:
    cur = await conn.execute("SELECT clock_timestamp()")
    row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize("order", ["fair", "fifo"])
async def test_eight_dispatchers_take_the_cold_run_within_one_claim_each(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, order: str
) -> None:
    await seed(conn, schema, tenant="hot", n=10_000, conversations=2_000)
    ran: list[uuid.UUID] = []

    async def agent(run: runrow.RunContext) -> None:
        ran.append(run.run_id)
        if run.tenant_id == "hot":
            await anyio.sleep(0.2)

    async with contextlib.AsyncExitStack() as stack:
        for _ in range(8):
            await stack.enter_async_context(
                runrow.Dispatcher(dsn, agent, schema=schema, concurrency=1, claim_order=order, **FAST)  # type: ignore[arg-type]
            )
        await wait_for(lambda: len(ran) >= 24, what="hot runs flowing through 8 dispatchers")
        cold = await _enqueue(dsn, schema, "cold", "cold-1")
        committed = await _db_clock(conn)
        if order == "fifo":
            # The control: plain FIFO lets the hot tenant's backlog go first.
            await wait_for(lambda: len(ran) >= 60, what="more hot runs")
            assert cold.id not in ran
        else:
            await wait_for(lambda: cold.id in ran, timeout=10, what="the cold run")
    if order == "fifo":
        return
    info = await runrow.get_run(dsn, cold.id, schema=schema)
    assert info.status == "completed" and info.started_at is not None
    await assert_journal_sound(conn, schema, cold.id)
    # Hot runs claimed after the cold run was committed and before it was claimed: at
    # most one claim per dispatcher (claims already in flight, or racing for its lock).
    between = [
        (w, at)
        for t, w, at in await _started(conn, schema)
        if t == "hot" and committed < at < info.started_at
    ]
    per_worker: dict[str, int] = {}
    for w, _ in between:
        per_worker[w] = per_worker.get(w, 0) + 1
    assert all(n <= 1 for n in per_worker.values()), per_worker
    assert (info.started_at - committed).total_seconds() < 2.0
