"""Enqueue: one atomic unit, in the caller's transaction or its own, idempotent, strict on input."""

from __future__ import annotations

import math
import uuid
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

import runrow
from runrow._gateway import _exec
from runrow._names import Channels

from .helpers import count, counts, events, run_row, table, wait_for

pytestmark = pytest.mark.anyio


async def test_enqueue_writes_message_run_events_and_wake(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    wake = Channels.for_schema(schema).wake
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(wake)))
        run = await runrow.enqueue(
            dsn,
            schema=schema,
            conversation_id="c1",
            user_id="u1",
            content={"text": "hello"},
            tenant_id="t1",
            request={"model": "fake"},
        )
        got = []
        async for n in listener.notifies(timeout=5, stop_after=1):
            got.append(n.channel)
    assert got == [wake]
    assert run.status == "queued" and run.created and run.conversation_id == "c1"
    row = await run_row(conn, schema, run.id)
    assert (row["user_id"], row["tenant_id"], row["request"]) == ("u1", "t1", {"model": "fake"})
    assert row["claim_token"] is None and row["started_at"] is None
    assert [(s, t) for s, t, _ in await events(conn, schema, run.id)] == [
        (1, "user_message_created"),
        (2, "run_queued"),
    ]
    cur = await conn.execute(
        sql.SQL("SELECT role, content, status, run_id FROM {} WHERE id = %s").format(
            table(schema, "message")
        ),
        (run.user_message_id,),
    )
    assert await cur.fetchone() == ("user", {"text": "hello"}, "sent", run.id)


