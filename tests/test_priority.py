"""Priorities and delayed runs: the claim honours them, on the database's clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import runrow

from . import manual
from .helpers import enqueue_turn, run_row

pytestmark = pytest.mark.anyio


async def test_higher_priority_first_within_a_tenant(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await enqueue_turn(dsn, schema, "p0")
    await enqueue_turn(dsn, schema, "p5", priority=5)
    await enqueue_turn(dsn, schema, "p1", priority=1)
    await enqueue_turn(dsn, schema, "p5-later", priority=5)
    order = [(await manual.claim(conn, schema, limit=1))[0]["content"] for _ in range(4)]
    assert order == ["p5", "p5-later", "p1", "p0"]


async def test_priority_never_reorders_a_conversation(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    first = await enqueue_turn(dsn, schema, "same")
    await enqueue_turn(dsn, schema, "same", priority=100)
    (row,) = await manual.claim(conn, schema, limit=5)
    assert row["id"] == first.id


async def test_priority_does_not_buy_a_bigger_share(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await enqueue_turn(dsn, schema, "a-urgent", tenant_id="A", priority=10)
    await enqueue_turn(dsn, schema, "a-urgent-2", tenant_id="A", priority=10)
    await enqueue_turn(dsn, schema, "b-plain", tenant_id="B")
    order = [(await manual.claim(conn, schema, limit=1))[0]["content"] for _ in range(3)]
    # Priority breaks the tie at equal shares, but A's second run waits for B's share.
    assert order == ["a-urgent", "b-plain", "a-urgent-2"]


@pytest.mark.parametrize("claim", ["claim", "claim_fifo"])
async def test_not_before_is_honoured_on_the_database_clock(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, claim: str
) -> None:
    run = await enqueue_turn(dsn, schema, "later", not_before=timedelta(minutes=5))
    row = await run_row(conn, schema, run.id)
    # Computed in the enqueue statement from the database's clock: exactly 5 minutes on.
    assert row["not_before"] - row["created_at"] == timedelta(minutes=5)
    assert await _claim(conn, schema, claim, now=None) == []
    assert await _claim(conn, schema, claim, now=row["not_before"] - timedelta(seconds=1)) == []
    (got,) = await _claim(conn, schema, claim, now=row["not_before"])
    assert got["id"] == run.id


async def _claim(
    conn: psycopg.AsyncConnection, schema: str, name: str, *, now: datetime | None
) -> list[dict[str, object]]:
    from runrow._gateway import statement_text

    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    await cur.execute(
        statement_text(name, schema),
        {
            "limit": 5,
            "lease_seconds": 30,
            "worker_id": "t",
            "now": now,
            "retry_policy": None,
            "version": None,
            "same_version": False,
            "agent_keys": [],
            "serves_default": True,
            "tree_cap": None,
        },
    )
    return await cur.fetchall()


async def test_a_delayed_turn_holds_back_its_conversation_not_others(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    at = datetime.now(UTC) + timedelta(hours=1)
    delayed = await enqueue_turn(dsn, schema, "c", not_before=at)
    behind = await enqueue_turn(dsn, schema, "c")
    other = await enqueue_turn(dsn, schema, "d")
    assert (await run_row(conn, schema, delayed.id))["not_before"] == at
    assert [r["id"] for r in await manual.claim(conn, schema, limit=5)] == [other.id]
    got = await manual.claim(conn, schema, limit=5, now=at)
    assert [r["id"] for r in got] == [delayed.id]
    assert behind.id not in [r["id"] for r in got]


async def test_bad_schedule_arguments_write_nothing(dsn: str, schema: str) -> None:
    with pytest.raises(runrow.InvalidInput, match="timezone-aware"):
        await enqueue_turn(dsn, schema, "c", not_before=datetime(2030, 1, 1))
    with pytest.raises(runrow.InvalidInput, match="priority"):
        await enqueue_turn(dsn, schema, "c", priority=2**40)
    with pytest.raises(runrow.InvalidInput, match="deadline"):
        await enqueue_turn(dsn, schema, "c", deadline="soon")
    with pytest.raises(runrow.InvalidInput, match="on_busy"):
        await enqueue_turn(dsn, schema, "c", on_busy="shout")
    assert await runrow.list_runs(dsn, schema=schema) == []
