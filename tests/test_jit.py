"""No runrow statement is JIT-compiled, whoever owns the connection (#17).

A stock server package (Debian's ``postgresql``) ships ``jit = on`` with
``jit_above_cost = 100000``. At a few thousand queued runs the fair claim's estimate
crosses it and LLVM compiles the statement on every execution (hundreds of ms for a
claim that runs in a few). These tests run on such a server, with
``pg_stat_statements`` counting the functions JIT compiled per statement:

* at real depth with the stock settings, the claim is JIT-compiled when run plainly
  (so the hazard is real here) and never on runrow's own path;
* with ``jit_above_cost = 1`` for the database (every statement that reads a table costs
  more than that, so each would be compiled; runrow's own guard, a bare ``SELECT
  set_config(...)`` estimated at 0.01, stays under any threshold but 0), every hot-path statement (claim, enqueue with and without admission limits,
  heartbeat, append, finalize, reaper, tail read, queue position, stats, stop) runs
  without JIT, on runrow's own pool and connections, on the host's pool, on the host's
  autocommit connection and inside the host's transaction, whose own setting runrow
  leaves as it found it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import anyio
import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

import runrow
from runrow._gateway import statement_text
from runrow.embedded import EmbeddedPostgres

from .bulk import seed
from .helpers import table, wait_for
from .stock import require_stock_bin_dir

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# The test's own statements never JIT, so every compiled statement counted is runrow's.
QUIET = "-c jit=off"


@pytest.fixture(scope="module")
def stock() -> Iterator[EmbeddedPostgres]:
    bin_dir = require_stock_bin_dir()
    server = EmbeddedPostgres(
        bin_dir=bin_dir,
        settings={"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"},
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _database(stock: EmbeddedPostgres, *, jit_above_cost: int | None) -> str:
    name = f"jit_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(stock.conninfo(), autocommit=True) as admin:
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        if jit_above_cost is not None:
            # Every plan that reads a table costs more than 1: unguarded, each compiles.
            await admin.execute(
                sql.SQL("ALTER DATABASE {} SET jit_above_cost = {}").format(
                    sql.Identifier(name), sql.Literal(jit_above_cost)
                )
            )
    dsn = stock.conninfo(name)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE EXTENSION pg_stat_statements")
        cur = await conn.execute("SHOW jit")
        assert (await cur.fetchone()) == ("on",), "the stock server must ship with JIT on"
    return dsn


@pytest.fixture
async def forced(stock: EmbeddedPostgres) -> AsyncIterator[str]:
    """A database on the stock server where any statement would be JIT-compiled."""
    yield await _database(stock, jit_above_cost=1)


async def _compiled(dsn: str) -> list[tuple[str, int]]:
    """Statements of this database that JIT compiled anything since the last reset."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, options=QUIET) as conn:
        cur = await conn.execute(
            "SELECT query, jit_functions::int FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND jit_functions > 0 ORDER BY jit_functions DESC"
        )
        return [(q[:200], n) for q, n in await cur.fetchall()]


async def _reset(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, options=QUIET) as conn:
        await conn.execute("SELECT pg_stat_statements_reset()")


def _agent(dsn: str, schema: str) -> Callable[[runrow.RunContext], Awaitable[None]]:
    async def agent(run: runrow.RunContext) -> None:
        await run.text("hello ")
        await run.emit({"type": "tool_call_started", "tool_call_id": "t1", "name": "noop"})
        await run.emit({"type": "tool_call_finished", "tool_call_id": "t1"})
        await run.text("world")
        # Held until a heartbeat has renewed the lease (a statement this test checks).
        first = (await runrow.get_run(dsn, run.run_id, schema=schema)).claim_expires_at
        assert first is not None

        async def renewed() -> bool:
            now = (await runrow.get_run(dsn, run.run_id, schema=schema)).claim_expires_at
            return now is not None and now > first

        await wait_for(renewed, what="a heartbeat to renew the lease")

    return agent


async def _exercise(
    dsn: str, schema: str, db: runrow.Database, dispatcher_db: str | AsyncConnectionPool
) -> None:
    """Every hot-path statement once or more, through ``db`` (and the Dispatcher's ``dispatcher_db``)."""
    # enqueue, ungated and gated (admission limits take the advisory-lock path)
    first = await runrow.enqueue(db, conversation_id="c1", user_id="u", content="hi", schema=schema)
    gated = await runrow.enqueue(
        db,
        conversation_id="c2",
        user_id="u",
        content="hi",
        schema=schema,
        max_queued_per_tenant=100,
        max_queued_per_conversation=10,
    )
    later = await runrow.enqueue(db, conversation_id="c2", user_id="u", content="again", schema=schema)
    position = await runrow.queue_position(db, later.id, schema=schema)
    assert position.status == "queued"
    await runrow.queue_stats(db, schema=schema)

    # a run whose worker is long gone, for the reaper (claimed by hand, lease lapsed)
    orphan = await runrow.enqueue(db, conversation_id="c3", user_id="u", content="x", schema=schema)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, options=QUIET) as conn:
        await conn.execute(
            sql.SQL(
                "UPDATE {} SET status = 'running', claim_token = gen_random_uuid(), worker_id = 'gone', "
                "started_at = now() - interval '1 hour', claim_expires_at = now() - interval '1 hour' "
                "WHERE id = %s"
            ).format(table(schema, "agent_run")),
            (orphan.id,),
        )

    # claim, heartbeat, append, finalize and reap, through the Dispatcher
    async with runrow.Dispatcher(
        dispatcher_db,
        _agent(dsn, schema),
        schema=schema,
        concurrency=2,
        lease=1.0,
        heartbeat=0.1,
        grace=0.1,
        poll=0.2,
        reap_interval=0.2,
    ):
        seen = [e async for e in runrow.tail(db, first.id, schema=schema, poll=0.1)]
        assert seen[-1].type == "complete"
        for run in (gated, later, orphan):

            async def ended(rid: uuid.UUID = run.id) -> bool:
                info = await runrow.get_run(db, rid, schema=schema)
                return info.status in ("completed", "failed", "cancelled")

            await wait_for(ended, timeout=30, what=f"run {run.id} to end")

    # stop: a queued turn cancelled and a running flag set, in one transaction
    await runrow.enqueue(db, conversation_id="c4", user_id="u", content="a", schema=schema)
    queued = await runrow.enqueue(db, conversation_id="c5", user_id="u", content="b", schema=schema)
    await runrow.stop_conversation(db, "c4", schema=schema)
    await runrow.cancel_run(db, queued.id, schema=schema)