async def test_enqueue_joins_callers_transaction_commit(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await conn.execute(sql.SQL("CREATE TABLE {} (note text)").format(table(schema, "host_note")))
    async with await psycopg.AsyncConnection.connect(dsn) as host, host.transaction():
        await host.execute(sql.SQL("INSERT INTO {} VALUES ('mine')").format(table(schema, "host_note")))
        run = await runrow.enqueue(host, schema=schema, conversation_id="c", user_id="u", content="hi")
        # Not visible to anyone else before the host commits.
        assert await count(conn, schema, "agent_run") == 0
    assert await count(conn, schema, "agent_run") == 1
    assert await count(conn, schema, "host_note") == 1
    assert (await run_row(conn, schema, run.id))["status"] == "queued"


async def test_enqueue_rolls_back_with_callers_transaction(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await conn.execute(sql.SQL("CREATE TABLE {} (note text)").format(table(schema, "host_note")))
    async with await psycopg.AsyncConnection.connect(dsn) as host:
        with pytest.raises(RuntimeError, match="host changed its mind"):
            async with host.transaction():
                await host.execute(
                    sql.SQL("INSERT INTO {} VALUES ('mine')").format(table(schema, "host_note"))
                )
                await runrow.enqueue(host, schema=schema, conversation_id="c", user_id="u", content="hi")
                raise RuntimeError("host changed its mind")
    assert await counts(conn, schema) == {"message": 0, "agent_run": 0, "run_event": 0}
    assert await count(conn, schema, "host_note") == 0


async def test_killed_transaction_leaves_nothing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The session dies after the enqueue statement ran but before commit: nothing visible."""
    victim = await psycopg.AsyncConnection.connect(dsn)
    try:
        await victim.execute("BEGIN")
        await runrow.enqueue(victim, schema=schema, conversation_id="c", user_id="u", content="hi")
        await conn.execute("SELECT pg_terminate_backend(%s)", (victim.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError):
            await victim.execute("COMMIT")
    finally:
        await victim.close()
    assert await counts(conn, schema) == {"message": 0, "agent_run": 0, "run_event": 0}


async def test_failure_midway_writes_nothing(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    """A failure after some rows were inserted (here: the journal's second event) undoes all."""
    await conn.execute(
        sql.SQL("""
        CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.seq = 2 THEN RAISE EXCEPTION 'injected failure'; END IF; RETURN NEW; END $$;
        CREATE TRIGGER fail_second BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {fn}();
    """).format(fn=sql.Identifier(schema, "fail_second"), t=table(schema, "run_event"))
    )
    with pytest.raises(psycopg.errors.RaiseException, match="injected failure"):
        await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
    assert await counts(conn, schema) == {"message": 0, "agent_run": 0, "run_event": 0}


async def test_enqueue_through_a_pool(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool:
        runs = [
            await runrow.enqueue(pool, schema=schema, conversation_id="c", user_id="u", content=i)
            for i in range(3)
        ]
    assert len({r.id for r in runs}) == 3
    assert await counts(conn, schema) == {"message": 3, "agent_run": 3, "run_event": 6}


async def test_idempotent_enqueue_under_a_20_way_race(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    results: list[runrow.Run] = []
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(20)]
    start = anyio.Event()

    async def one(c: psycopg.AsyncConnection) -> None:
        await start.wait()
        results.append(
            await runrow.enqueue(
                c, schema=schema, conversation_id="c", user_id="u", content="same", idempotency_key="k-1"
            )
        )

    try:
        async with anyio.create_task_group() as tg:
            for c in conns:
                tg.start_soon(one, c)
            await anyio.sleep(0)
            start.set()
    finally:
        for c in conns:
            await c.close()
    assert len(results) == 20
    assert len({r.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert await counts(conn, schema) == {"message": 1, "agent_run": 1, "run_event": 2}


async def test_idempotency_key_is_per_user(dsn: str, schema: str) -> None:
    a = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="ann", content="x", idempotency_key="k"
    )
    b = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="bob", content="x", idempotency_key="k"
    )
    again = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="ann", content="x", idempotency_key="k"
    )
    assert a.id != b.id and again.id == a.id and not again.created


FIRST = {
    "conversation_id": "c",
    "user_id": "u",
    "content": {"text": "hi", "n": 1},
    "tenant_id": "t",
    "request": {"model": "m"},
    "idempotency_key": "k",
}
CONFLICTS = [
    ({"conversation_id": "c2"}, ["conversation_id"]),
    ({"content": {"text": "hi", "n": 2}}, ["content"]),
    ({"content": "hi"}, ["content"]),
    ({"request": {"model": "other"}}, ["request"]),
    ({"request": None}, ["request"]),
    ({"tenant_id": None}, ["tenant_id"]),
    ({"conversation_id": "c2", "content": "other"}, ["conversation_id", "content"]),
]


@pytest.mark.parametrize(("override", "fields"), CONFLICTS, ids=[str(i) for i in range(len(CONFLICTS))])
async def test_idempotency_key_reused_for_another_request_is_a_conflict(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, override: dict[str, object], fields: list[str]
) -> None:
    first = await runrow.enqueue(dsn, schema=schema, **FIRST)  # type: ignore[arg-type]
    before = await counts(conn, schema)
    with pytest.raises(runrow.IdempotencyConflict) as info:
        await runrow.enqueue(dsn, schema=schema, **{**FIRST, **override})  # type: ignore[arg-type]
    err = info.value
    assert isinstance(err, runrow.RunrowError)
    assert (err.idempotency_key, err.run_id, list(err.fields)) == ("k", first.id, fields)
    assert await counts(conn, schema) == before  # the new message was refused, not dropped silently


async def test_same_key_same_request_returns_the_first_run(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    first = await runrow.enqueue(dsn, schema=schema, **FIRST)  # type: ignore[arg-type]
    # Same turn: JSON compares by value (key order is not part of it); scheduling options
    # (priority, not_before, deadline, limits) do not change what runs, so they may differ.
    again = await runrow.enqueue(
        dsn,
        schema=schema,
        **{**FIRST, "content": {"n": 1, "text": "hi"}},  # type: ignore[arg-type]
        priority=5,
        not_before=timedelta(seconds=1),
        deadline=timedelta(minutes=5),
        max_queued_per_conversation=10,
    )
    assert again.id == first.id and not again.created
    assert await counts(conn, schema) == {"message": 1, "agent_run": 1, "run_event": 2}


@pytest.mark.parametrize("same", [True, False], ids=["same", "different"])
async def test_idempotency_conflict_waits_for_an_uncommitted_first_enqueue(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, same: bool
) -> None:
    """The repeat's INSERT waits on the first's uncommitted row (ON CONFLICT); once that
    commits, the repeat is compared with it, not with nothing."""
    outcome: list[object] = []
    async with (
        await psycopg.AsyncConnection.connect(dsn) as first_conn,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as second_conn,
    ):
        pid = second_conn.info.backend_pid

        async def repeat() -> None:
            content = FIRST["content"] if same else "changed"
            try:
                outcome.append(
                    await runrow.enqueue(
                        second_conn,
                        schema=schema,
                        **{**FIRST, "content": content},  # type: ignore[arg-type]
                    )
                )
            except runrow.IdempotencyConflict as exc:
                outcome.append(exc)

        async def blocked() -> bool:
            cur = await conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
            row = await cur.fetchone()
            return row is not None and row[0] == "Lock"

        async with anyio.create_task_group() as tg, first_conn.transaction():
            first = await runrow.enqueue(first_conn, schema=schema, **FIRST)  # type: ignore[arg-type]
            tg.start_soon(repeat)
            await wait_for(blocked, what="the repeat to wait on the uncommitted first enqueue")
            assert outcome == []
            # The first enqueue commits here; the repeat's INSERT resumes.
    (got,) = outcome
    if same:
        assert isinstance(got, runrow.Run) and got.id == first.id and not got.created
    else:
        assert isinstance(got, runrow.IdempotencyConflict) and got.run_id == first.id
    assert await counts(conn, schema) == {"message": 1, "agent_run": 1, "run_event": 2}


class Opaque:
    pass


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


BAD_INPUTS = [
    ({"content": Opaque()}, "content"),
    ({"content": {"x": {1, 2}}}, "content"),
    ({"content": math.nan}, "content"),
    ({"content": "a\x00b"}, "content"),
    ({"content": {"nested": ["ok", {"deep": "nul\x00"}]}}, "content"),
    ({"content": {"key\x00": 1}}, "content"),
    ({"content": "x" * 300_000}, "content"),
    ({"request": {"bad": Opaque()}}, "request"),
    ({"request": "nul\x00"}, "request"),
    ({"conversation_id": ""}, "conversation_id"),
    ({"conversation_id": 7}, "conversation_id"),
    ({"conversation_id": "c\x00"}, "conversation_id"),
    ({"user_id": ""}, "user_id"),
    ({"tenant_id": ""}, "tenant_id"),
    ({"idempotency_key": ""}, "idempotency_key"),
    ({"idempotency_key": "k" * 1000}, "idempotency_key"),
    ({"content": nested(100_000)}, "content"),
    ({"content": {"a": nested(5_000)}}, "content"),
    ({"request": nested(100_000)}, "request"),
    ({"conversation_id": "c\ud800"}, "conversation_id"),
    ({"user_id": "\udfffu"}, "user_id"),
    ({"tenant_id": "t\ud800"}, "tenant_id"),
    ({"idempotency_key": "k\udc80"}, "idempotency_key"),
    ({"max_queued_per_tenant": 2**31}, "max_queued_per_tenant"),
    ({"max_queued_per_conversation": 2**63}, "max_queued_per_conversation"),
    # Past PostgreSQL's timestamp range once added to now(): DatetimeFieldOverflow before.
    ({"not_before": timedelta.max}, "not_before"),
    ({"deadline": timedelta.min}, "deadline"),
    ({"deadline": timedelta(days=366 * 1001)}, "deadline"),
]


@pytest.mark.parametrize(
    ("override", "field"), BAD_INPUTS, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_INPUTS)]
)
async def test_bad_input_is_typed_and_writes_nothing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, override: dict[str, object], field: str
) -> None:
    kwargs: dict[str, object] = {"conversation_id": "c", "user_id": "u", "content": "hi", **override}
    with pytest.raises(runrow.InvalidInput) as info:
        await runrow.enqueue(dsn, schema=schema, **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert isinstance(info.value, runrow.RunrowError)
    assert await counts(conn, schema) == {"message": 0, "agent_run": 0, "run_event": 0}


async def test_json_nested_deeper_than_a_worker_reads_back_is_refused(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Python writes JSON deeper than a worker's claim can decode (about 950 levels with the
    default recursion limit): such content would crash the claim loop of every worker that
    took it. The limit (256 levels) is refused at enqueue; content at the limit runs."""
    with pytest.raises(runrow.InvalidInput, match="nested") as info:
        await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=nested(900))
    assert info.value.field == "content"
    with pytest.raises(runrow.InvalidInput, match="nested"):
        await runrow.enqueue(
            dsn, schema=schema, conversation_id="c", user_id="u", content="x", request={"a": nested(256)}
        )
    assert await counts(conn, schema) == {"message": 0, "agent_run": 0, "run_event": 0}
    deepest = {"a": nested(254)}  # 256 levels: the object, then 255 arrays (nested(n) has n + 1)
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=deepest)

    async def echo(ctx: runrow.RunContext) -> None:
        await ctx.write_message(ctx.content)

    async with runrow.Dispatcher(dsn, echo, schema=schema, poll=0.2):

        async def done() -> bool:
            return (await runrow.get_run(dsn, run.id, schema=schema)).status == "completed"

        await wait_for(done, timeout=20, what="the deepest content to run")
    assert [m.content for m in await runrow.transcript(dsn, "c", schema=schema)] == [deepest, deepest]


async def test_escaped_backslash_u0000_text_is_not_a_nul(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="u", content="a literal \\u0000"
    )
    cur = await conn.execute(
        sql.SQL("SELECT content FROM {} WHERE id = %s").format(table(schema, "message")),
        (run.user_message_id,),
    )
    assert await cur.fetchone() == ("a literal \\u0000",)


async def test_size_limit_is_configurable(dsn: str, schema: str) -> None:
    with pytest.raises(runrow.InvalidInput, match="limit of 10 bytes"):
        await runrow.enqueue(
            dsn, schema=schema, conversation_id="c", user_id="u", content="x" * 20, max_content_bytes=10
        )
    run = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="u", content="x" * 20, max_content_bytes=100
    )
    assert run.created


async def test_unknown_schema_names_the_fix(dsn: str) -> None:
    with pytest.raises(runrow.SchemaOutOfDate, match="runrow migrate") as info:
        await runrow.enqueue(
            dsn, schema=f"missing_{uuid.uuid4().hex[:6]}", conversation_id="c", user_id="u", content="x"
        )
    assert info.value.found is None


@pytest.mark.parametrize("bad", ["", "x" * 64, "a\x00b"])
async def test_bad_schema_name_is_invalid_input(dsn: str, bad: str) -> None:
    with pytest.raises(runrow.InvalidInput, match="schema"):
        await runrow.enqueue(dsn, schema=bad, conversation_id="c", user_id="u", content="x")


async def test_bad_db_argument_is_invalid_input(schema: str) -> None:
    with pytest.raises(runrow.InvalidInput, match="conninfo"):
        await runrow.enqueue(42, schema=schema, conversation_id="c", user_id="u", content="x")  # type: ignore[arg-type]


def _recording(sent: list[str]) -> type[psycopg.AsyncCursor[Any]]:
    """A cursor class that records the text of every statement it sends."""

    class Recording(psycopg.AsyncCursor[Any]):
        async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Recording:
            sent.append(bytes(query).decode() if isinstance(query, bytes | bytearray) else str(query))
            await super().execute(query, params, **kwargs)
            return self

    return Recording


_JIT_OFF = "SELECT set_config('jit', 'off', true)"
_PRELUDE = (
    "SELECT set_config('jit', 'off', true), set_config('idle_in_transaction_session_timeout', %(idle)s, true)"
)


def _guards(sent: list[str]) -> tuple[int, int, int]:
    """(jit off, save + off, restore) statements among ``sent`` (sql/session.sql); jit off
    also counts a transaction's prelude (JIT off and the idle bound)."""
    off = sum(1 for q in sent if q.strip() in (_JIT_OFF, _PRELUDE))
    save = sum(1 for q in sent if "set_config('runrow.saved_jit'" in q)
    restore = sum(1 for q in sent if "current_setting('runrow.saved_jit')" in q)
    return off, save, restore


@pytest.mark.parametrize("autocommit", [True, False])
async def test_a_transaction_runrow_opens_turns_jit_off_once(dsn: str, schema: str, autocommit: bool) -> None:
    """On the host's connection, a gated enqueue runs several statements in a transaction
    runrow opens itself (admission lock, stop, enqueue). JIT is turned off once for that
    transaction (transaction-local: it ends with it), not saved, turned off and restored
    around each statement (3 statements for each); the host's session keeps its own
    setting. In the host's own transaction each statement still restores the host's
    setting."""
    sent: list[str] = []
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=autocommit, cursor_factory=_recording(sent)
    ) as conn:
        # The guard's mechanics, on any server: declared able to compile (runrow asks the
        # server once per connection; one without a JIT provider takes no guard at all,
        # see the next test).
        _exec._CAN_JIT.add(conn)
        await runrow.enqueue(conn, schema=schema, conversation_id="c", user_id="u", content=1)
        if not autocommit:
            await conn.commit()
        sent.clear()
        run = await runrow.enqueue(
            conn,
            schema=schema,
            conversation_id="c",
            user_id="u",
            content=2,
            on_busy="interrupt",
            max_queued_per_tenant=10,
        )
        assert run.created and run.interrupted is not None
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        statements = len(sent) - sum(_guards(sent))
        assert statements >= 3, sent  # admission lock, stop, enqueue
        assert _guards(sent) == (1, 0, 0), sent
        assert sent[0].strip() == _PRELUDE
        cur = await conn.execute("SHOW jit")
        assert (await cur.fetchone()) == ("on",), "runrow changed the host's session setting"
        if not autocommit:
            await conn.commit()

        # The host's own transaction: its setting is put back after every statement.
        sent.clear()
        async with conn.transaction():
            await runrow.enqueue(
                conn, schema=schema, conversation_id="c", user_id="u", content=3, max_queued_per_tenant=10
            )
            statements = len(sent) - sum(_guards(sent))
            assert _guards(sent) == (0, statements, statements), sent


async def _compiles(conn: psycopg.AsyncConnection) -> bool:
    """Whether the server really JIT-compiles: EXPLAIN ANALYZE shows a JIT section then."""
    async with conn.transaction(force_rollback=True):
        await conn.execute("SET LOCAL jit = on")
        await conn.execute("SET LOCAL jit_above_cost = 0")
        cur = await conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) SELECT sum(g) FROM generate_series(1, 10) g")
        row = await cur.fetchone()
    assert row is not None
    return "JIT" in row[0][0]


