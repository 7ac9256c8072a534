"""One resumable stream for a tree of runs (#41 point 4): ``tail(root, tree=True)`` yields
the root's events and every descendant's, each tagged with its run, at gap-free
positions of the tree's own that any reader, in any process, reads in the same order;
a client cut at any point resumes from its last position with nothing lost or repeated;
the root's ending is the stream's last event."""

from __future__ import annotations

import random
import uuid
from typing import Any

import anyio
import psycopg
import pytest

import runrow

from .helpers import wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.1, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}


async def _journals(conn: psycopg.AsyncConnection, schema: str, root: Any) -> dict[tuple[str, int], str]:
    """Every event of the tree's runs, from their own journals: (run, seq) -> type."""
    cur = await conn.execute(
        f'SELECT e.run_id, e.seq, e.type FROM "{schema}".run_event e JOIN "{schema}".agent_run a '
        "ON a.id = e.run_id WHERE a.id = %s OR a.lineage_id = %s OR a.root_run_id = %s",
        (root, root, root),
    )
    return {(str(r), s): t for r, s, t in await cur.fetchall()}


def _check_stream(got: list[runrow.Event], root: Any, journals: dict[tuple[str, int], str]) -> None:
    """Positions 1..n, each event of every journal once, each run's in its order, the
    root's ending last."""
    assert [e.seq for e in got] == list(range(1, len(got) + 1))
    keys = [(str(e.run_id), e.run_seq) for e in got]
    assert len(set(keys)) == len(keys), "an event came twice"
    assert set(keys) == set(journals), set(journals) ^ set(keys)
    assert all(journals[(str(e.run_id), e.run_seq)] == e.type for e in got)
    by_run: dict[str, list[int]] = {}
    for run_id, seq in keys:
        by_run.setdefault(run_id, []).append(seq)
    assert all(seqs == sorted(seqs) for seqs in by_run.values())
    assert got[-1].type == "complete" and str(got[-1].run_id) == str(root)
    assert [e.terminal for e in got] == [False] * (len(got) - 1) + [True], "terminal is the last event only"


async def _read(dsn: str, schema: str, root: Any, after: int = 0, **kw: Any) -> list[runrow.Event]:
    return [
        e
        async for e in runrow.tail(dsn, root, schema=schema, tree=True, from_seq=after, poll=0.05, **kw)
        if not e.keepalive
    ]


def _agents(release: anyio.Event | None = None) -> tuple[Any, dict[str, Any]]:
    async def researcher(run: runrow.RunContext) -> None:
        for i in range(5):
            await run.text(f"{run.content}-{i} ")
            await run.emit({"type": "note", "i": i})
        if release is not None:
            await release.wait()
        await run.write_message(f"notes on {run.content}")

    async def orchestrator(run: runrow.RunContext) -> None:
        await run.text("planning ")
        kids = await run.spawn_many([("researcher", t) for t in ("tides", "moons", "orbits")])
        results = await run.wait_for_children(kids)
        await run.text("writing")
        await run.write_message([r.get() for r in results])

    return orchestrator, {"researcher": researcher}


async def test_a_finished_trees_stream_has_every_event_once_and_the_roots_ending_last(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    orchestrator, agents = _agents()
    async with runrow.Dispatcher(dsn, orchestrator, agents=agents, schema=schema, concurrency=4, **FAST):
        turn = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="space")
        got = await _read(dsn, schema, turn.id)
    journals = await _journals(conn, schema, turn.id)
    assert len({k[0] for k in journals}) == 4  # the root and its three children
    _check_stream(got, turn.id, journals)
    # A second reader (another connection, later) reads the same order.
    again = await _read(dsn, schema, turn.id)
    assert [(e.seq, e.run_id, e.run_seq) for e in again] == [(e.seq, e.run_id, e.run_seq) for e in got]
    # The wire form names the run.
    wire = got[0].to_dict()
    assert wire["run_id"] == str(got[0].run_id) and wire["run_seq"] == got[0].run_seq and wire["seq"] == 1


async def test_cut_at_random_points_of_a_live_tree_resumes_with_nothing_lost_or_repeated(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Clients read the tree while it runs, each cut after a random number of events and
    resumed from its last position, some on a pool and some on their own connection;
    every client's stream is the same, and it is the whole tree."""
    release = anyio.Event()
    orchestrator, agents = _agents(release)
    rng = random.Random(41)
    async with (
        runrow.Dispatcher(dsn, orchestrator, agents=agents, schema=schema, concurrency=4, **FAST) as d,
        runrow.NotifyHub(dsn) as hub,
    ):
        turn = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="space")
        streams: list[list[runrow.Event]] = []

        async def client(k: int) -> None:
            got: list[runrow.Event] = []
            db: Any = d.pool if k % 2 else dsn
            while True:
                cut = rng.randint(1, 6)
                taken = 0
                async for e in runrow.tail(
                    db,
                    turn.id,
                    schema=schema,
                    tree=True,
                    from_seq=got[-1].seq if got else 0,
                    hub=hub if k % 3 else None,
                    poll=0.05,
                ):
                    if e.keepalive:
                        continue
                    got.append(e)
                    taken += 1
                    if taken == cut:
                        break
                else:
                    break  # the stream ended
                await anyio.sleep(rng.random() * 0.05)
            streams.append(got)

        async with anyio.create_task_group() as tg:
            for k in range(6):
                tg.start_soon(client, k)
            await anyio.sleep(0.5)
            release.set()
    journals = await _journals(conn, schema, turn.id)
    assert len(streams) == 6
    for got in streams:
        _check_stream(got, turn.id, journals)
        assert [(e.seq, e.run_id, e.run_seq) for e in got] == [
            (e.seq, e.run_id, e.run_seq) for e in streams[0]
        ]


