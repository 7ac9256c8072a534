"""Migrations 18-20 turn a large journal into a partitioned one while a previous
release keeps writing and reading it (#44 point 1): no statement of that release waits
for long, nothing is lost, and the old events become the legacy partition unread."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import table

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

RUNS = 20_000
EVENTS_PER_RUN = 100  # 2,000,000 events


@pytest.fixture
async def old_schema(dsn: str, schema_name: str) -> AsyncIterator[str]:
    await runrow.migrate(dsn, schema=schema_name, target=17)
    try:
        yield schema_name
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name))
            )


async def _load(conn: psycopg.AsyncConnection, schema: str) -> list[uuid.UUID]:
    """RUNS finished runs of EVENTS_PER_RUN events each, and 8 running ones, written as
    the release before version 18 would have (random, version-4 ids)."""
    run, message, event = table(schema, "agent_run"), table(schema, "message"), table(schema, "run_event")
    await conn.execute(
        sql.SQL(
            "WITH m AS (INSERT INTO {m} (conversation_id, role, content, status, user_id)"
            " SELECT 'c' || g, 'user', '\"q\"', 'sent', 'u' FROM generate_series(1, %(n)s) g RETURNING id, conversation_id)"
            " INSERT INTO {r} (conversation_id, user_id, user_message_id, status, started_at, finished_at)"
            " SELECT conversation_id, 'u', id, 'completed', now(), now() FROM m"
        ).format(m=message, r=run),
        {"n": RUNS},
    )
    await conn.execute(
        sql.SQL(
            "INSERT INTO {e} (run_id, seq, type, payload)"
            " SELECT r.id, s, CASE WHEN s = %(k)s THEN 'complete' ELSE 'text_delta' END,"
            "        jsonb_build_object('text', repeat('x', 40))"
            " FROM {r} r CROSS JOIN generate_series(1, %(k)s) s"
        ).format(e=event, r=run),
        {"k": EVENTS_PER_RUN},
    )
    cur = await conn.execute(
        sql.SQL(
            "WITH m AS (INSERT INTO {m} (conversation_id, role, content, status, user_id)"
            " SELECT 'live' || g, 'user', '\"q\"', 'sent', 'u' FROM generate_series(1, 8) g RETURNING id, conversation_id)"
            " INSERT INTO {r} (conversation_id, user_id, user_message_id, status, started_at,"
            "                  claim_token, worker_id, claim_expires_at)"
            " SELECT conversation_id, 'u', id, 'running', now(), gen_random_uuid(), 'old', now() + interval '1 hour'"
            " FROM m RETURNING id"
        ).format(m=message, r=run)
    )
    live = [row[0] for row in await cur.fetchall()]
    await conn.execute(sql.SQL("ANALYZE {}").format(event))
    return live


async def test_a_large_journal_is_partitioned_while_a_previous_release_writes_and_reads_it(
    dsn: str, old_schema: str
) -> None:
    schema = old_schema
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        live = await _load(conn, schema)
    event = table(schema, "run_event")
    append = sql.SQL(
        "INSERT INTO {} (run_id, seq, type, payload) VALUES (%s, %s, 'text_delta', '{{}}')"
    ).format(event)
    read = sql.SQL("SELECT seq FROM {} WHERE run_id = %s AND seq > %s ORDER BY seq LIMIT 100").format(event)
    seqs = dict.fromkeys(live, 0)
    slowest = 0.0
    statements = 0
    migrating = True
    said: list[str] = []

    async def old_release(run_id: uuid.UUID) -> None:
        """As a worker of the release before 18: append to its run's journal and read it
        back from a cursor, over and over, each statement timed."""
        nonlocal slowest, statements
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            while migrating:
                seqs[run_id] += 1
                started = time.perf_counter()
                await c.execute(append, (run_id, seqs[run_id]))
                got = await (await c.execute(read, (run_id, seqs[run_id] - 1))).fetchall()
                slowest = max(slowest, time.perf_counter() - started)
                statements += 2
                assert got == [(seqs[run_id],)]
                await anyio.sleep(0.002)

    async with anyio.create_task_group() as tg:
        for run_id in live[:4]:
            tg.start_soon(old_release, run_id)
        await anyio.sleep(0.3)
        before = statements
        started = time.perf_counter()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as migrator:
            # PostgreSQL says at DEBUG1 whether an attach proved the partition's bounds
            # from a constraint or read the table to check them (under the swap's lock).
            migrator.add_notice_handler(lambda notice: said.append(notice.message_primary or ""))
            await migrator.execute("SET client_min_messages = debug1")
            applied = await runrow.migrate(migrator, schema=schema)
        took = time.perf_counter() - started
        during = statements - before
        await anyio.sleep(0.3)
        migrating = False

    assert applied[:3] == [18, 19, 20]
    # The swap attaches the journal without reading it: step 19's constraint proves the
    # legacy partition's bounds, its NOT NULL half included.
    assert 'partition constraint for table "run_event_legacy" is implied by existing constraints' in said
    assert 'verifying table "run_event_legacy"' not in said
    # The old release never waited long: validating 2M rows does not block it, and the
    # swap's exclusive locks are catalog-only (a slow machine under load stretched a swap
    # that read the journal to 2.5 s before the constraint proved the bounds).
    assert slowest < 1.0, f"a statement of the previous release waited {slowest:.2f} s"
    assert during > 0, f"the previous release wrote nothing during the {took:.1f} s migration"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        parts = await runrow.journal_partitions(conn, schema=schema)
        assert parts[0].starts is None and parts[0].name == "run_event_legacy"
        assert all(p.starts is not None for p in parts[1:]) and len(parts) >= 2
        total = await (await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(event))).fetchone()
        legacy = await (
            await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table(schema, "run_event_legacy")))
        ).fetchone()
        assert total is not None and legacy is not None
        assert total[0] == legacy[0] == RUNS * EVENTS_PER_RUN + sum(seqs.values())
        # New runs get time-ordered ids, and their events land in a time partition.
        run = await runrow.enqueue(conn, schema=schema, conversation_id="new", user_id="u", content="hi")
        assert run.id.version == 7
        where = await (
            await conn.execute(
                sql.SQL("SELECT DISTINCT tableoid::regclass::text FROM {} WHERE run_id = %s").format(event),
                (run.id,),
            )
        ).fetchall()
        assert len(where) == 1 and "run_event_legacy" not in where[0][0]
        # Retention of the legacy runs deletes their events row by row, as before.
        trimmed = await runrow.trim(conn, schema=schema, retention=timedelta(0), batch=5000)
        assert trimmed.runs == RUNS and trimmed.events == RUNS * EVENTS_PER_RUN
