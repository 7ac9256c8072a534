"""Load shedding and the reject policy: typed refusals, nothing written, exact under races."""

from __future__ import annotations

import anyio
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

import runrow

from . import manual
from .helpers import counts, empty, enqueue_turn, rows, table

pytestmark = pytest.mark.anyio


async def test_tenant_limit_sheds_with_a_hint_and_writes_nothing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    for i in range(3):
        await enqueue_turn(dsn, schema, f"c{i}", tenant_id="T", max_queued_per_tenant=3)
    before = await counts(conn, schema)
    with pytest.raises(runrow.Overloaded) as info:
        await enqueue_turn(dsn, schema, "c9", tenant_id="T", max_queued_per_tenant=3)
    err = info.value
    assert isinstance(err, runrow.RunrowError)
    assert (err.scope, err.key, err.limit) == ("tenant", "T", 3)
    assert 1 <= err.retry_after <= 3600
    assert await counts(conn, schema) == before
    # Other tenants, and the same tenant without a limit, are not affected.
    await enqueue_turn(dsn, schema, "u1", tenant_id="U", max_queued_per_tenant=3)
    await enqueue_turn(dsn, schema, "c3", tenant_id="T")
    # Only queued runs count: once they start, more fit.
    assert len(await manual.claim(conn, schema, limit=10)) == 5
    for i in range(3):
        await enqueue_turn(dsn, schema, f"d{i}", tenant_id="T", max_queued_per_tenant=3)


