"""A client frozen mid-transaction (SIGSTOP, a paused VM) must not hold a lost run.

Chaos found a parent reaped 7 s after the worker that ran it froze, 3 s past the bound:
the worker was stopped inside its spawn's transaction, between two statements, with the
parent's row locked. The reaper skips a locked row (it holds no other run back), but
nothing ended the frozen transaction until the process woke. Every transaction runrow
opens itself now tells the server how long it may wait for its client
(``idle_in_transaction_session_timeout``, local to the transaction): past that the
server ends the session, the rows go free and the reaper ends the run on time.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest

import runrow
from runrow._engine.reaper import reap_expired
from runrow._engine.settings import Settings
from runrow._gateway import _exec

from . import manual
from .helpers import assert_journal_sound, enqueue_turn, run_row, status_of, table, wait_for
from .test_processes import Workers

pytestmark = pytest.mark.anyio

_SHOW = b"SHOW idle_in_transaction_session_timeout"


async def test_a_transaction_runrow_opens_bounds_its_idle_time_and_leaves_the_session_as_it_was(
    dsn: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        async with _exec.own_transaction(c, idle_seconds=1.5):
            cur = await _exec.execute(c, _SHOW)
            assert await cur.fetchone() == ("1500ms",)
            cur = await _exec.execute(c, b"SHOW jit")
            assert await cur.fetchone() == ("off",)
        async with _exec.own_transaction(c):  # the default
            cur = await _exec.execute(c, _SHOW)
            assert await cur.fetchone() == (f"{int(_exec.OWN_TX_IDLE_SECONDS)}s",)
        cur = await c.execute(_SHOW)
        assert await cur.fetchone() == ("0",), "the bound outlived runrow's transaction"
    # runrow's own connections carry the bound on their session: no statement per transaction.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await _exec.configure_own(c, idle_seconds=3)
        cur = await c.execute(_SHOW)
        assert await cur.fetchone() == ("3s",)
        async with _exec.own_transaction(c, idle_seconds=3):
            assert c.pgconn.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            cur = await _exec.execute(c, _SHOW)
            assert await cur.fetchone() == ("3s",)
        async with _exec.own_transaction(c, idle_seconds=1):  # (tighter than the session's)
            cur = await _exec.execute(c, _SHOW)
            assert await cur.fetchone() == ("1s",)
        cur = await c.execute(_SHOW)
        assert await cur.fetchone() == ("3s",)
    with psycopg.connect(dsn) as s:  # (the sync API's own transactions, not in autocommit)
        with _exec.own_transaction_sync(s, idle_seconds=2):
            assert _exec.execute_sync(s, _SHOW).fetchone() == ("2s",)
        assert s.execute(_SHOW).fetchone() == ("0",)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
async def test_an_idle_bound_that_is_not_positive_is_refused(dsn: str, bad: float) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        with pytest.raises(ValueError, match="idle_seconds must be above 0"):
            async with _exec.own_transaction(c, idle_seconds=bad):
                pass
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.parametrize(("grace", "bound"), [(0.2, 1.0), (2.0, 2.0), (30.0, _exec.OWN_TX_IDLE_SECONDS)])
def test_a_workers_transactions_idle_at_most_its_grace_and_never_under_a_second(
    grace: float, bound: float
) -> None:
    s = Settings.validate(
        own_pool=True,
        schema="runrow",
        concurrency=1,
        lease=60.0,
        heartbeat=0.5,
        grace=grace,
        poll=0.5,
        reap_interval=0.5,
        flush_interval=0.01,
        finalize_timeout=None,
        max_event_bytes=1 << 20,
        worker_id="w",
        claim_order="fifo",
        prepared_statements=True,
        listen_conninfo=None,
        notifications=True,
    )
    assert s.tx_idle_seconds == bound


async def test_a_frozen_runrow_transaction_lets_go_of_a_lost_run_for_the_reaper(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The frozen client holds a lost run's row in a transaction runrow opened; it sends
    nothing more. The server ends its session after the bound and the reaper, which
    skipped the row while it was locked, ends the run."""
    await enqueue_turn(dsn, schema, "c")
    (held,) = await manual.claim(conn, schema, limit=1, lease=30, worker_id="frozen-worker")
    later = await manual.db_now(conn) + timedelta(hours=1)
    lock = f'SELECT 1 FROM "{schema}".agent_run WHERE id = %(id)s FOR NO KEY UPDATE'.encode()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as frozen:
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            async with _exec.own_transaction(frozen, idle_seconds=0.5):
                await _exec.execute(frozen, lock, {"id": held["id"]})
                # While it is held the reaper passes it by...
                assert await reap_expired(dsn, schema=schema, grace=1.0, now=later) == []
                assert await status_of(conn, schema, held["id"]) == "running"
                # ...and once the server has ended the frozen session, it ends it.
                reaped: list[Any] = []

                async def taken() -> bool:
                    reaped.extend(await reap_expired(dsn, schema=schema, grace=1.0, now=later))
                    return bool(reaped)

                await wait_for(taken, timeout=10, interval=0.1, what="the reaper to end the lost run")
                assert reaped == [held["id"]]
                # The frozen client wakes: its connection is gone, its transaction never landed.
                await _exec.execute(frozen, b"SELECT 1")
    assert await status_of(conn, schema, held["id"]) == "failed"
    evs = await assert_journal_sound(conn, schema, held["id"])
    assert evs[-1][2]["reason"] == "worker_lost"


