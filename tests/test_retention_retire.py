"""Retention in O(partitions) (#44, schema 28): trim retires a journal partition once
nobody needs it (one row: its range of creation times), which trims every run made in
it, and then drops it. No run's row is written; a retry of a lineage made in a retired
range is refused, and a lock row orders trim against a retry being written."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

import runrow
from runrow._gateway import _exec
from runrow._gateway import partitions as _pgw

from . import manual
from .helpers import events, hourly_partitions, run_row, table, wait_for

pytestmark = pytest.mark.anyio


async def _xmins(conn: psycopg.AsyncConnection, schema: str) -> dict[uuid.UUID, str]:
    cur = await conn.execute(sql.SQL("SELECT id, xmin::text FROM {}").format(table(schema, "agent_run")))
    return {row[0]: row[1] for row in await cur.fetchall()}


async def _record_step(conn: psycopg.AsyncConnection, schema: str, lineage: uuid.UUID) -> None:
    await conn.execute(
        sql.SQL(
            "INSERT INTO {} (lineage_id, key, occurrence, position, run_id, status, idempotent, result,"
            " recorded_at) VALUES (%s, 'k', 0, 0, %s, 'recorded', false, %s, now())"
        ).format(table(schema, "run_step")),
        (lineage, lineage, Jsonb(1)),
    )


async def _step_lineages(conn: psycopg.AsyncConnection, schema: str) -> list[uuid.UUID]:
    cur = await conn.execute(sql.SQL("SELECT lineage_id FROM {}").format(table(schema, "run_step")))
    return [row[0] for row in await cur.fetchall()]


async def _ms(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID) -> int:
    cur = await conn.execute(sql.SQL("SELECT {}(%s)").format(table(schema, "run_ms")), (run_id,))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _retired(conn: psycopg.AsyncConnection, schema: str) -> list[tuple[int, int]]:
    return await _exec.run(conn, _pgw.retired(schema))


async def _retire_range(conn: psycopg.AsyncConnection, schema: str, lo: int, hi: int) -> None:
    await conn.execute(
        sql.SQL("INSERT INTO {} (lo_ms, hi_ms) VALUES (%s, %s)").format(table(schema, "journal_retired")),
        (lo, hi),
    )


async def _failed_run(conn: psycopg.AsyncConnection, dsn: str, schema: str, name: str) -> runrow.Run:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id=name, user_id="u", content=name)
    (claimed,) = await manual.claim(conn, schema)
    assert claimed["id"] == run.id
    assert await manual.finalize(conn, schema, run.id, claimed["claim_token"], "failed", 3)
    return run


async def test_trim_retires_a_partition_with_one_write_and_no_write_per_run(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await hourly_partitions(conn, schema)
    old = await runrow.enqueue(
        dsn, schema=schema, conversation_id="a", user_id="u", content="old", request={"pii": 1}
    )
    live = await runrow.enqueue(dsn, schema=schema, conversation_id="b", user_id="u", content="live")
    token = {r["id"]: r["claim_token"] for r in await manual.claim(conn, schema, limit=2)}
    assert await manual.finalize(conn, schema, old.id, token[old.id], "failed", 3)
    await _record_step(conn, schema, old.id)
    now = await manual.db_now(conn)
    # A day on, the running run made in the same hour holds the partition: nothing goes.
    assert await runrow.trim(dsn, schema=schema, now=now + timedelta(hours=25)) == runrow.TrimResult(0, 0, 0)
    assert len(await events(conn, schema, old.id)) == 3 and await _retired(conn, schema) == []
    assert await _step_lineages(conn, schema) == [old.id]
    assert await manual.finalize(conn, schema, live.id, token[live.id], "completed", 3)
    before = await _xmins(conn, schema)
    listed = await runrow.list_runs(dsn, schema=schema)
    parts = [p for p in await runrow.journal_partitions(dsn, schema=schema) if p.starts]
    later = now + timedelta(days=2, hours=1)
    assert await runrow.trim(dsn, schema=schema, now=later) == runrow.TrimResult(
        runs=2, events=0, partitions=3
    )
    # No run's row was written (its xmin is the same); the three ranges are one row.
    assert await _xmins(conn, schema) == before
    first, last = parts[0], parts[-1]
    assert first.starts is not None and last.ends is not None
    assert await _retired(conn, schema) == [
        (int(first.starts.timestamp() * 1000), int(last.ends.timestamp() * 1000))
    ]
    assert await events(conn, schema, old.id) == [] and await _step_lineages(conn, schema) == []
    assert (await run_row(conn, schema, old.id))["request"] == {"pii": 1}  # kept: not erase_requests
    with pytest.raises(runrow.RunTrimmed):
        await runrow.retry_run(dsn, old.id, schema=schema)
    assert await runrow.list_runs(dsn, schema=schema) == listed  # nothing written
    got = [e async for e in runrow.tail(dsn, old.id, schema=schema)]
    assert [(e.type, e.payload["status"]) for e in got] == [("complete", "failed")]
    assert await runrow.trim(dsn, schema=schema, now=later) == runrow.TrimResult(0, 0, 0)
    # With erase_requests the per-run pass nulls the snapshots retiring left.
    erased = await runrow.trim(dsn, schema=schema, now=later, erase_requests=True)
    assert erased == runrow.TrimResult(2, 0, 0)
    assert (await run_row(conn, schema, old.id))["request"] is None


async def _retire(
    conn: psycopg.AsyncConnection, schema: str, lo: int, hi: int, now: datetime
) -> tuple[int, int] | None:
    async with conn.transaction():
        await _exec.run(conn, _pgw.lock_retiring(schema))
        return await _exec.run(conn, _pgw.retire(schema, lo=lo, hi=hi, retention_seconds=0, now=now))


async def test_a_later_retry_of_a_lineage_made_in_the_range_holds_it(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The retire statement over one millisecond's runs: the first attempt is finished,
    but its retry, made later (outside the range), is queued and replays its steps."""
    first = await _failed_run(conn, dsn, schema, "a")
    await _record_step(conn, schema, first.id)
    lo = await _ms(conn, schema, first.id)
    while (await manual.db_now(conn)).timestamp() * 1000 < lo + 2:
        await anyio.sleep(0.002)
    retry = await runrow.retry_run(dsn, first.id, schema=schema)
    assert await _ms(conn, schema, retry.id) > lo
    future = await manual.db_now(conn) + timedelta(days=1)
    assert await _retire(conn, schema, lo, lo + 1, future) is None
    assert await _retired(conn, schema) == [] and await _step_lineages(conn, schema) == [first.id]
    (claimed,) = await manual.claim(conn, schema)
    assert await manual.finalize(conn, schema, retry.id, claimed["claim_token"], "failed", 3)
    assert await _retire(conn, schema, lo, lo + 1, future) == (1, 1)
    assert await _retired(conn, schema) == [(lo, lo + 1)] and await _step_lineages(conn, schema) == []
    # The retry itself was made after the range, but its lineage in it: its steps are gone.
    with pytest.raises(runrow.RunTrimmed):
        await runrow.retry_run(dsn, retry.id, schema=schema)