async def test_conversation_limit(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    await enqueue_turn(dsn, schema, "c", max_queued_per_conversation=2)
    await enqueue_turn(dsn, schema, "c", max_queued_per_conversation=2)
    before = await counts(conn, schema)
    with pytest.raises(runrow.Overloaded) as info:
        await enqueue_turn(dsn, schema, "c", max_queued_per_conversation=2)
    assert (info.value.scope, info.value.key, info.value.limit) == ("conversation", "c", 2)
    assert await counts(conn, schema) == before
    await enqueue_turn(dsn, schema, "other", max_queued_per_conversation=2)


async def test_retry_after_follows_recent_throughput(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    # Ten of the tenant's runs finished just now: one every 30 s over the 5-minute window.
    for i in range(10):
        await enqueue_turn(dsn, schema, f"done{i}", tenant_id="T")
    for row in await manual.claim(conn, schema, limit=10):
        assert await manual.finalize(conn, schema, row["id"], row["claim_token"], "completed", 3)
    await enqueue_turn(dsn, schema, "q", tenant_id="T")
    with pytest.raises(runrow.Overloaded) as info:
        await enqueue_turn(dsn, schema, "q2", tenant_id="T", max_queued_per_tenant=1)
    assert info.value.retry_after == 30


async def test_a_repeat_of_an_accepted_key_is_not_shed(dsn: str, schema: str) -> None:
    first = await enqueue_turn(dsn, schema, "c", idempotency_key="k1", max_queued_per_conversation=1)
    again = await enqueue_turn(dsn, schema, "c", idempotency_key="k1", max_queued_per_conversation=1)
    assert again.id == first.id and not again.created
    with pytest.raises(runrow.Overloaded):
        await enqueue_turn(dsn, schema, "c", idempotency_key="k2", max_queued_per_conversation=1)


@pytest.mark.parametrize(
    "gate",
    [{"max_queued_per_conversation": 1}, {"on_busy": "reject"}, {"on_busy": "interrupt"}],
    ids=["limit", "reject", "interrupt"],
)
async def test_a_reused_key_for_another_message_is_a_conflict_under_a_gate(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, gate: dict[str, object]
) -> None:
    first = await enqueue_turn(dsn, schema, "c", idempotency_key="k1", **gate)
    before = await counts(conn, schema)
    with pytest.raises(runrow.IdempotencyConflict) as info:
        await runrow.enqueue(
            dsn,
            schema=schema,
            conversation_id="c",
            user_id="u",
            content="other",
            idempotency_key="k1",
            **gate,  # type: ignore[arg-type]
        )
    assert info.value.run_id == first.id and info.value.fields == ("content",)
    assert await counts(conn, schema) == before
    assert (await runrow.get_run(dsn, first.id, schema=schema)).status == "queued"  # nothing stopped


async def test_the_limit_holds_exactly_under_concurrent_enqueues(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    outcomes: list[str] = []

    async def one(i: int) -> None:
        try:
            await enqueue_turn(dsn, schema, f"c{i}", tenant_id="T", max_queued_per_tenant=5)
            outcomes.append("created")
        except runrow.Overloaded:
            outcomes.append("shed")

    async with anyio.create_task_group() as tg:
        for i in range(30):
            tg.start_soon(one, i)
    assert sorted(outcomes) == ["created"] * 5 + ["shed"] * 25
    assert (await counts(conn, schema))["agent_run"] == 5


async def test_reject_when_busy_is_typed_and_writes_nothing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    first = await enqueue_turn(dsn, schema, "c", on_busy="reject")  # idle: accepted
    before = await counts(conn, schema)
    with pytest.raises(runrow.ConversationBusy) as info:
        await enqueue_turn(dsn, schema, "c", on_busy="reject")
    assert info.value.conversation_id == "c"
    assert await counts(conn, schema) == before
    (row,) = await manual.claim(conn, schema)
    with pytest.raises(runrow.ConversationBusy):  # running counts as busy too
        await enqueue_turn(dsn, schema, "c", on_busy="reject")
    assert await manual.finalize(conn, schema, first.id, row["claim_token"], "completed", 3)
    await enqueue_turn(dsn, schema, "c", on_busy="reject")


async def test_concurrent_rejects_on_an_idle_conversation_admit_exactly_one(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    outcomes: list[str] = []

    async def one() -> None:
        try:
            await enqueue_turn(dsn, schema, "c", on_busy="reject")
            outcomes.append("created")
        except runrow.ConversationBusy:
            outcomes.append("busy")

    async with anyio.create_task_group() as tg:
        for _ in range(12):
            tg.start_soon(one)
    assert sorted(outcomes) == ["busy"] * 11 + ["created"]


async def test_gated_enqueue_joins_the_callers_transaction(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as own, own.transaction(force_rollback=True):
        await enqueue_turn(own, schema, "c", max_queued_per_conversation=1)  # type: ignore[arg-type]
        with pytest.raises(runrow.Overloaded):
            await enqueue_turn(own, schema, "c", max_queued_per_conversation=1)  # type: ignore[arg-type]
    assert await runrow.list_runs(dsn, schema=schema) == []


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("enqueue"), st.sampled_from("AB"), st.integers(min_value=1, max_value=6)),
            st.tuples(st.just("claim"), st.just(""), st.integers(min_value=1, max_value=3)),
        ),
        min_size=1,
        max_size=25,
    )
)
async def test_the_tenant_gate_admits_exactly_below_its_limit(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, steps: list[tuple[str, str, int]]
) -> None:
    # The gate answers "below the limit" from the queue's queue_order span when it can and
    # counts the tenant's queue otherwise (#17); claims leave holes in the span and other
    # tenants' runs widen it. Either way it admits exactly when the tenant's queued count,
    # read here, is below the limit.
    await empty(conn, schema)
    for i, (op, tenant, n) in enumerate(steps):
        if op == "claim":
            await manual.claim(conn, schema, limit=n)
            continue
        queued = await rows(
            conn,
            sql.SQL("SELECT count(*) FROM {} WHERE status = 'queued' AND tenant_id = %s").format(
                table(schema, "agent_run")
            ),
            (tenant,),
        )
        try:
            await enqueue_turn(dsn, schema, f"c{i}", tenant_id=tenant, max_queued_per_tenant=n)
            admitted = True
        except runrow.Overloaded as err:
            assert (err.scope, err.key) == ("tenant", tenant)
            admitted = False
        assert admitted == (queued[0][0] < n), (queued[0][0], n)
