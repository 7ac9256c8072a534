"""Tails served from a hot standby (issue #44 point 3): ``tail(..., read_from=standby)``.

One primary and one streaming standby for the module (started here, so ``slow``). Each
test checks a tail's stream against the primary's journal: no gap, no duplicate, and
the events the tail read on the standby or on the primary as the test expects.
"""

from __future__ import annotations

import random
import uuid
from typing import TYPE_CHECKING

import anyio
import psycopg
import pytest

import runrow
import runrow.sync
from runrow import _replica
from runrow._events import KEEPALIVE

from . import manual
from .replica import primary_and_standby, replayed

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from runrow.embedded import EmbeddedPostgres

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    yield from primary_and_standby()


@pytest.fixture
async def pair(servers: tuple[EmbeddedPostgres, EmbeddedPostgres]) -> AsyncIterator[tuple[str, str, str]]:
    """(primary dsn, standby dsn, a fresh schema), the schema replayed on the standby."""
    primary, standby = servers
    p, s = primary.conninfo(), standby.conninfo()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    await runrow.migrate(p, schema=schema)
    with anyio.fail_after(30):
        while not replayed(s, p):
            await anyio.sleep(0.05)
    yield p, s, schema


class Writer:
    """Runs on the primary that append events one by one, as a worker would."""

    def __init__(self, conn: psycopg.AsyncConnection, schema: str) -> None:
        self.conn, self.schema = conn, schema
        self.tokens: dict[uuid.UUID, uuid.UUID] = {}
        self.next: dict[uuid.UUID, int] = {}

    async def start(self) -> uuid.UUID:
        r = await runrow.enqueue(
            self.conn, schema=self.schema, conversation_id=uuid.uuid4().hex, user_id="u", content="x"
        )
        (claimed,) = await manual.claim(self.conn, self.schema)
        self.tokens[r.id], self.next[r.id] = claimed["claim_token"], 3
        return r.id

    async def event(self, rid: uuid.UUID) -> None:
        seq = self.next[rid]
        assert await manual.append(
            self.conn, self.schema, rid, self.tokens[rid], [(seq, "content_delta", {"d": seq})]
        )
        self.next[rid] = seq + 1

    async def finish(self, rid: uuid.UUID) -> None:
        assert await manual.finalize(
            self.conn, self.schema, rid, self.tokens[rid], "completed", self.next[rid]
        )


async def journal(conn: psycopg.AsyncConnection, schema: str, rid: uuid.UUID) -> list[int]:
    cur = await conn.execute(f"SELECT seq FROM {schema}.run_event WHERE run_id = %s ORDER BY seq", (rid,))
    return [r[0] for r in await cur.fetchall()]


async def collect(stream: AsyncIterator[runrow.Event], into: list[int]) -> None:
    async for e in stream:
        if e.type != KEEPALIVE:
            into.append(e.seq)


async def test_tree_with_read_from_is_refused(pair: tuple[str, str, str]) -> None:
    p, s, schema = pair
    with pytest.raises(runrow.InvalidInput, match="read_from"):
        async for _ in runrow.tail(p, uuid.uuid4(), schema=schema, read_from=s, tree=True):
            pass


async def test_tails_on_the_standby_read_exactly_the_journal_while_runs_stream(
    pair: tuple[str, str, str],
) -> None:
    p, s, schema = pair
    before = dict(_replica.STATS)
    async with await psycopg.AsyncConnection.connect(p, autocommit=True) as conn, runrow.NotifyHub(p) as hub:
        w = Writer(conn, schema)
        rids = [await w.start() for _ in range(8)]
        got: dict[uuid.UUID, list[int]] = {rid: [] for rid in rids}
        async with anyio.create_task_group() as tg:
            for rid in rids:
                tg.start_soon(
                    collect, runrow.tail(p, rid, schema=schema, hub=hub, read_from=s, keepalive=1), got[rid]
                )
            for _ in range(15):
                for rid in rids:
                    await w.event(rid)
                await anyio.sleep(0.01)
            for rid in rids:
                await w.finish(rid)
        for rid in rids:
            assert got[rid] == await journal(conn, schema, rid)
            assert len(got[rid]) == 18  # 2 of the submission, 15, the ending
    assert _replica.STATS["replica_reads"] > before["replica_reads"]
    assert _replica.STATS["lag_fallbacks"] == before["lag_fallbacks"]  # no lag past 2 s here


