"""Steering under `kill -9` (#41 point 6): the worker running a turn that reads steering
messages is killed mid-turn; a fresh worker's reaper ends its run and the retry policy
runs the turn again. The retry gets every delivery the dead attempt recorded at the same
place, no message is delivered twice, and none is lost (each steering message is read by
exactly one delivery, or runs as a turn of its own)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import psycopg
import pytest

import runrow

from .helpers import table, wait_for
from .test_processes import Workers

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TIMING = {"lease": 1.0, "heartbeat": 0.25, "grace": 0.5, "poll": 0.25}


@pytest.fixture
def workers(dsn: str, schema: str) -> Iterator[Workers]:
    w = Workers(dsn, schema)
    w.env.update(RUNROW_TEST_RETRY="5", RUNROW_TEST_STEERS="10", RUNROW_TEST_STEP_PAUSE="0.25")
    try:
        yield w
    finally:
        w.kill_all()


async def _all(conn: psycopg.AsyncConnection, query: str, *args: Any) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    await cur.execute(query, args)
    return await cur.fetchall()


async def test_a_killed_worker_s_deliveries_replay_at_the_same_place_and_none_is_lost(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers
) -> None:
    runs = table(schema, "agent_run").as_string(conn)
    steps = table(schema, "run_step").as_string(conn)
    events = table(schema, "run_event").as_string(conn)
    lead = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="lead")
    victim = workers.start("steer_agent", **TIMING)
    sent: list[runrow.Run] = []

    async def delivered_by_first() -> bool:
        got = await _all(
            conn,
            f"SELECT count(*) AS n FROM {steps} WHERE run_id = %s AND key = %s"
            " AND jsonb_array_length(result) > 0",
            lead.id,
            "runrow.steering",
        )
        return got[0]["n"] >= 2

    # Steering messages while the turn runs, until two non-empty deliveries are recorded.
    with anyio.fail_after(30):
        while not await delivered_by_first():
            sent.append(
                await runrow.enqueue(
                    dsn,
                    schema=schema,
                    conversation_id="c",
                    user_id="u",
                    content=f"m{len(sent)}",
                    on_busy="steer",
                )
            )
            await anyio.sleep(0.1)
    victim.kill()  # SIGKILL mid-turn: no drain, no ending; the next worker's reaper ends it
    victim.wait()
    for _ in range(3):  # and more while no worker runs: they wait for the retry
        sent.append(
            await runrow.enqueue(
                dsn, schema=schema, conversation_id="c", user_id="u", content=f"m{len(sent)}", on_busy="steer"
            )
        )
    workers.start("steer_agent", **TIMING)

    async def settled() -> bool:
        got = await _all(
            conn, f"SELECT count(*) AS n FROM {runs} WHERE status IN ('queued', 'running', 'waiting')"
        )
        return got[0]["n"] == 0

    await wait_for(settled, timeout=90, what="every turn to end")
    everything = await _all(
        conn, f"SELECT id, status, attempt, lineage_id, absorbed_into, error FROM {runs} ORDER BY created_at"
    )
    lineage = [r for r in everything if r["id"] == lead.id or r["lineage_id"] == lead.id]
    assert lineage[0]["status"] == "failed" and lineage[0]["error"]["type"] == "worker_lost", lineage
    assert lineage[-1]["status"] == "completed", lineage
    # The dead attempt's deliveries, as recorded (by occurrence), are the retry's at the
    # same calls: its answer lists each delivery's contents in call order.
    recorded = await _all(
        conn,
        f"SELECT s.occurrence, s.run_id, s.result FROM {steps} s WHERE s.lineage_id = %s AND s.key = %s"
        " ORDER BY s.occurrence",
        lead.id,
        "runrow.steering",
    )
    by_id = {str(s.user_message_id): f"m{i}" for i, s in enumerate(sent)}
    places = [[by_id[m["message_id"]] for m in r["result"]] for r in recorded]
    assert any(r["run_id"] == lead.id and r["result"] for r in recorded)
    (answer,) = await _all(
        conn,
        f"SELECT content FROM {table(schema, 'message').as_string(conn)} WHERE run_id = %s AND role = 'assistant'",
        lineage[-1]["id"],
    )
    assert answer["content"] == places
    # None delivered twice, none lost: every steering message's turn was absorbed by
    # exactly one delivery (across every turn's steps) or ran as a turn of its own.
    every = await _all(conn, f"SELECT result FROM {steps} WHERE key = %s", "runrow.steering")
    counted = Counter(m["run_id"] for r in every for m in r["result"])
    status = {r["id"]: r for r in everything}
    for s in sent:
        row = status[s.id]
        if row["status"] == "absorbed":
            assert counted[str(s.id)] == 1, row
        else:
            assert row["status"] == "completed" and counted[str(s.id)] == 0, row
    # The retry's journal shows each delivered message once, the replayed ones included.
    journal = await _all(
        conn,
        f"SELECT payload FROM {events} WHERE run_id = %s AND type = 'steering_delivered' ORDER BY seq",
        lineage[-1]["id"],
    )
    assert [e["payload"]["content"] for e in journal] == [c for place in places for c in place]
