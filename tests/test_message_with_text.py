"""``write_message`` writes the text streamed before it in the message's own statement:
the text lands with its message, in one commit, or (fenced out) neither lands."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import assert_journal_sound, events, is_terminal, rows, status_of, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}


async def test_the_streamed_text_and_its_message_share_one_commit(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    got: list[runrow.Event] = []

    async def agent(run: runrow.RunContext) -> None:
        await run.text("hello ")
        await run.text("world")
        await run.write_message({"text": "hello world"})

    queued = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        async for event in runrow.tail(dsn, queued.id, schema=schema):
            got.append(event)
    assert await status_of(conn, schema, queued.id) == "completed"
    assert [e.type for e in got][-2:] == ["content_delta", "complete"]
    text_xmin = await rows(
        conn,
        sql.SQL("SELECT xmin::text FROM {} WHERE run_id = %s AND type = 'content_delta'").format(
            table(schema, "run_event")
        ),
        (queued.id,),
    )
    message_xmin = await rows(
        conn,
        sql.SQL("SELECT xmin::text, content FROM {} WHERE run_id = %s AND role = 'assistant'").format(
            table(schema, "message")
        ),
        (queued.id,),
    )
    assert [m[1] for m in message_xmin] == [{"text": "hello world"}]
    assert text_xmin == [(message_xmin[0][0],)], "the text and its message were committed apart"
    await assert_journal_sound(conn, schema, queued.id)


async def test_a_fenced_out_message_writes_neither_it_nor_its_text(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    outcome: list[BaseException] = []

    async def agent(run: runrow.RunContext) -> None:
        await run.text("never seen")
        await conn.execute(
            sql.SQL("UPDATE {} SET claim_token = gen_random_uuid() WHERE id = %s").format(
                table(schema, "agent_run")
            ),
            (run.run_id,),
        )
        try:
            await run.write_message({"text": "never written"})
        except runrow.LeaseLost as exc:
            outcome.append(exc)
            raise

    queued = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
    async with runrow.Dispatcher(dsn, agent, schema=schema, **{**FAST, "lease": 1.0, "grace": 0.5}):
        await wait_for(lambda: outcome, what="the write to be refused")
        await wait_for(lambda: is_terminal(conn, schema, queued.id), what="the reaper to end the run")
    assert "content_delta" not in [t for _, t, _ in await events(conn, schema, queued.id)]
    written = await rows(
        conn,
        sql.SQL("SELECT 1 FROM {} WHERE run_id = %s AND role = 'assistant'").format(table(schema, "message")),
        (queued.id,),
    )
    assert written == []
