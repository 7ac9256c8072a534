"""A reaped run's terminal event says the worker was lost and which tool calls are uncertain."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from .chaos.proxy import Proxy
from .helpers import assert_journal_sound, events, is_terminal, rows, run_row, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no message for you")


async def test_an_agent_error_with_an_unstorable_message_is_recorded_and_the_worker_carries_on(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A NUL (jsonb refuses it), a lone surrogate (not UTF-8) or a failing __str__ in an
    agent's exception once crashed the whole dispatcher, taking its other runs along."""
    from .helpers import is_terminal, wait_for

    raised: dict[str, BaseException] = {
        "nul": RuntimeError("bad\x00byte"),
        "surrogate": RuntimeError("lone \ud800 half"),
        "unprintable": _Unprintable(),
    }

    async def agent(run: runrow.RunContext) -> None:
        if run.conversation_id in raised:
            raise raised[run.conversation_id]

    runs = {
        c: await runrow.enqueue(dsn, schema=schema, conversation_id=c, user_id="u", content="x")
        for c in [*raised, "fine"]
    }
    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=4, poll=0.2) as d:
        for run in runs.values():
            await wait_for(lambda run=run: is_terminal(conn, schema, run.id), what="every run to end")
        # (The counters follow the commits: the writer's callbacks run once a batch returns.)
        await wait_for(lambda: not d.in_flight, what="every run let go")
        assert d.get_stats()["failed"] == 3 and d.get_stats()["completed"] == 1
    rows = {c: await run_row(conn, schema, r.id) for c, r in runs.items()}
    assert rows["fine"]["status"] == "completed"
    for c in raised:  # each traceback was stored too, made storable like the message
        assert "Traceback (most recent call last)" in rows[c]["error"].pop("traceback")
    assert rows["nul"]["error"] == {"type": "RuntimeError", "message": "bad\ufffdbyte"}
    assert rows["surrogate"]["error"] == {"type": "RuntimeError", "message": "lone ? half"}
    assert rows["unprintable"]["error"] == {
        "type": "_Unprintable",
        "message": "<_Unprintable with an unprintable message>",
    }
    for r in runs.values():
        await assert_journal_sound(conn, schema, r.id)


def _proxied(dsn: str, proxy_port: int) -> str:
    # In the clear: the proxy looks for a marker in what the worker sends.
    return psycopg.conninfo.make_conninfo(
        dsn, host="127.0.0.1", port=proxy_port, sslmode="disable", gssencmode="disable"
    )


async def _assistant_messages(
    conn: psycopg.AsyncConnection, schema: str, run_id: object
) -> list[tuple[Any, ...]]:
    return await rows(
        conn,
        sql.SQL(
            "SELECT id, content, status FROM {} WHERE run_id = %s AND role <> 'user' ORDER BY position"
        ).format(table(schema, "message")),
        (run_id,),
    )


async def test_a_message_write_that_committed_but_lost_its_answer_is_written_once(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The agent streams its answer and writes it to the transcript; the proxy lets the
    write through and drops the server's answer, closing the connection: the message
    has committed, but the worker sees a dead connection. write_message reads back that
    its message landed and returns its id: the run completes with its answer in the
    transcript once, not also saved again as a partial answer, and not failed."""
    marker = f"message-answer-lost-{uuid.uuid4().hex}"
    returned: list[object] = []

    async def agent(run: runrow.RunContext) -> None:
        await run.text("hello ")
        await run.text("world")
        returned.append(await run.write_message({"text": marker}))

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    host = str(params.get("host") or "127.0.0.1")
    proxy = Proxy("127.0.0.1" if host.startswith("/") else host, int(params.get("port") or 5432))
    async with anyio.create_task_group() as tg:
        port = await proxy.start(tg)
        proxy.lose_answer_to(marker.encode())
        async with runrow.Dispatcher(_proxied(dsn, port), agent, schema=schema, notifications=False, **FAST):
            run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
            await wait_for(lambda: is_terminal(conn, schema, run.id), timeout=15, what="the run's ending")
        tg.cancel_scope.cancel()
    assert proxy.answers_lost == 1
    row = await run_row(conn, schema, run.id)
    assert (row["status"], row["error"]) == ("completed", None)
    messages = await _assistant_messages(conn, schema, run.id)
    assert [(m[1], m[2]) for m in messages] == [({"text": marker}, "complete")]
    assert returned == [messages[0][0]]
    await assert_journal_sound(conn, schema, run.id)


async def test_a_stop_during_write_message_neither_loses_nor_duplicates_the_answer(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The agent's transcript write is held up (the message table is locked) and a stop
    reaches the worker meanwhile. The write the agent started completes, and the stop
    takes effect at the agent's next await: the run is cancelled with the written
    answer in the transcript exactly once, and its streamed text is not saved again as
    a partial answer."""
    contexts: list[runrow.RunContext] = []
    returned: list[object] = []
    locker = await psycopg.AsyncConnection.connect(dsn)
    go = anyio.Event()
    try:

        async def agent(run: runrow.RunContext) -> None:
            contexts.append(run)
            await run.text("the answer")
            await run.flush()
            await go.wait()
            returned.append(await run.write_message({"text": "the answer"}))
            await anyio.sleep(30)  # the stop is delivered here

        async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
            run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
            await wait_for(lambda: len(contexts) == 1, what="the agent")
            await wait_for(lambda: _events_count(conn, schema, run.id, 3), what="the streamed text flushed")
            await locker.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(table(schema, "message")))
            go.set()
            await wait_for(lambda: _insert_waits(conn, schema), what="write_message blocked on the lock")
            await runrow.cancel_run(dsn, run.id, schema=schema)
            await wait_for(lambda: contexts[0].cancel_requested, what="the stop reached the worker")
            await locker.rollback()
            await wait_for(lambda: is_terminal(conn, schema, run.id), timeout=15, what="the run's ending")
    finally:
        await locker.rollback()
        await locker.close()
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "cancelled"
    messages = await _assistant_messages(conn, schema, run.id)
    assert [(m[1], m[2]) for m in messages] == [({"text": "the answer"}, "complete")]
    assert returned == [messages[0][0]]
    await assert_journal_sound(conn, schema, run.id)


async def _events_count(conn: psycopg.AsyncConnection, schema: str, run_id: object, n: int) -> bool:
    return len(await events(conn, schema, run_id)) >= n


async def _insert_waits(conn: psycopg.AsyncConnection, schema: str) -> bool:
    found = await rows(
        conn,
        sql.SQL("SELECT 1 FROM pg_locks WHERE NOT granted AND relation = {}::regclass").format(
            sql.Literal(f'"{schema}"."message"')
        ),
    )
    return bool(found)