async def test_children_that_outlive_their_root_end_before_its_ending_in_the_stream(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    release = anyio.Event()

    async def child(run: runrow.RunContext) -> None:
        await release.wait()
        await run.text("late")
        await run.write_message("done late")

    async def root(run: runrow.RunContext) -> None:
        await run.spawn_many([("child", 1), ("child", 2)])
        await run.write_message("gone")  # ends without waiting

    async with runrow.Dispatcher(dsn, root, agents={"child": child}, schema=schema, concurrency=4, **FAST):
        turn = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        seen: list[runrow.Event] = []

        async def reader() -> None:
            seen.extend(await _read(dsn, schema, turn.id))

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await wait_for(lambda: _status(conn, schema, turn.id), what="the root's ending")
            await anyio.sleep(0.3)
            assert not seen or seen[-1].type != "complete"  # the root's ending is held back
            release.set()
    journals = await _journals(conn, schema, turn.id)
    _check_stream(seen, turn.id, journals)
    root_end = seen[-1]
    assert root_end.payload["status"] == "completed"
    assert sum(1 for e in seen if e.type == "complete") == 3


async def _status(conn: psycopg.AsyncConnection, schema: str, run_id: Any) -> bool:
    cur = await conn.execute(f'SELECT status FROM "{schema}".agent_run WHERE id = %s', (run_id,))
    row = await cur.fetchone()
    return row is not None and row[0] == "completed"


async def test_bad_trees_are_refused(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    orchestrator, agents = _agents()
    async with runrow.Dispatcher(dsn, orchestrator, agents=agents, schema=schema, concurrency=4, **FAST):
        turn = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="space")
        got = await _read(dsn, schema, turn.id)
    child = next(e.run_id for e in got if e.run_id != turn.id)
    with pytest.raises(runrow.InvalidInput, match="is a child"):
        await _read(dsn, schema, child)
    with pytest.raises(runrow.RunNotFound):
        await _read(dsn, schema, uuid.uuid4())
    with pytest.raises(runrow.InvalidInput, match="past the end"):
        await _read(dsn, schema, turn.id, after=len(got) + 1)
    assert await _read(dsn, schema, turn.id, after=len(got)) == []  # all read: it ends at once
    # A run with no children is a tree of one: its stream is its journal.
    async with runrow.Dispatcher(dsn, orchestrator, schema=schema, **FAST):
        pass
    plain = await runrow.enqueue(dsn, schema=schema, conversation_id="p", user_id="u", content="x")
    await runrow.cancel_run(dsn, plain.id, schema=schema)
    solo = await _read(dsn, schema, plain.id)
    assert [(e.run_seq, e.type) for e in solo] == [
        (e.seq, e.type) async for e in runrow.tail(dsn, plain.id, schema=schema)
    ]


async def test_the_sync_tail_reads_the_same_tree(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """runrow.sync.tail(..., tree=True), on a conninfo and on a pool, while the tree runs:
    the same stream as the async tail's, cut and resumed."""
    from psycopg_pool import ConnectionPool

    import runrow.sync

    release = anyio.Event()
    orchestrator, agents = _agents(release)
    async with runrow.Dispatcher(dsn, orchestrator, agents=agents, schema=schema, concurrency=4, **FAST):
        turn = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="space")

        def read_sync(db: Any) -> list[runrow.Event]:
            got: list[runrow.Event] = []
            while True:
                it = runrow.sync.tail(
                    db, turn.id, schema=schema, tree=True, from_seq=got[-1].seq if got else 0, poll=0.05
                )
                taken = 0
                for e in it:
                    if e.keepalive:
                        continue
                    got.append(e)
                    taken += 1
                    if taken == 5:
                        break
                else:
                    return got
                it.close()

        async def release_soon() -> None:
            await anyio.sleep(0.3)
            release.set()

        with ConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
            async with anyio.create_task_group() as tg:
                tg.start_soon(release_soon)
                own = await anyio.to_thread.run_sync(read_sync, dsn)
                pooled = await anyio.to_thread.run_sync(read_sync, pool)
    journals = await _journals(conn, schema, turn.id)
    _check_stream(own, turn.id, journals)
    assert [(e.seq, e.run_id, e.run_seq) for e in pooled] == [(e.seq, e.run_id, e.run_seq) for e in own]
    assert [(e.seq, e.run_id, e.run_seq) for e in await _read(dsn, schema, turn.id)] == [
        (e.seq, e.run_id, e.run_seq) for e in own
    ]


async def test_trim_takes_a_trees_stream_with_its_journal(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    from datetime import timedelta

    orchestrator, agents = _agents()
    async with runrow.Dispatcher(dsn, orchestrator, agents=agents, schema=schema, concurrency=4, **FAST):
        turn = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="space")
        assert len(await _read(dsn, schema, turn.id)) > 10

    async def rows() -> int:
        cur = await conn.execute(
            f'SELECT (SELECT count(*) FROM "{schema}".tree_log) + (SELECT count(*) FROM "{schema}".tree_member)'
        )
        return int((await cur.fetchone() or [0])[0])

    assert await rows() > 0
    # (Years ahead: the tree's journal partition, every run in it trimmed, is dropped.)
    far = await (await conn.execute("SELECT now() + interval '3650 days'")).fetchone()
    assert far is not None
    assert (await runrow.trim(dsn, retention=timedelta(0), now=far[0], schema=schema)).partitions >= 1
    assert await rows() == 0
    assert await _read(dsn, schema, turn.id) == []  # every run's journal is gone: it ends at once
