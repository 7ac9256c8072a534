"""A trim pass reads each run it trims about once (#44: a day of runs in one pass).

Each batch goes on from where the previous one ended. Without that bound a batch
planned on the index of all finished runs (the planner may take it over the partial
index of untrimmed ones: they have the same key) read every run the pass had already
trimmed again, and a pass of a day's runs grew with its square."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._gateway import _exec
from runrow._gateway import retention as _gw

from .helpers import table

pytestmark = pytest.mark.anyio

RUNS = 1000


async def _finished_runs(conn: psycopg.AsyncConnection, schema: str, n: int) -> None:
    """``n`` completed runs, finished a second apart two days ago (rows written directly)."""
    message, run = table(schema, "message"), table(schema, "agent_run")
    await conn.execute(
        sql.SQL(
            "WITH m AS (INSERT INTO {m} (conversation_id, role, content, status, user_id)"
            " SELECT 'c' || g, 'user', '\"q\"', 'sent', 'u' FROM generate_series(1, %(n)s) g"
            " RETURNING id, conversation_id)"
            " INSERT INTO {r} (conversation_id, user_id, user_message_id, status, started_at, finished_at)"
            " SELECT conversation_id, 'u', id, 'completed', now() - interval '3 days',"
            "        now() - interval '2 days' + substr(conversation_id, 2)::int * interval '1 second'"
            " FROM m"
        ).format(m=message, r=run),
        {"n": n},
    )
    await conn.execute(sql.SQL("ANALYZE {}").format(run))


async def _index_reads(conn: psycopg.AsyncConnection, schema: str) -> int:
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute(
        "SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes"
        " WHERE schemaname = %s AND indexrelname IN ('agent_run_finished_idx', 'agent_run_untrimmed_idx')",
        (schema,),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_pass_reads_each_trimmed_run_about_once_whichever_index_it_walks(
    dsn: str, schema: str
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await _finished_runs(conn, schema, RUNS)
        # Only the index of all finished runs is left to walk: the plan that re-read.
        await conn.execute(sql.SQL("DROP INDEX {}").format(table(schema, "agent_run_untrimmed_idx")))
        before = await _index_reads(conn, schema)
        result = await runrow.trim(
            conn, schema=schema, retention=timedelta(days=1), batch=50, erase_requests=True
        )
        read = await _index_reads(conn, schema) - before
    assert result.runs == RUNS
    # 20 batches of 50: about RUNS entries read in all (each batch's bound re-reads the
    # previous batch's last one). Re-reading what the pass trimmed is 50 x (0 + 1 + ...
    # + 19) = 9,500 more.
    assert read <= 2 * RUNS, read


async def test_a_batch_starts_at_its_bound_and_says_where_the_next_one_starts(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await _finished_runs(conn, schema, 10)
        finished = [
            r[0]
            for r in await (
                await conn.execute(
                    sql.SQL("SELECT finished_at FROM {} ORDER BY finished_at").format(
                        table(schema, "agent_run")
                    )
                )
            ).fetchall()
        ]
        # From the 7th run on: runs 7-10 trimmed, and the next batch starts at the 10th.
        done = await _exec.run(
            conn, _gw.trim(schema, retention_seconds=86400, limit=100, now=None, after=finished[6])
        )
        assert (done.runs, done.last_finished) == (4, finished[9])
        trimmed = await (
            await conn.execute(
                sql.SQL("SELECT finished_at FROM {} WHERE journal_trimmed ORDER BY finished_at").format(
                    table(schema, "agent_run")
                )
            )
        ).fetchall()
        assert [r[0] for r in trimmed] == finished[6:]
        # Nothing left at or after the bound: no runs, and no next start.
        done = await _exec.run(
            conn, _gw.trim(schema, retention_seconds=86400, limit=100, now=None, after=finished[9])
        )
        assert (done.runs, done.last_finished) == (0, None)
        # A new pass (no bound) trims the rest.
        assert (
            await runrow.trim(conn, schema=schema, retention=timedelta(days=1), erase_requests=True)
        ).runs == 6


async def test_a_batch_marks_its_runs_through_the_primary_key(dsn: str, schema: str) -> None:
    """Planned as a join with the batch, the update read every run once per batch (a
    hash join over a sequential scan of agent_run: half a 1,000-run batch's time on a
    100,000-run table); by the primary key, it reads only the runs it marks."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await _finished_runs(conn, schema, RUNS)
        before = await _seq_scans(conn, schema)
        result = await runrow.trim(
            conn, schema=schema, retention=timedelta(days=1), batch=50, erase_requests=True
        )
        scans = await _seq_scans(conn, schema) - before
    assert result.runs == RUNS
    assert scans == 0, f"{scans} sequential scans of agent_run in {RUNS // 50} batches"


async def _seq_scans(conn: psycopg.AsyncConnection, schema: str) -> int:
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute(
        "SELECT seq_scan FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'agent_run'", (schema,)
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])
