"""A heartbeat is a heap-only update of its run's row (schema 27): no index of agent_run
names a column the heartbeat changes, and the reaper still finds lapsed leases through
an index of running runs, never a scan of the whole table."""

from __future__ import annotations

import json

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._gateway import statement_text

from .bulk import seed
from .helpers import indexes_naming, is_terminal, plan_nodes, rows, table, updates_counted, wait_for

pytestmark = pytest.mark.anyio

# What the heartbeat statement (sql/claims.sql) changes.
HEARTBEAT_CHANGES = ("claim_expires_at", "last_heartbeat_at")


async def test_no_index_of_agent_run_names_a_column_a_heartbeat_changes(
    schema: str, conn: psycopg.AsyncConnection
) -> None:
    count, found = await indexes_naming(conn, schema, "agent_run", HEARTBEAT_CHANGES)
    assert count > 5
    assert not found, f"a heartbeat could not be heap-only: {found}"


async def test_heartbeats_are_heap_only_updates(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    """One run held for a second under a 0.1 s heartbeat: its claim and its ending are
    full updates (they change the status the partial indexes name), its heartbeats are
    heap-only."""

    async def agent(run: runrow.RunContext) -> None:
        await anyio.sleep(1.2)

    async with runrow.Dispatcher(
        dsn, agent, schema=schema, heartbeat=0.1, lease=2.0, grace=1.0, poll=0.5, reap_interval=0.5
    ):
        r = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="go")
        await wait_for(lambda: is_terminal(conn, schema, r.id), what="the run")
    (row,) = await rows(
        conn,
        sql.SQL("SELECT status, last_heartbeat_at > started_at FROM {} WHERE id = %s").format(
            table(schema, "agent_run")
        ),
        (r.id,),
    )
    assert row == ("completed", True)
    # (A backend's counters reach the view when it exits: the Dispatcher's pool has closed.)
    updates, hot = await wait_for(
        lambda: updates_counted(conn, schema, "agent_run", 6), timeout=15, what="the updates counted"
    )
    assert hot >= 5 and hot >= 0.8 * (updates - 2), f"{hot} of {updates} updates of agent_run heap-only"


async def test_the_reaper_reads_the_running_runs_through_an_index(
    schema: str, conn: psycopg.AsyncConnection
) -> None:
    """2,000 finished runs and 20 running, analyzed: the reaper's candidates come from an
    index of running runs (a partial index: its size is the runs in flight), with no
    sequential scan of agent_run, and none of the running runs is a candidate."""
    await seed(conn, schema, tenant=None, n=2_000, conversations=2_000, prefix="old")
    runs = table(schema, "agent_run")
    await conn.execute(
        sql.SQL(
            "UPDATE {} SET status = 'completed', claim_token = gen_random_uuid(),"
            " claim_expires_at = now(), started_at = now(), finished_at = now()"
        ).format(runs)
    )
    await seed(conn, schema, tenant=None, n=20, conversations=20, prefix="live")
    await conn.execute(
        sql.SQL(
            "UPDATE {} SET status = 'running', claim_token = gen_random_uuid(), worker_id = 'w',"
            " claim_expires_at = now() + interval '30 seconds', started_at = now() WHERE status = 'queued'"
        ).format(runs)
    )
    await conn.execute(sql.SQL("ANALYZE {}").format(runs))
    params = {"now": None, "grace_seconds": 5.0, "limit": 100}
    query = statement_text("reap_candidates", schema)
    cur = await conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + query, params)
    (doc,) = await cur.fetchone() or (None,)
    doc = json.loads(doc) if isinstance(doc, str) else doc
    nodes = plan_nodes(doc[0]["Plan"])
    scans = [n for n in nodes if n.get("Relation Name") == "agent_run"]
    assert scans and not [n for n in scans if n["Node Type"] == "Seq Scan"], json.dumps(doc, indent=1)
    assert all(n.get("Actual Rows", 0) == 0 for n in scans), "no lease has lapsed"