async def test_paused_replay_waits_then_reads_the_primary_then_the_standby_again(
    pair: tuple[str, str, str],
) -> None:
    p, s, schema = pair
    async with (
        await psycopg.AsyncConnection.connect(p, autocommit=True) as conn,
        await psycopg.AsyncConnection.connect(s, autocommit=True) as sconn,
        runrow.NotifyHub(p) as hub,
    ):
        w = Writer(conn, schema)
        rid = await w.start()
        stream = runrow.tail(p, rid, schema=schema, hub=hub, read_from=s, replica_lag_budget=0.5, keepalive=5)
        assert [(await anext(stream)).seq for _ in range(2)] == [1, 2]
        before = dict(_replica.STATS)
        await sconn.execute("SELECT pg_wal_replay_pause()")
        try:
            await w.event(rid)
            t0 = anyio.current_time()
            with anyio.fail_after(5):
                e = await anext(stream)
            waited = anyio.current_time() - t0
            assert e.seq == 3
            assert waited >= 0.45  # it waited for the standby, up to the budget...
            assert _replica.STATS["lag_fallbacks"] == before["lag_fallbacks"] + 1  # ...then read the primary
        finally:
            await sconn.execute("SELECT pg_wal_replay_resume()")
        reads = _replica.STATS["replica_reads"]
        await w.event(rid)
        with anyio.fail_after(5):
            assert (await anext(stream)).seq == 4
        assert _replica.STATS["replica_reads"] > reads  # back on the standby
        await w.finish(rid)
        rest = [e.seq async for e in stream if e.type != KEEPALIVE]
        assert [1, 2, 3, 4, *rest] == await journal(conn, schema, rid)


async def test_a_standby_restart_mid_stream_loses_and_repeats_nothing(
    pair: tuple[str, str, str], servers: tuple[EmbeddedPostgres, EmbeddedPostgres]
) -> None:
    p, s, schema = pair
    standby = servers[1]
    async with await psycopg.AsyncConnection.connect(p, autocommit=True) as conn, runrow.NotifyHub(p) as hub:
        w = Writer(conn, schema)
        rid = await w.start()
        got: list[int] = []
        before = dict(_replica.STATS)
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect, runrow.tail(p, rid, schema=schema, hub=hub, read_from=s, keepalive=1), got)
            for i in range(40):
                if i == 10:
                    await anyio.to_thread.run_sync(standby.restart)
                await w.event(rid)
                await anyio.sleep(0.02)
            await anyio.sleep(_replica.RETRY + 0.2)  # the tail tries the standby again
            for _ in range(5):
                await w.event(rid)
                await anyio.sleep(0.05)
            await w.finish(rid)
        assert got == await journal(conn, schema, rid)
        assert len(got) == 2 + 45 + 1
    assert _replica.STATS["down_fallbacks"] > before["down_fallbacks"]  # it read the primary meanwhile


