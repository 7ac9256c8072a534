"""A step's record is a heap-only update of its begun row (schema 26, sql/steps.sql's
step_record): the schema keeps every column the record changes out of run_step's
indexes, and the record's own-row path keeps the fence, the answer to a resend and
the refusal of a stale claim."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._gateway import steps as _gw
from runrow._gateway._exec import run as run_plan

from .helpers import indexes_naming, is_terminal, rows, table, updates_counted, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 5.0, "grace": 1.0, "reap_interval": 0.2}

# What recording a step changes (step_record's `own` update): an index naming any of
# these, in its columns, expressions or predicate, makes every record a full update.
RECORD_CHANGES = ("status", "result", "error", "recorded_at", "version")


async def test_no_index_of_run_step_names_a_column_a_record_changes(
    schema: str, conn: psycopg.AsyncConnection
) -> None:
    count, found = await indexes_naming(conn, schema, "run_step", RECORD_CHANGES)
    assert count >= 1, "run_step has its primary key at least"
    assert not found, f"a step's record could not be heap-only: {found}"


async def test_a_steps_record_is_a_heap_only_update(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Three steps of a turn: three updates of run_step, every one heap-only."""

    async def agent(run: runrow.RunContext) -> None:
        for k in range(3):
            await run.step("tool", lambda k=k: {"k": k, "text": "x" * 40})

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        r = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="go")
        await wait_for(lambda: is_terminal(conn, schema, r.id), what="the turn")
    # (A backend's counters reach the view when it exits: the Dispatcher's pool has closed.)
    updates = await wait_for(
        lambda: updates_counted(conn, schema, "run_step", 3),
        timeout=15,
        what="the three records in pg_stat_user_tables",
    )
    assert updates == (3, 3), f"(updates, heap-only updates) of run_step: {updates}"
    got = await rows(
        conn,
        sql.SQL("SELECT key, occurrence, status, result FROM {} ORDER BY position").format(
            table(schema, "run_step")
        ),
    )
    assert got == [("tool", k, "recorded", {"k": k, "text": "x" * 40}) for k in range(3)]


async def test_the_own_row_record_is_fenced_and_answers_a_resend(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Through the gateway, while a real worker holds the run: a begun step is recorded
    over its own row; sent again it answers the same; an idempotent step is inserted;
    a stale claim token records nothing and leaves the begun row as it was."""
    gate = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        await gate.wait()

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        r = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="go")
        token = await wait_for(lambda: _token(conn, schema, r.id), what="the claim")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:

            async def call(plan: Any) -> Any:
                return await run_plan(c, plan)

            where: dict[str, Any] = {"run_id": r.id, "claim_token": token}
            assert await call(_gw.start(schema, **where, key="charge", occurrence=0, position=0))
            first = await call(
                _gw.record(
                    schema, **where, key="charge", occurrence=0, position=0, idempotent=False,
                    result='{"b": 1, "a": 2.50}', error=None,
                )
            )  # fmt: skip
            assert first is not None and first.result == {"a": 2.50, "b": 1}
            again = await call(
                _gw.record(
                    schema, **where, key="charge", occurrence=0, position=0, idempotent=False,
                    result='{"b": 1, "a": 2.50}', error=None,
                )
            )  # fmt: skip
            assert again is not None and again.result == first.result
            once = await call(
                _gw.record(
                    schema, **where, key="read", occurrence=0, position=1, idempotent=True,
                    result="[1]", error=None,
                )
            )  # fmt: skip
            assert once is not None and once.result == [1]
            # A begun step whose claim then changed hands: nothing recorded.
            assert await call(_gw.start(schema, **where, key="ship", occurrence=0, position=2))
            stale = {"run_id": r.id, "claim_token": uuid.uuid4()}
            refused = await call(
                _gw.record(
                    schema, **stale, key="ship", occurrence=0, position=2, idempotent=False,
                    result="true", error=None,
                )
            )  # fmt: skip
            assert refused is None
        gate.set()
        await wait_for(lambda: is_terminal(conn, schema, r.id), what="the turn")
    got = await rows(
        conn,
        sql.SQL("SELECT key, status, result, idempotent FROM {} ORDER BY position").format(
            table(schema, "run_step")
        ),
    )
    assert got == [
        ("charge", "recorded", {"a": 2.50, "b": 1}, False),
        ("read", "recorded", [1], True),
        ("ship", "started", None, False),
    ]


async def _token(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID) -> uuid.UUID | None:
    (row,) = await rows(
        conn,
        sql.SQL("SELECT claim_token FROM {} WHERE id = %s AND status = 'running'").format(
            table(schema, "agent_run")
        ),
        (run_id,),
    ) or [(None,)]
    return row[0]  # type: ignore[no-any-return]
