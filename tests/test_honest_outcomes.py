"""A reaped run's terminal event says the worker was lost and which tool calls are uncertain."""

from __future__ import annotations

import psycopg
import pytest

import runrow

from . import manual
from .helpers import assert_journal_sound, run_row

pytestmark = pytest.mark.anyio


async def _reap(conn: psycopg.AsyncConnection, schema: str, run_id: object) -> list[object]:
    row = await run_row(conn, schema, run_id)
    from datetime import timedelta

    now = row["claim_expires_at"] + timedelta(seconds=10)
    ids = await manual.reap_candidates(conn, schema, grace=5, now=now)
    return list(await manual.reap(conn, schema, ids, grace=5, now=now))


async def test_reaped_run_lists_tool_calls_that_started_and_never_finished(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema, worker_id="doomed")
    token = claimed["claim_token"]
    assert await manual.append(
        conn,
        schema,
        run.id,
        token,
        [
            (3, "tool_call_started", {"tool_call_id": "t1", "name": "search"}),
            (4, "tool_call_finished", {"tool_call_id": "t1", "name": "search", "ok": True}),
            (5, "tool_call_started", {"tool_call_id": "t2", "name": "send_email", "args": {"to": "x"}}),
            (6, "tool_call_started", {"tool_call_id": "t3", "name": "charge_card"}),
            (7, "tool_call_started", {"name": "no id: cannot be matched, not listed"}),
            (8, "content_delta", {"delta": "sending..."}),
        ],
    )
    assert await _reap(conn, schema, run.id) == [run.id]
    evs = await assert_journal_sound(conn, schema, run.id)
    end = evs[-1][2]
    assert end["status"] == "failed" and end["reason"] == "worker_lost"
    assert end["error"]["type"] == "worker_lost"
    assert end["uncertain_tool_calls"] == [
        {"tool_call_id": "t2", "name": "send_email"},
        {"tool_call_id": "t3", "name": "charge_card"},
    ]


async def test_a_reaped_run_without_tool_calls_says_so(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    await manual.claim(conn, schema, worker_id="doomed")
    assert await _reap(conn, schema, run.id) == [run.id]
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2]["uncertain_tool_calls"] == [] and evs[-1][2]["reason"] == "worker_lost"


async def test_a_reaped_run_that_was_being_stopped_is_cancelled_and_still_lists_them(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema, worker_id="doomed")
    await manual.append(
        conn,
        schema,
        run.id,
        claimed["claim_token"],
        [(3, "tool_call_started", {"tool_call_id": 7, "name": "n"})],
    )
    await runrow.cancel_run(dsn, run.id, schema=schema)
    assert await _reap(conn, schema, run.id) == [run.id]
    end = (await assert_journal_sound(conn, schema, run.id))[-1][2]
    assert end["status"] == "cancelled" and end["uncertain_tool_calls"] == [{"tool_call_id": 7, "name": "n"}]


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
        assert d.stats["failed"] == 3 and d.stats["completed"] == 1
    rows = {c: await run_row(conn, schema, r.id) for c, r in runs.items()}
    assert rows["fine"]["status"] == "completed"
    assert rows["nul"]["error"] == {"type": "RuntimeError", "message": "bad\ufffdbyte"}
    assert rows["surrogate"]["error"] == {"type": "RuntimeError", "message": "lone ? half"}
    assert rows["unprintable"]["error"] == {
        "type": "_Unprintable",
        "message": "<_Unprintable with an unprintable message>",
    }
    for r in runs.values():
        await assert_journal_sound(conn, schema, r.id)