async def test_a_later_run_of_a_tree_rooted_in_the_range_holds_it(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A sub-agent made after its root (outside the range) and still queued keeps the
    root's tree stream, and with it the range."""
    root = await _failed_run(conn, dsn, schema, "a")
    lo = await _ms(conn, schema, root.id)
    while (await manual.db_now(conn)).timestamp() * 1000 < lo + 2:
        await anyio.sleep(0.002)
    cur = await conn.execute(
        sql.SQL(
            "INSERT INTO {run} (conversation_id, user_id, user_message_id, parent_run_id, root_run_id, agent_key)"
            " SELECT conversation_id || '/child', user_id, user_message_id, id, id, agent_key FROM {run}"
            " WHERE id = %s RETURNING id"
        ).format(run=table(schema, "agent_run")),
        (root.id,),
    )
    child = (await cur.fetchone() or [None])[0]
    assert child is not None and await _ms(conn, schema, child) > lo
    future = await manual.db_now(conn) + timedelta(days=1)
    assert await _retire(conn, schema, lo, lo + 1, future) is None
    (claimed,) = await manual.claim(conn, schema)
    assert await manual.finalize(conn, schema, child, claimed["claim_token"], "completed", 3)
    assert await _retire(conn, schema, lo, lo + 1, future) == (1, 1)


async def _blocked_by(conn: psycopg.AsyncConnection, pid: int) -> bool:
    cur = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)
    )
    row = await cur.fetchone()
    return row is not None and row[0] > 0