async def test_random_lag_under_many_tails_skips_and_repeats_nothing(pair: tuple[str, str, str]) -> None:
    p, s, schema = pair
    rng = random.Random(44)
    async with (
        await psycopg.AsyncConnection.connect(p, autocommit=True) as conn,
        await psycopg.AsyncConnection.connect(s, autocommit=True) as sconn,
        runrow.NotifyHub(p) as hub,
    ):
        w = Writer(conn, schema)
        rids = [await w.start() for _ in range(20)]
        got: dict[uuid.UUID, list[list[int]]] = {rid: [[], []] for rid in rids}
        done = anyio.Event()

        async def lag() -> None:
            while not done.is_set():
                await sconn.execute("SELECT pg_wal_replay_pause()")
                await anyio.sleep(rng.uniform(0, 0.4))
                await sconn.execute("SELECT pg_wal_replay_resume()")
                await anyio.sleep(rng.uniform(0, 0.2))

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lag)
                async with anyio.create_task_group() as tails:
                    for rid in rids:
                        for into in got[rid]:  # two tails a run, one of them from a cursor
                            start = 0 if into is got[rid][0] else 2
                            tails.start_soon(
                                collect,
                                runrow.tail(
                                    p,
                                    rid,
                                    schema=schema,
                                    hub=hub,
                                    read_from=s,
                                    from_seq=start,
                                    replica_lag_budget=0.3,
                                    keepalive=1,
                                ),
                                into,
                            )
                    for _ in range(20):
                        for rid in rng.sample(rids, 8):
                            await w.event(rid)
                        await anyio.sleep(rng.uniform(0, 0.05))
                    for rid in rids:
                        await w.finish(rid)
                done.set()
        finally:
            await sconn.execute("SELECT pg_wal_replay_resume()")
        for rid in rids:
            seqs = await journal(conn, schema, rid)
            assert got[rid][0] == seqs
            assert got[rid][1] == [q for q in seqs if q > 2]


async def test_a_failover_to_the_promoted_standby_loses_and_repeats_nothing() -> None:
    """The primary stops mid-stream and its standby is promoted (a failover): the run
    goes on on the new primary, and the tail, whose primary is gone, reads the promoted
    standby, which holds its own WAL now, to the run's ending. No event is skipped or
    repeated. (A standby promoted while the old primary keeps taking writes, a split
    brain, holds none of those writes; no tail can be right there.)"""
    pairs = primary_and_standby()  # (its own pair: the standby does not stay one)
    primary, standby = next(pairs)
    try:
        p, s = primary.conninfo(), standby.conninfo()
        schema = f"t_{uuid.uuid4().hex[:12]}"
        await runrow.migrate(p, schema=schema)
        got: list[int] = []
        async with await psycopg.AsyncConnection.connect(p, autocommit=True) as conn:
            w = Writer(conn, schema)
            rid = await w.start()
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(collect, runrow.tail(p, rid, schema=schema, read_from=s, keepalive=1), got)
                    for _ in range(10):
                        await w.event(rid)
                        await anyio.sleep(0.02)
                    with anyio.fail_after(30):
                        while not replayed(s, p):
                            await anyio.sleep(0.05)
                    await anyio.to_thread.run_sync(primary.stop)
                    async with await psycopg.AsyncConnection.connect(s, autocommit=True) as promoted:
                        await promoted.execute("SELECT pg_promote(wait => true)")
                        after = Writer(promoted, schema)  # the same run, on the new primary
                        after.tokens, after.next = w.tokens, w.next
                        for _ in range(10):
                            await after.event(rid)
                            await anyio.sleep(0.02)
                        await after.finish(rid)
                        whole = await journal(promoted, schema, rid)
        assert whole == list(range(1, 2 + 20 + 2))  # the submission's 2, 20, the ending
        assert got == whole
    finally:
        pairs.close()


async def test_a_sync_tail_on_the_standby_reads_exactly_the_journal(pair: tuple[str, str, str]) -> None:
    """runrow.sync.tail(read_from=): a polling tail reads the standby; late, never wrong."""
    p, s, schema = pair
    before = dict(_replica.STATS)
    async with await psycopg.AsyncConnection.connect(p, autocommit=True) as conn:
        w = Writer(conn, schema)
        rid = await w.start()
        got: list[int] = []

        def follow() -> None:
            for e in runrow.sync.tail(p, rid, schema=schema, read_from=s, poll=0.02, keepalive=1):
                if e.type != KEEPALIVE:
                    got.append(e.seq)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, follow)
                for _ in range(30):
                    await w.event(rid)
                    await anyio.sleep(0.01)
                await w.finish(rid)
        assert got == await journal(conn, schema, rid)
        assert len(got) == 2 + 30 + 1
    with pytest.raises(runrow.InvalidInput, match="read_from"):
        runrow.sync.tail(p, rid, schema=schema, read_from=s, tree=True)
    # (The async tail's counters are its own: the sync tail reads no LSN.)
    assert _replica.STATS["lsn_reads"] == before["lsn_reads"]
