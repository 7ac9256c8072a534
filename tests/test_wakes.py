"""Which endings wake the queue: only those that can let an idle worker claim something.

A run's ending NOTIFYs the wake channel when its conversation has a next turn waiting
or its tenant has a running cap (a place under the cap just freed). Any other ending
would wake every listening worker in every process for nothing.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._names import Channels

from . import manual

pytestmark = pytest.mark.anyio


async def _wakes_from(dsn: str, schema: str, ends: list[tuple[dict[str, object], str]]) -> list[str]:
    """Finalises each claimed run in order, labelled, and returns the labels whose
    finalize sent a wake. A sentinel NOTIFY after each one splits the stream without any
    waiting for an absence."""
    wake = Channels.for_schema(schema).wake
    labels: list[str] = []
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
    ):
        await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(wake)))
        for row, label in ends:
            assert await manual.finalize(conn, schema, row["id"], row["claim_token"], "completed", 3)
            await conn.execute("SELECT pg_notify(%s, %s)", (wake, f"end:{label}"))
        seen: list[str] = []
        async for n in listener.notifies(timeout=10, stop_after=2 * len(ends)):
            seen.append(n.payload)
            if n.payload == f"end:{ends[-1][1]}":
                break
    for i, payload in enumerate(seen):
        if payload.startswith("end:") and i > 0 and seen[i - 1] == "":
            labels.append(payload[4:])
    assert [p for p in seen if p.startswith("end:")] == [f"end:{label}" for _, label in ends]
    return labels


async def test_an_ending_wakes_the_queue_only_when_a_claim_may_follow(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def turn(conversation: str, tenant: str | None = None) -> runrow.Run:
        return await runrow.enqueue(
            dsn, schema=schema, conversation_id=conversation, user_id="u", content="x", tenant_id=tenant
        )

    await turn("lonely")
    await turn("busy")
    await turn("busy")  # the second turn of "busy" waits for the first to end
    await turn("capped", tenant="t-capped")
    await runrow.set_tenant_policy(dsn, "t-capped", max_running=5, schema=schema)
    claimed = {str(r["conversation_id"]): r for r in await manual.claim(conn, schema, limit=10)}
    assert sorted(claimed) == ["busy", "capped", "lonely"]

    woke = await _wakes_from(
        dsn,
        schema,
        [(claimed["lonely"], "lonely"), (claimed["busy"], "busy"), (claimed["capped"], "capped")],
    )
    assert woke == ["busy", "capped"]