async def test_a_retry_waits_for_a_trim_retiring_its_lineage_and_is_then_refused(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    first = await _failed_run(conn, dsn, schema, "a")
    ms = await _ms(conn, schema, first.id)
    listed = await runrow.list_runs(dsn, schema=schema)
    outcome: list[Any] = []

    async def retry() -> None:
        try:
            outcome.append(await runrow.retry_run(dsn, first.id, schema=schema))
        except runrow.RunTrimmed as e:
            outcome.append(e)

    async with await psycopg.AsyncConnection.connect(dsn) as trim_conn:
        # (What trim's retiring transaction does: hold the lock, then write the range.)
        await _exec.run(trim_conn, _pgw.lock_retiring(schema))
        async with anyio.create_task_group() as tg:
            tg.start_soon(retry)
            await wait_for(lambda: _blocked_by(conn, trim_conn.info.backend_pid), what="the retry to wait")
            await _retire_range(trim_conn, schema, ms, ms + 1)
            await trim_conn.commit()
    assert len(outcome) == 1 and isinstance(outcome[0], runrow.RunTrimmed), outcome
    assert await runrow.list_runs(dsn, schema=schema) == listed


async def test_trim_waits_for_a_retry_being_written_and_then_keeps_its_lineage(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Without the lock, trim's check would run before the retry commits, find every
    run of the partition finished, and delete the step records the retry replays."""
    await hourly_partitions(conn, schema)
    first = await _failed_run(conn, dsn, schema, "a")
    await _record_step(conn, schema, first.id)
    far = await manual.db_now(conn) + timedelta(days=3)
    found: list[runrow.TrimResult] = []

    async def trim() -> None:
        found.append(await runrow.trim(dsn, schema=schema, retention=timedelta(0), now=far))

    async with await psycopg.AsyncConnection.connect(dsn) as host, anyio.create_task_group() as tg:
        await host.execute("SELECT 1")  # (a transaction of the host's, kept open)
        retry = await runrow.retry_run(host, first.id, schema=schema)
        assert retry.created
        tg.start_soon(trim)
        await wait_for(lambda: _blocked_by(conn, host.info.backend_pid), what="trim to wait")
        await host.commit()
    assert found == [runrow.TrimResult(0, 0, 2)]  # (the two empty hours ahead go; its own stays)
    assert await _step_lineages(conn, schema) == [first.id]
    ms = await _ms(conn, schema, first.id)
    assert not [r for r in await _retired(conn, schema) if r[0] <= ms < r[1]]


async def test_the_schema_refuses_any_retry_of_a_lineage_in_a_retired_range(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A previous release's retry (its own INSERT, which checks no range) is refused too."""
    first = await _failed_run(conn, dsn, schema, "a")
    ms = await _ms(conn, schema, first.id)
    await _retire_range(conn, schema, ms, ms + 1)
    insert = sql.SQL(
        "INSERT INTO {run} (conversation_id, user_id, user_message_id, request, retry_of, lineage_id,"
        " attempt, agent_key) SELECT conversation_id, user_id, user_message_id, request, id, id, 2, agent_key"
        " FROM {run} WHERE id = %s"
    ).format(run=table(schema, "agent_run"))
    with pytest.raises(psycopg.errors.CheckViolation) as info:
        async with conn.transaction():
            await conn.execute(insert, (first.id,))
    assert info.value.diag.constraint_name == "agent_run_retry_unretired"
    await conn.execute(sql.SQL("DELETE FROM {}").format(table(schema, "journal_retired")))
    async with conn.transaction():
        await conn.execute(insert, (first.id,))  # (not behind it: written)


async def test_a_partition_still_needed_holds_only_itself(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A run left unfinished (waiting for input for days, queued for an agent no worker
    serves) keeps its own partition, not the later ones."""
    await hourly_partitions(conn, schema)
    live = await runrow.enqueue(dsn, schema=schema, conversation_id="a", user_id="u", content="x")
    parts = [p for p in await runrow.journal_partitions(dsn, schema=schema) if p.starts]
    assert len(parts) == 3 and parts[0].starts is not None and parts[0].ends is not None
    far = await manual.db_now(conn) + timedelta(days=2)
    assert await runrow.trim(dsn, schema=schema, now=far) == runrow.TrimResult(0, 0, 2)
    kept = [p.name for p in await runrow.journal_partitions(dsn, schema=schema) if p.starts]
    assert kept == [parts[0].name]
    (claimed,) = await manual.claim(conn, schema)
    assert await manual.finalize(conn, schema, live.id, claimed["claim_token"], "completed", 3)
    assert await runrow.trim(dsn, schema=schema, now=far) == runrow.TrimResult(1, 0, 1)
    lo, hi = (int(t.timestamp() * 1000) for t in (parts[0].starts, parts[0].ends))
    assert (lo, hi) in await _retired(conn, schema) and await events(conn, schema, live.id) == []