# -- a real worker process, frozen inside its spawn's transaction -----------------------


@pytest.fixture
def workers(dsn: str, schema: str) -> Iterator[Workers]:
    w = Workers(dsn, schema)
    w.env.update(RUNROW_TEST_AGENTS="tree_child", RUNROW_TEST_CHILDREN="60")
    try:
        yield w
    finally:
        w.kill_all()


async def _spawning_backend(conn: psycopg.AsyncConnection, schema: str) -> tuple[int, Any] | None:
    """(pid, xact_start) of a backend idle inside a transaction that touched ``schema``."""
    cur = await conn.execute(
        "SELECT pid, xact_start FROM pg_stat_activity WHERE state = 'idle in transaction'"
        " AND datname = current_database() AND pid <> pg_backend_pid()"
        " AND strpos(query, %s) > 0",
        (f'"{schema}"',),
    )
    row = await cur.fetchone()
    return (row[0], row[1]) if row else None


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads process states from /proc")
async def test_a_worker_frozen_inside_its_spawn_loses_the_parent_on_time_and_spawns_nothing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers
) -> None:
    lease, grace = 2.0, 1.0
    proc = workers.start("tree_parent", concurrency=4, lease=lease, heartbeat=0.5, grace=grace, poll=0.25)
    runs = table(schema, "agent_run")
    caught = None
    with anyio.fail_after(120):
        for attempt in range(40):
            root = await runrow.enqueue(
                dsn, schema=schema, conversation_id=f"root-{attempt}", user_id="u", content="go"
            )
            # Watch for its spawn's transaction between two statements; freeze the
            # worker there. (A miss, the commit came first: wake it, let the tree end.)
            with anyio.move_on_after(10):
                while (found := await _spawning_backend(conn, schema)) is None:
                    if await status_of(conn, schema, root.id) in ("waiting", "completed"):
                        break
                if found is not None:
                    proc.send_signal(signal.SIGSTOP)
                    await anyio.sleep(0.05)
                    if await _spawning_backend(conn, schema) == found:
                        caught, frozen_at = found, anyio.current_time()
                        break
                    proc.send_signal(signal.SIGCONT)
            await wait_for(
                lambda root=root: _ended(conn, schema, root.id), timeout=60, what="the missed tree to end"
            )
    assert caught is not None, "never caught the worker inside its spawn's transaction"
    assert _stopped(proc.pid)
    parent = root.id
    # Another process's reaper (this test's) ends the parent in time, the worker frozen.
    bound = lease + grace + 1.0 + 3.0  # lease + grace + the idle bound + slack

    async def reaped() -> bool:
        await reap_expired(dsn, schema=schema, grace=grace)
        return await status_of(conn, schema, parent) == "failed"

    await wait_for(reaped, timeout=bound, interval=0.2, what="the frozen worker's parent to be reaped")
    assert anyio.current_time() - frozen_at <= bound
    assert _stopped(proc.pid), "the worker woke: the test proves nothing"
    cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (caught[0],))
    assert await cur.fetchone() == (0,), "the server kept the frozen worker's session"
    # Its spawn never landed: no child of the parent, half-written or otherwise.
    cur = await conn.execute(
        f"SELECT count(*) FROM {runs.as_string(conn)} WHERE parent_run_id = %s", (parent,)
    )
    assert await cur.fetchone() == (0,)
    row = await run_row(conn, schema, parent)
    assert row["error"]["type"] == "worker_lost"
    await assert_journal_sound(conn, schema, parent)


async def _ended(conn: psycopg.AsyncConnection, schema: str, run_id: Any) -> bool:
    return await status_of(conn, schema, run_id) in ("completed", "failed", "cancelled")