@pytest.mark.parametrize("owner", ["runrow", "host_pool", "host_connection"])
async def test_no_hot_path_statement_is_jit_compiled(forced: str, owner: str) -> None:
    schema = "jit_" + owner
    await runrow.migrate(forced, schema=schema)
    await _reset(forced)
    if owner == "runrow":
        await _exercise(forced, schema, forced, forced)
    elif owner == "host_pool":
        async with AsyncConnectionPool(forced, min_size=1, max_size=8, open=False) as pool:
            await pool.open(wait=True)
            await _exercise(forced, schema, pool, pool)
    else:
        async with await psycopg.AsyncConnection.connect(forced, autocommit=True) as conn:
            await _exercise(forced, schema, conn, forced)
            cur = await conn.execute("SHOW jit")
            assert (await cur.fetchone()) == ("on",), "runrow changed the host's session setting"
    assert await _compiled(forced) == []


async def test_the_hosts_transaction_keeps_its_own_jit_setting(forced: str) -> None:
    schema = "jit_host_tx"
    await runrow.migrate(forced, schema=schema)
    await _reset(forced)
    async with await psycopg.AsyncConnection.connect(forced) as conn, conn.transaction():
        run = await runrow.enqueue(conn, conversation_id="c", user_id="u", content="hi", schema=schema)
        cur = await conn.execute("SHOW jit")
        assert (await cur.fetchone()) == ("on",), "runrow left JIT off in the host's transaction"
        await runrow.enqueue(
            conn,
            conversation_id="c",
            user_id="u",
            content="again",
            schema=schema,
            max_queued_per_conversation=5,
        )
        await runrow.queue_position(conn, run.id, schema=schema)
        await runrow.stop_conversation(conn, "c", schema=schema)
        cur = await conn.execute("SHOW jit")
        assert (await cur.fetchone()) == ("on",)
    assert await _compiled(forced) == []


async def test_a_deep_queue_never_compiles_the_claim_on_stock_settings(stock: EmbeddedPostgres) -> None:
    dsn = await _database(stock, jit_above_cost=None)  # the package's own jit_above_cost
    schema = "jit_depth"
    await runrow.migrate(dsn, schema=schema)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, options=QUIET) as conn:
        await seed(conn, schema, tenant=None, n=10_000, conversations=500)
    # The hazard is real at this depth: run plainly, the claim's estimate crosses
    # jit_above_cost and the statement is compiled (rolled back: nothing is claimed).
    claim = statement_text("claim", schema)
    async with await psycopg.AsyncConnection.connect(dsn) as plain:
        cur = await plain.execute(
            b"EXPLAIN (ANALYZE, FORMAT TEXT) " + claim,
            {
                "limit": 16,
                "lease_seconds": 30,
                "worker_id": "explain",
                "now": None,
                "retry_policy": None,
                "version": None,
                "same_version": False,
                "agent_keys": [],
                "serves_default": True,
                "tree_cap": None,
            },
        )
        plan = "\n".join(r[0] for r in await cur.fetchall())
        await plain.rollback()
    assert "JIT:" in plan, "the seeded depth no longer crosses jit_above_cost: seed deeper"

    await _reset(dsn)
    done = anyio.Event()
    ran = 0

    async def noop(run: runrow.RunContext) -> None:
        nonlocal ran
        ran += 1
        if ran >= 200:
            done.set()

    async with runrow.Dispatcher(dsn, noop, schema=schema, concurrency=16, poll=0.5):
        with anyio.fail_after(60):
            await done.wait()
    assert await _compiled(dsn) == []


@pytest.mark.parametrize("own", [True, False])
async def test_runrows_own_connections_plan_every_statement_generically(
    dsn: str, schema: str, own: bool
) -> None:
    """A connection runrow opened for itself plans each prepared statement once, for any
    parameters: a custom plan of the claim at depth spends more time planning than it
    runs. A host's connection keeps its own plan_cache_mode."""
    from runrow._gateway import _exec, reads

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
        if own:
            await _exec.configure_own(conn)
        for _ in range(3):
            assert (await _exec.run(conn, reads.get_run(schema, run_id=run.id))) is not None
        cur = await conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
            ("%agent_run WHERE id = $1%",),
        )
        plans = await cur.fetchall()
        assert plans == ([(3, 0)] if own else [(0, 3)]), plans
