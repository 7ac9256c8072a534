"""Seeding many queued runs at once: what enqueue writes (message, run, journal seq 1-2),
as one set-based statement, so a test can stand up 10,000 queued runs in well under a second."""

from __future__ import annotations

import psycopg
from psycopg import sql

SEED = """
WITH run AS (
    INSERT INTO {run} (conversation_id, user_id, tenant_id, user_message_id, priority)
    SELECT %(prefix)s || '-' || (g %% %(conversations)s), 'u', %(tenant)s, gen_random_uuid(), 0
    FROM generate_series(0, %(n)s - 1) g
    ORDER BY g
    RETURNING id, user_message_id, conversation_id, queue_order
), msg AS (
    INSERT INTO {message} (id, conversation_id, run_id, role, content, status, user_id, turn)
    SELECT user_message_id, conversation_id, id, 'user', '"seeded"'::jsonb, 'sent', 'u', queue_order FROM run
), ev AS (
    INSERT INTO {event} (run_id, seq, type, payload)
    SELECT id, 1, 'user_message_created', '{{}}'::jsonb FROM run
    UNION ALL
    SELECT id, 2, 'run_queued', '{{}}'::jsonb FROM run
)
SELECT count(*) FROM run
"""


async def seed(
    conn: psycopg.AsyncConnection,
    schema: str,
    *,
    tenant: str | None,
    n: int,
    conversations: int,
    prefix: str | None = None,
) -> int:
    """``n`` queued runs of ``tenant`` spread round-robin over ``conversations`` conversations."""
    query = sql.SQL(SEED).format(
        run=sql.Identifier(schema, "agent_run"),
        message=sql.Identifier(schema, "message"),
        event=sql.Identifier(schema, "run_event"),
    )
    cur = await conn.execute(
        query,
        {"prefix": prefix or f"seed-{tenant}", "conversations": conversations, "tenant": tenant, "n": n},
    )
    row = await cur.fetchone()
    assert row is not None
    await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "agent_run")))
    return int(row[0])
