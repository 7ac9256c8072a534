"""The step writer (``_engine/step_writer.py``): the step writes of runs in flight at the
same time share one transaction and one commit, and one run's refused write costs no
other run its own."""

from __future__ import annotations

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import rows, status_of, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}
N = 8


async def _released_together(
    dsn: str, schema: str, key_of: dict[str, str]
) -> tuple[runrow.Dispatcher, list[runrow.Run]]:
    """Enqueues one run per conversation in ``key_of``; each agent waits until all have
    started, then calls one step (its key from ``key_of``) and returns."""
    started: set[str] = set()
    go = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        started.add(run.conversation_id)
        if len(started) == len(key_of):
            go.set()
        await go.wait()
        await run.step(key_of[run.conversation_id], lambda: {"ok": run.conversation_id})

    d = runrow.Dispatcher(dsn, agent, schema=schema, concurrency=len(key_of), **FAST)
    queued = [
        await runrow.enqueue(dsn, schema=schema, conversation_id=c, user_id="u", content=1) for c in key_of
    ]
    return d, queued


async def test_the_step_writes_of_runs_in_flight_share_commits(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    d, queued = await _released_together(dsn, schema, {f"c{i}": "tool" for i in range(N)})
    async with d:
        await wait_for(lambda: _all_ended(conn, schema, queued), what="every run's ending")
    got = await rows(
        conn,
        sql.SQL("SELECT status, xmin::text FROM {} WHERE key = 'tool'").format(table(schema, "run_step")),
    )
    assert len(got) == N and all(status == "recorded" for status, _ in got), got
    # A row's xmin is the transaction that last wrote it: N records written alone would
    # carry N of them.
    transactions = {xmin for _, xmin in got}
    assert len(transactions) < N, f"{N} step records in {len(transactions)} transactions"
    for run in queued:
        assert await status_of(conn, schema, run.id) == "completed"


async def test_one_runs_refused_step_write_costs_no_other_run_its_own(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The server refuses one run's step write (a constraint of the host's, here a
    trigger): that run fails; the writes that shared its batch are sent again alone and
    land."""
    await conn.execute(
        sql.SQL("""
        CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.key = 'bad' THEN
                RAISE EXCEPTION 'injected refusal' USING ERRCODE = 'check_violation';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_bad BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {fn}();
    """).format(fn=sql.Identifier(schema, "refuse_bad"), t=table(schema, "run_step"))
    )
    keys = {f"c{i}": "tool" for i in range(N - 1)} | {"bad": "bad"}
    d, queued = await _released_together(dsn, schema, keys)
    async with d:
        await wait_for(lambda: _all_ended(conn, schema, queued), what="every run's ending")
    statuses = {run.conversation_id: await status_of(conn, schema, run.id) for run in queued}
    assert statuses.pop("bad") == "failed"
    assert set(statuses.values()) == {"completed"}, statuses


async def _all_ended(conn: psycopg.AsyncConnection, schema: str, queued: list[runrow.Run]) -> bool:
    return all([await status_of(conn, schema, r.id) in ("completed", "failed") for r in queued])
