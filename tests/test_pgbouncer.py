"""runrow behind a real pgbouncer in transaction-pooling mode.

Everything goes through pgbouncer (enqueue, the dispatcher's pool, tails, stops,
queries, trim) except the NotifyHub, which connects directly: LISTEN belongs to a
server session, and a transaction pooler hands each transaction to any session.
psycopg's server-side prepared statements are turned off (``prepare_threshold=None``)
because a pgbouncer before 1.21 (Debian 12 ships 1.18) does not carry them across
server connections.

Skipped when pgbouncer is not installed, except under CI (env CI set), where a
missing pgbouncer fails: `.ci/docs` installs it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import anyio
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import runrow
from runrow._gateway import schema as gateway_schema
from runrow.embedded import _run_as_user

from .conftest import Server
from .helpers import assert_journal_sound, status_of, wait_for

pytestmark = pytest.mark.anyio

POOLED = {"autocommit": True, "prepare_threshold": None}


def _pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )
    if found is None:
        reason = "pgbouncer is not installed (Debian: apt-get install -y pgbouncer)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must install it (.ci/docs does)")
        pytest.skip(reason)
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _upstream(pg_server: Server, dsn: str) -> tuple[str, int]:
    """Host and port pgbouncer should connect to (TCP or a Unix socket directory)."""
    if pg_server.launcher is not None:
        assert pg_server.launcher.tcp, "the session server is started with tcp=True"
        return "127.0.0.1", pg_server.launcher.port
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    return str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)


@pytest.fixture(scope="module")
def bouncer(pg_server: Server, dsn: str) -> Iterator[str]:
    """A pgbouncer in transaction mode in front of the test server; yields its conninfo."""
    binary = _pgbouncer_binary()
    host, port = _upstream(pg_server, dsn)
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    user, dbname = str(params.get("user", "postgres")), str(params["dbname"])
    listen = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="runrow-pgbouncer-"))
    account = _run_as_user()  # pgbouncer, like PostgreSQL, refuses to run as root
    (workdir / "userlist.txt").write_text(f'"{user}" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {workdir}/userlist.txt
admin_users = {user}
pool_mode = transaction
default_pool_size = 20
max_client_conn = 400
server_reset_query =
logfile = {workdir}/pgbouncer.log
pidfile = {workdir}/pgbouncer.pid
"""
    )
    if account is not None:
        for p in (workdir, *workdir.iterdir()):
            os.chown(p, account.pw_uid, account.pw_gid)
    proc = subprocess.Popen(
        [binary, str(workdir / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        user=None if account is None else account.pw_uid,
        group=None if account is None else account.pw_gid,
    )
    conninfo = f"host=127.0.0.1 port={listen} user={user} dbname={dbname} connect_timeout=5"
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                log = (workdir / "pgbouncer.log").read_text() if (workdir / "pgbouncer.log").exists() else ""
                pytest.fail(f"pgbouncer exited with {proc.returncode}:\n{log[-2000:]}")
            try:
                with psycopg.connect(conninfo, prepare_threshold=None) as c:
                    c.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield conninfo
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
async def pooled(bouncer: str) -> AsyncIterator[AsyncConnectionPool[psycopg.AsyncConnection]]:
    """The host's pool through pgbouncer, configured as the docs say."""
    pool: AsyncConnectionPool[psycopg.AsyncConnection] = AsyncConnectionPool(
        bouncer, min_size=2, max_size=12, kwargs=POOLED, open=False
    )
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()


def _admin(bouncer: str, command: str) -> list[dict[str, object]]:
    """A pgbouncer admin console command (simple query protocol: no parameters)."""
    admin = psycopg.conninfo.make_conninfo(bouncer, dbname="pgbouncer")
    with psycopg.connect(admin, autocommit=True, prepare_threshold=None) as c:
        cur = c.execute(command)  # type: ignore[arg-type]
        cols = [d.name for d in cur.description or ()]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


async def test_everything_works_through_transaction_pooling(
    bouncer: str,
    dsn: str,
    schema: str,
    pooled: AsyncConnectionPool[psycopg.AsyncConnection],
    conn: psycopg.AsyncConnection,
) -> None:
    dbname = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
    before = {r["database"]: r for r in _admin(bouncer, "SHOW STATS")}.get(dbname, {})
    hang = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        if run.content == "hang":
            hang.set()
            await anyio.sleep_forever()
        history = await run.transcript()
        for i in range(8):
            await run.text(f"w{i} ")
            await anyio.sleep(0.01)
        await run.emit({"type": "tool_call_started", "tool_call_id": "1", "name": "t"})
        await run.write_message(f"answer {len(history)}")

    async with (
        runrow.NotifyHub(dsn) as hub,  # direct: LISTEN needs a session of its own
        runrow.Dispatcher(
            pooled, agent, schema=schema, hub=hub, concurrency=4, lease=2.0, heartbeat=0.2, poll=0.5
        ) as d,
    ):
        runs = []
        for i in range(12):  # three turns in each of four conversations
            runs.append(
                await runrow.enqueue(
                    pooled,
                    schema=schema,
                    conversation_id=f"c{i % 4}",
                    user_id="u",
                    content=f"m{i}",
                    idempotency_key=f"k{i}",
                )
            )
        again = await runrow.enqueue(
            pooled, schema=schema, conversation_id="c0", user_id="u", content="m0", idempotency_key="k0"
        )
        assert again.id == runs[0].id and not again.created

        async def follow(run: runrow.Run, out: dict[object, list[runrow.Event]]) -> None:
            out[run.id] = [
                ev async for ev in runrow.tail(pooled, run.id, hub=hub, schema=schema) if not ev.keepalive
            ]

        tails: dict[object, list[runrow.Event]] = {}
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for r in runs:
                    tg.start_soon(follow, r, tails)
        for r in runs:
            evs = tails[r.id]
            assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
            assert evs[-1].type == "complete" and evs[-1].payload["status"] == "completed", evs[-1]
            await assert_journal_sound(conn, schema, r.id)
        # A resumed tail through the pooler yields exactly the rest.
        rest = [e async for e in runrow.tail(pooled, runs[0].id, from_seq=3, schema=schema)]
        assert [e.seq for e in rest] == [e.seq for e in tails[runs[0].id][3:]]

        # Stop a running turn: the cancel NOTIFY is sent through the pooler, heard on the hub.
        stuck = await runrow.enqueue(pooled, schema=schema, conversation_id="s", user_id="u", content="hang")
        with anyio.fail_after(10):
            await hang.wait()
        t0 = anyio.current_time()
        result = await runrow.stop_conversation(pooled, "s", schema=schema)
        assert result.cancel_requested == [stuck.id]
        await wait_for(lambda: _is(conn, schema, stuck.id, "cancelled"), what="the stop to land")
        assert anyio.current_time() - t0 < 2.0  # the hint, not the heartbeat or the poll

        # The counters move when the finalize call returns, a moment after the row commits.
        await wait_for(lambda: d.get_stats()["cancelled"] == 1, what="the dispatcher to count the stop")
        assert d.get_stats()["completed"] == 12 and d.get_stats()["lost"] == 0
        assert hub.connected and hub.reconnects == 0

    stats = await runrow.queue_stats(pooled, schema=schema)
    assert stats.by_status.get("completed") == 12 and stats.queued == 0
    assert len(await runrow.transcript(pooled, "c0", schema=schema)) == 6
    assert (await runrow.get_run(pooled, runs[5].id, schema=schema)).status == "completed"
    trimmed = await runrow.trim(pooled, schema=schema, retention=timedelta(0), erase_requests=True)
    assert trimmed.runs == 13

    after = {r["database"]: r for r in _admin(bouncer, "SHOW STATS")}[dbname]
    # The traffic really went through pgbouncer, the dispatcher's included: the test's own
    # calls make about 40 transactions (measured with the dispatcher connected directly),
    # its claims, flushes, endings and heartbeats bring them to 100-110. (The bound was
    # "> 100", set before claims folded into endings and tails batched their reads; a
    # local CI run then counted exactly 100 and failed.)
    xacts = int(after["total_xact_count"]) - int(before.get("total_xact_count", 0))
    assert xacts > 70, xacts


async def test_migrate_through_the_pooler(
    bouncer: str, conn: psycopg.AsyncConnection, schema_name: str
) -> None:
    """migrate's advisory lock is transaction-scoped, so it works through the pooler too."""
    try:
        async with await psycopg.AsyncConnection.connect(bouncer, **POOLED) as c:  # type: ignore[arg-type]
            assert await runrow.migrate(c, schema=schema_name) == [
                m.version for m in gateway_schema.migrations()
            ]
            assert await runrow.migrate(c, schema=schema_name) == []
    finally:
        await conn.execute(
            psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(psycopg.sql.Identifier(schema_name))
        )


async def _is(conn: psycopg.AsyncConnection, schema: str, run_id: object, status: str) -> bool:
    return await status_of(conn, schema, run_id) == status


async def test_conninfo_strings_through_the_pooler(
    bouncer: str, dsn: str, schema: str, pooled: AsyncConnectionPool[psycopg.AsyncConnection]
) -> None:
    """Bare conninfo strings to pgbouncer work once prepared statements are off, and the
    dispatcher's hub gets its own direct URL."""

    async def agent(run: runrow.RunContext) -> None:
        for i in range(10):
            await run.text(f"w{i} ")
            await anyio.sleep(0.03)

    async with runrow.Dispatcher(
        bouncer, agent, schema=schema, concurrency=8, poll=0.2, prepared_statements=False, listen_conninfo=dsn
    ) as d:
        assert d.hub is not None
        runs = [
            await runrow.enqueue(pooled, schema=schema, conversation_id=f"c{i}", user_id="u", content="x")
            for i in range(8)
        ]
        endings: list[object] = []

        async def follow(run: runrow.Run) -> None:
            async for ev in runrow.tail(bouncer, run.id, schema=schema, poll=0.02, prepared_statements=False):
                if ev.terminal:
                    endings.append(ev.payload["status"])

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for r in runs:
                    tg.start_soon(follow, r)
    assert endings == ["completed"] * 8
