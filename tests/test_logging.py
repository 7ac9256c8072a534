"""Logs carry ids, never what users wrote (message content, request snapshots, row data)."""

from __future__ import annotations

import logging

import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._db import describe

from .helpers import is_terminal, table, wait_for

pytestmark = pytest.mark.anyio
SECRET = "TOPSECRET-7f3a"


async def test_server_error_descriptions_leave_out_row_data(
    schema: str, conn: psycopg.AsyncConnection
) -> None:
    messages = table(schema, "message")
    with pytest.raises(psycopg.IntegrityError) as info:  # no content: a NOT NULL column
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (conversation_id, role, content, status, turn, user_id)"
                " VALUES ('c', 'user', NULL, 'sent', 1, %s)"
            ).format(messages),
            (SECRET,),
        )
    assert SECRET in str(info.value)  # the server quotes the failing row in DETAIL...
    text = describe(info.value)
    assert SECRET not in text and "23502" in text and "not-null constraint" in text  # ...describe() does not
    # A broken rule (since schema 23 a function's check) is described by its name alone.
    with pytest.raises(psycopg.IntegrityError) as info:
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (conversation_id, role, content, status, turn) VALUES (%s, 'nobody', %s, 'sent', 1)"
            ).format(messages),
            ("c", psycopg.types.json.Jsonb(SECRET)),
        )
    text = describe(info.value)
    assert SECRET not in text and "23514" in text and 'check constraint "message_role_check"' in text


async def test_a_run_logs_ids_and_outcomes_but_no_content_when_error_messages_are_off(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.text(f"answer with {SECRET}")
        await run.write_message(f"final {SECRET}")
        if run.content == f"fail {SECRET}":
            raise ValueError(f"agent error quoting {SECRET}")

    caplog.set_level(logging.DEBUG, logger="runrow")
    # Error messages are logged by default (they may quote a user, as this one does);
    # log_error_messages=False is the switch for logs that must never carry content.
    async with runrow.Dispatcher(dsn, agent, schema=schema, poll=0.5, log_error_messages=False):
        runs = [
            await runrow.enqueue(
                dsn, schema=schema, conversation_id="c", user_id="u", content=c, request={"k": SECRET}
            )
            for c in (f"hi {SECRET}", f"fail {SECRET}")
        ]
        for r in runs:
            await wait_for(lambda r=r: is_terminal(conn, schema, r.id), what="runs to end")
    records = [r for r in caplog.records if r.name.startswith("runrow")]
    assert any(getattr(r, "run_id", None) == str(runs[0].id) for r in records)  # structured ids are there
    for r in records:
        assert SECRET not in r.getMessage(), r.getMessage()
        assert all(SECRET not in str(v) for v in vars(r).values() if v is not r.msg), r.__dict__
