"""Human in the loop across processes and restarts: a run parks in one worker process,
that worker is killed, the database server restarts, a later turn is enqueued, another
process provides the input, and a new worker process resumes the run. The run completes
with the value, its steps' side effects happened once, the later turn waited for it,
and the journal, read by a tail that stayed on through all of it, has no gap and no
duplicate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow.embedded import EmbeddedPostgres

from .agents import SIDE_EFFECT_DDL, side_effect_table
from .helpers import assert_journal_sound, events, rows, run_row, status_of, wait_for
from .test_processes import Workers

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
SCHEMA = "waiting_test"
ROOT = Path(__file__).resolve().parents[1]
KEY = "approve:send-1"


@pytest.fixture
def server(restartable_server: EmbeddedPostgres) -> EmbeddedPostgres:
    return restartable_server


@pytest.fixture
async def dsn(server: EmbeddedPostgres) -> AsyncIterator[str]:
    dsn = server.conninfo()
    await runrow.migrate(dsn, schema=SCHEMA)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL(SIDE_EFFECT_DDL).format(t=side_effect_table(SCHEMA)))
    yield dsn


@pytest.fixture
def workers(dsn: str) -> Iterator[Workers]:
    w = Workers(dsn, SCHEMA)
    try:
        yield w
    finally:
        w.kill_all()


async def _status(dsn: str, run_id: object) -> str:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await status_of(conn, SCHEMA, run_id)


def _provide_from_another_process(dsn: str, run_id: object) -> str:
    script = (
        "import sys; from runrow import sync; "
        f"print(sync.provide_input(sys.argv[1], sys.argv[2], {KEY!r}, {{'approved': True}}, schema={SCHEMA!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, dsn, str(run_id)],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def test_park_then_restart_everything_then_resume_from_another_process(
    server: EmbeddedPostgres, dsn: str, workers: Workers
) -> None:
    timing = {"lease": 2.0, "heartbeat": 0.5, "grace": 1.0, "poll": 0.25}
    first_worker = workers.start("approval_agent", **timing)
    run = await runrow.enqueue(dsn, schema=SCHEMA, conversation_id="c", user_id="u", content="send it")
    seen: list[runrow.Event] = []

    async def follow() -> None:
        async for ev in runrow.tail(dsn, run.id, schema=SCHEMA, poll=0.2):
            if not ev.keepalive:
                seen.append(ev)

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await wait_for(lambda: _is(dsn, run.id, "waiting"), timeout=30, what="the run to wait for input")
        # The worker that parked it dies; the server restarts; a later turn arrives.
        first_worker.send_signal(signal.SIGKILL)
        first_worker.wait()
        server.restart()
        later = await _enqueue_retrying(dsn)
        assert await _status(dsn, run.id) == "waiting"
        # Another process answers; a new worker process resumes the run.
        assert _provide_from_another_process(dsn, run.id) == "True"
        assert _provide_from_another_process(dsn, run.id) == "False"  # a repeat changes nothing
        workers.start("approval_agent", **timing)
        # (The later turn runs the same agent: it, in turn, waits for its own approval.)
        await wait_for(lambda: _is(dsn, later.id, "waiting"), timeout=60, what="the later turn to start")
        await wait_for(lambda: any(e.terminal for e in seen), timeout=30, what="the tail to see the end")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        first, second = await run_row(conn, SCHEMA, run.id), await run_row(conn, SCHEMA, later.id)
        assert first["status"] == "completed" and first["resumes"] == 1
        assert second["started_at"] >= first["finished_at"]  # the later turn waited for it
        effects = await rows(
            conn,
            sql.SQL("SELECT step FROM {} WHERE run_id = %s ORDER BY at").format(side_effect_table(SCHEMA)),
            (run.id,),
        )
        assert [e[0] for e in effects] == ["plan", "after"]  # each once: the plan step was replayed
        evs = await assert_journal_sound(conn, SCHEMA, run.id)
        stored = await events(conn, SCHEMA, run.id)
    types = [t for _, t, _ in evs]
    assert types.count("input_requested") == types.count("input_provided") == 1
    assert types.count("tool_call_started") == types.count("tool_call_finished") == 1
    text = "".join(p["delta"] for _, t, p in evs if t == "content_delta")
    assert text == "asking approved=True"
    # The tail that stayed on saw exactly the journal: no gap, no duplicate, same order.
    assert [(e.seq, e.type) for e in seen] == [(s, t) for s, t, _ in stored]


async def _is(dsn: str, run_id: object, status: str) -> bool:
    return await _status(dsn, run_id) == status


async def _enqueue_retrying(dsn: str) -> runrow.Run:
    """Enqueues the later turn once the restarted server takes connections."""
    with anyio.fail_after(30):
        while True:
            try:
                return await runrow.enqueue(
                    dsn, schema=SCHEMA, conversation_id="c", user_id="u", content="next"
                )
            except psycopg.OperationalError:
                await anyio.sleep(0.1)


async def test_stop_while_waiting_in_another_process_cancels_it(dsn: str, workers: Workers) -> None:
    workers.start("approval_agent", lease=2.0, heartbeat=0.5, grace=1.0, poll=0.25)
    run = await runrow.enqueue(dsn, schema=SCHEMA, conversation_id="c", user_id="u", content="send it")
    await wait_for(lambda: _is(dsn, run.id, "waiting"), timeout=30, what="the run to wait for input")
    result = await runrow.cancel_run(dsn, run.id, schema=SCHEMA)
    assert result.cancelled == [run.id]
    assert await _status(dsn, run.id) == "cancelled"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        evs = await assert_journal_sound(conn, SCHEMA, run.id)
        effects = await rows(
            conn,
            sql.SQL("SELECT step FROM {} WHERE run_id = %s").format(side_effect_table(SCHEMA)),
            (run.id,),
        )
    assert evs[-1][2]["status"] == "cancelled"
    assert [e[0] for e in effects] == ["plan"]  # nothing after the wait ran
