"""``write_message`` writes the text streamed before it in the message's own statement:
the text lands with its message, in one commit, or (fenced out) neither lands."""

from __future__ import annotations

import uuid

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from .chaos.proxy import Proxy
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


async def test_a_retrys_answer_whose_statement_never_ran_is_sent_again(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Attempt 1 writes the turn's answer and fails; its retry streams text and writes
    the answer again (the same message id). The retry's statement is lost before it
    reaches the server: reading back the message would find attempt 1's and count the
    retry's text as written (a hole in its journal); its text's rows are read back
    instead, found missing, and the statement is sent again."""
    marker = f"retry-answer-{uuid.uuid4().hex}"

    async def agent(run: runrow.RunContext) -> None:
        if run.attempt == 1:
            await run.write_message({"text": marker})
            raise RuntimeError("fails once, after its answer")
        await run.text("streamed again")
        proxy.drop_request_with(marker.encode())
        await run.write_message({"text": marker})

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    host = str(params.get("host") or "127.0.0.1")
    proxy = Proxy("127.0.0.1" if host.startswith("/") else host, int(params.get("port") or 5432))
    retry = runrow.RetryPolicy(max_attempts=2, backoff=0)
    async with anyio.create_task_group() as tg:
        port = await proxy.start(tg)
        proxied = psycopg.conninfo.make_conninfo(
            dsn, host="127.0.0.1", port=port, sslmode="disable", gssencmode="disable"
        )
        async with runrow.Dispatcher(proxied, agent, schema=schema, retry=retry, notifications=False, **FAST):
            first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=1)
            await wait_for(lambda: _second_attempt_ended(conn, schema), timeout=20, what="the retry's ending")
        tg.cancel_scope.cancel()
    assert proxy.requests_dropped == 1
    (retried,) = await rows(
        conn,
        sql.SQL("SELECT id, status FROM {} WHERE retry_of = %s").format(table(schema, "agent_run")),
        (first.id,),
    )
    assert retried[1] == "completed"
    evs = await assert_journal_sound(conn, schema, retried[0])
    assert [p.get("delta") for _, t, p in evs if t == "content_delta"] == ["streamed again"]
    answers = await rows(
        conn,
        sql.SQL("SELECT content FROM {} WHERE role = 'assistant'").format(table(schema, "message")),
    )
    assert answers == [({"text": marker},)]  # the turn's answer, once


async def _second_attempt_ended(conn: psycopg.AsyncConnection, schema: str) -> bool:
    got = await rows(
        conn,
        sql.SQL("SELECT 1 FROM {} WHERE retry_of IS NOT NULL AND status NOT IN ('queued', 'running')").format(
            table(schema, "agent_run")
        ),
    )
    return bool(got)