@pytest.mark.parametrize("session_jit", ["on", "off"])
async def test_only_a_server_that_can_compile_gets_the_guard(dsn: str, schema: str, session_jit: str) -> None:
    """On the host's autocommit connection, runrow asks the server once whether it can
    compile at all, whatever the session's own jit says. One that cannot (the embedded
    wheel is built without LLVM) gets plain statements; one that can (Debian's package)
    gets the guard on every statement, even when the session had jit off at first use,
    since the host may turn it on later. The suite runs on both servers in CI."""
    sent: list[str] = []
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, cursor_factory=_recording(sent)
    ) as conn:
        compiles = await _compiles(conn)
        await conn.execute(f"SET jit = {session_jit}")
        sent.clear()
        for i in range(3):
            await runrow.enqueue(conn, schema=schema, conversation_id=f"c{i}", user_id="u", content=i)
        probes = sum(1 for q in sent if "pg_jit_available()" in q)
        assert probes == 1, sent
        assert _guards(sent) == ((3, 0, 0) if compiles else (0, 0, 0)), (compiles, sent)
        await conn.execute("SET jit = on")
        sent.clear()
        await runrow.enqueue(conn, schema=schema, conversation_id="later", user_id="u", content=9)
        assert _guards(sent) == ((1, 0, 0) if compiles else (0, 0, 0)), (compiles, sent)
        cur = await conn.execute("SHOW jit")
        assert (await cur.fetchone()) == ("on",)
