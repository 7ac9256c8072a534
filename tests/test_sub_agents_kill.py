"""Sub-agents under `kill -9` (#41): the worker running the parent is killed while its
children run, or the worker running the children is killed while the parent waits; a
fresh worker's reaper ends what the dead one held and the retry policy takes them up
again. Every run ends once, no child is spawned twice, and the parent completes with
every child's answer."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import table, wait_for
from .test_processes import Workers

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TIMING = {"lease": 1.0, "heartbeat": 0.25, "grace": 0.5, "poll": 0.25}


@pytest.fixture
def workers(dsn: str, schema: str) -> Iterator[Workers]:
    w = Workers(dsn, schema)
    w.env.update(
        RUNROW_TEST_RETRY="5",
        RUNROW_TEST_AGENTS="tree_child",
        RUNROW_TEST_STEP_PAUSE="0.4",
        RUNROW_TEST_PARENT_PAUSE="0.6",
    )
    try:
        yield w
    finally:
        w.kill_all()


async def _all(conn: psycopg.AsyncConnection, query: str, *args: Any) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    await cur.execute(query, args)
    return await cur.fetchall()


@pytest.mark.parametrize("moment", ["parent-running", "parent-waiting"])
async def test_a_killed_worker_loses_no_child_and_spawns_none_twice(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers, moment: str
) -> None:
    runs = table(schema, "agent_run").as_string(conn)
    events = table(schema, "run_event").as_string(conn)
    root = await runrow.enqueue(dsn, schema=schema, conversation_id="root", user_id="u", content="go")
    victim = workers.start("tree_parent", concurrency=4, **TIMING)

    async def ready() -> bool:
        got = await _all(
            conn,
            f"SELECT count(*) FILTER (WHERE a.status = 'running' AND a.root_run_id IS NOT NULL) AS kids,"
            f" count(*) FILTER (WHERE a.root_run_id IS NULL AND a.status = %s) AS parent FROM {runs} a",
            "running" if moment == "parent-running" else "waiting",
        )
        return got[0]["kids"] > 0 and got[0]["parent"] == 1

    # A client follows the whole tree through it all, cut now and then and resumed from
    # its last position (on its own connection: the server's and the workers' faults
    # are what it rides out).
    streamed: list[runrow.Event] = []

    async def follow() -> None:
        while True:
            taken = 0
            async for e in runrow.tail(
                dsn,
                root.id,
                schema=schema,
                tree=True,
                from_seq=streamed[-1].seq if streamed else 0,
                poll=0.05,
            ):
                if e.keepalive:
                    continue
                streamed.append(e)
                taken += 1
                if taken == 7:
                    break
            else:
                return

    followed = anyio.Event()

    async def follow_then_say() -> None:
        await follow()
        followed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow_then_say)
        await _killed_and_finished(dsn, schema, conn, workers, victim, root, moment, ready, runs, events)
        with anyio.fail_after(30):
            await followed.wait()
    journals = {
        (str(r["run_id"]), r["seq"]): r["type"]
        for r in await _all(
            conn,
            f"SELECT e.run_id, e.seq, e.type FROM {events} e JOIN {runs} a ON a.id = e.run_id"
            " WHERE a.id = %s OR a.lineage_id = %s OR a.root_run_id = %s",
            root.id,
            root.id,
            root.id,
        )
    }
    assert [e.seq for e in streamed] == list(range(1, len(streamed) + 1)), "the tree's stream has a gap"
    assert sorted((str(e.run_id), e.run_seq) for e in streamed) == sorted(journals), "lost or repeated"
    assert streamed[-1].type == "complete" and streamed[-1].payload["status"] == "completed"
    rootline = {
        r["id"]
        for r in await _all(conn, f"SELECT id FROM {runs} WHERE coalesce(lineage_id, id) = %s", root.id)
    }
    assert streamed[-1].run_id in rootline, "the root's ending is not the stream's last event"


async def _killed_and_finished(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    workers: Workers,
    victim: Any,
    root: Any,
    moment: str,
    ready: Any,
    runs: str,
    events: str,
) -> None:
    await wait_for(ready, timeout=20, interval=0.01, what=f"children running, the {moment}")
    victim.kill()  # SIGKILL: no drain, no ending; the next worker's reaper ends its runs
    victim.wait()
    workers.start("tree_parent", concurrency=4, **TIMING)

    async def root_done() -> bool:
        got = await _all(
            conn,
            f"SELECT status FROM {runs} WHERE coalesce(lineage_id, id) = %s ORDER BY attempt DESC LIMIT 1",
            root.id,
        )
        return got[0]["status"] == "completed"

    await wait_for(root_done, timeout=60, what="the root turn to complete")
    everything = await _all(
        conn, f"SELECT id, status, attempt, parent_run_id, lineage_id, error FROM {runs} ORDER BY created_at"
    )
    print(
        "OUTCOME", moment, [(r["attempt"], r["status"], (r["error"] or {}).get("type")) for r in everything]
    )
    # No child spawned twice: three children's turns, each spawned once (retries are
    # later attempts of the same turn, in its lineage).
    firsts = [r for r in everything if r["parent_run_id"] is not None and r["attempt"] == 1]
    assert len(firsts) == 3
    assert {r["parent_run_id"] for r in everything if r["parent_run_id"]} == {root.id}
    # Every run ends once: one terminal event per ended run, none for a live one.
    terminal = Counter(
        r["run_id"] for r in await _all(conn, f"SELECT run_id FROM {events} WHERE type = 'complete'")
    )
    for r in everything:
        assert terminal[r["id"]] == (1 if r["status"] not in ("queued", "running", "waiting") else 0), r
    # The parent completed with every child's answer, in order.
    last = [r for r in everything if r["parent_run_id"] is None][-1]
    cur = await conn.execute(
        sql.SQL("SELECT content FROM {} WHERE run_id = %s AND role = 'assistant'").format(
            table(schema, "message")
        ),
        (last["id"],),
    )
    assert [r[0] for r in await cur.fetchall()] == [["done c0", "done c1", "done c2"]]
    # Every child turn completed in the end.
    for first in firsts:
        lineage = [r for r in everything if r["id"] == first["id"] or r["lineage_id"] == first["id"]]
        assert lineage[-1]["status"] == "completed", lineage
