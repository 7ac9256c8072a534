"""Durable steps under `kill -9`: turns whose workers are killed at random points and
retried automatically never repeat a recorded step, never run a step twice unless it is
idempotent, and either complete with every step's result or fail, unretried, on a step
whose outcome is unknown.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

import runrow

from .agents import SIDE_EFFECT_DDL, side_effect_table
from .helpers import empty, table, wait_for
from .test_processes import Workers

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

STEPS = 8
TURNS = 4
ATTEMPTS = 12  # more than the kills: a turn never runs out of attempts here
TIMING = {"lease": 1.0, "heartbeat": 0.25, "grace": 0.5, "poll": 0.25}


@pytest.fixture
def workers(dsn: str, schema: str) -> Iterator[Workers]:
    w = Workers(dsn, schema)
    w.env.update(RUNROW_TEST_RETRY=str(ATTEMPTS), RUNROW_TEST_STEPS=str(STEPS), RUNROW_TEST_STEP_PAUSE="0.08")
    try:
        yield w
    finally:
        w.kill_all()


async def _all(conn: psycopg.AsyncConnection, query: sql.Composable, *args: Any) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    await cur.execute(query, args)
    return await cur.fetchall()


async def _settled(conn: psycopg.AsyncConnection, schema: str) -> bool:
    """Every turn's latest run has ended (and so queued no further retry)."""
    got = await _all(
        conn,
        sql.SQL("SELECT count(*) AS active FROM {} WHERE status IN ('queued', 'running')").format(
            table(schema, "agent_run")
        ),
    )
    return got[0]["active"] == 0


async def _db_now(conn: psycopg.AsyncConnection) -> Any:
    return (await _all(conn, sql.SQL("SELECT clock_timestamp() AS now")))[0]["now"]


async def _started_since(conn: psycopg.AsyncConnection, schema: str, since: Any) -> bool:
    """Waits until a run starts after ``since``; False if every turn settles first."""
    query = sql.SQL(
        "SELECT count(*) FILTER (WHERE status = 'running' AND started_at > %s) AS started,"
        " count(*) FILTER (WHERE status IN ('queued', 'running')) AS active FROM {}"
    ).format(table(schema, "agent_run"))
    with anyio.fail_after(30):
        while True:
            (got,) = await _all(conn, query, since)
            if got["started"]:
                return True
            if not got["active"]:
                return False
            await anyio.sleep(0.02)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(kills=st.lists(st.floats(min_value=0.0, max_value=0.9), min_size=3, max_size=5))
async def test_killed_and_retried_turns_never_repeat_a_recorded_step(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers, kills: list[float]
) -> None:
    # (One schema and one fixture serve every example: each example starts clean.)
    workers.kill_all()
    workers.procs.clear()
    await empty(conn, schema)
    await conn.execute(sql.SQL(SIDE_EFFECT_DDL).format(t=side_effect_table(schema)))
    await conn.execute(sql.SQL("DELETE FROM {}").format(side_effect_table(schema)))
    for i in range(TURNS):
        await runrow.enqueue(conn, schema=schema, conversation_id=f"t{i}", user_id="u", content="go")
    for delay in kills:
        started = await _db_now(conn)
        victim = workers.start("step_agent", concurrency=TURNS, **TIMING)
        # Once this worker runs a turn (after its reaper ended the last victim's runs and
        # their retries were claimed), kill it at the drawn moment into the turn.
        if not await _started_since(conn, schema, started):
            break  # every turn has settled
        await anyio.sleep(delay)
        victim.kill()  # SIGKILL: no drain, no ending; the next worker's reaper ends its runs
        victim.wait()
    workers.start("step_agent", concurrency=TURNS, **TIMING)
    await wait_for(lambda: _settled(conn, schema), timeout=60, what="every turn to settle")

    runs = await _all(
        conn,
        sql.SQL(
            "SELECT id, conversation_id, status, error, attempt FROM {} ORDER BY queue_order, attempt"
        ).format(table(schema, "agent_run")),
    )
    steps = await _all(
        conn,
        sql.SQL(
            "SELECT a.conversation_id, s.key, s.status, s.idempotent, s.recorded_at FROM {} s"
            " JOIN {} a ON a.id = s.lineage_id"
        ).format(table(schema, "run_step"), table(schema, "agent_run")),
    )
    effects = await _all(
        conn,
        sql.SQL("SELECT conversation_id, step, at FROM {}").format(side_effect_table(schema)),
    )
    print(
        "OUTCOME",
        kills,
        [(r["conversation_id"], r["attempt"], r["status"], (r["error"] or {}).get("type")) for r in runs],
    )
    ran = Counter((e["conversation_id"], e["step"]) for e in effects)
    for i in range(TURNS):
        turn = f"t{i}"
        last = [r for r in runs if r["conversation_id"] == turn][-1]
        recorded = {s["key"]: s for s in steps if s["conversation_id"] == turn}
        for k in range(STEPS):
            key = f"s{k}"
            idempotent = k % 3 == 2
            if not idempotent:  # at most once, whatever happened
                assert ran[(turn, key)] <= 1, (turn, key, ran[(turn, key)])
            step = recorded.get(key)
            if step is not None and step["status"] == "recorded":
                assert ran[(turn, key)] >= 1, (turn, key)  # a recorded step ran...
                assert not idempotent or ran[(turn, key)] >= 1
                later = [e for e in effects if (e["conversation_id"], e["step"]) == (turn, key)]
                # ...and never again once recorded.
                assert all(e["at"] <= step["recorded_at"] for e in later), (turn, key)
        if last["status"] == "completed":
            assert all(recorded.get(f"s{k}", {}).get("status") == "recorded" for k in range(STEPS))
            assert all(ran[(turn, f"s{k}")] >= 1 for k in range(STEPS))
            (answer,) = [
                m for m in await runrow.transcript(conn, turn, schema=schema) if m.role == "assistant"
            ]
            assert answer.content == " ".join(f"s{k}" for k in range(STEPS))  # complete
        else:
            # The only way a turn may end failed here: its worker was killed inside a step
            # that is not idempotent. No retry is queued then (it could only fail).
            assert last["status"] == "failed" and last["error"]["type"] == "worker_lost", last
            uncertain = [s for s in recorded.values() if s["status"] == "started"]
            assert len(uncertain) == 1 and not uncertain[0]["idempotent"], recorded
            assert ran[(turn, uncertain[0]["key"])] <= 1
