"""The demo's own table, next to runrow's: the tool's notes.

A host keeps this kind of data in its own schema. Here it lives in ``<schema>_demo`` so that dropping the demo leaves runrow alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from psycopg import sql

if TYPE_CHECKING:
    import uuid

    from psycopg import AsyncConnection

__all__ = ["ensure_tables", "list_notes", "record_note"]

_DDL = """
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.note (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id          uuid        NOT NULL,
    conversation_id text        NOT NULL,
    user_id         text        NOT NULL,
    text            text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS note_conversation_idx ON {s}.note (conversation_id, id);
"""


def _q(template: str, demo_schema: str) -> sql.Composed:
    return sql.SQL(template).format(s=sql.Identifier(demo_schema))


async def ensure_tables(conn: AsyncConnection, demo_schema: str) -> None:
    """Creates the demo's tables if they are missing (idempotent, serialised by a lock)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (demo_schema,))
        await conn.execute(_q(_DDL, demo_schema))


async def record_note(
    conn: AsyncConnection, demo_schema: str, run_id: uuid.UUID, conversation_id: str, user_id: str, text: str
) -> tuple[int, int]:
    """The tool's side effect: one row. Returns (note id, notes in this conversation)."""
    cur = await conn.execute(
        _q(
            "WITH n AS (INSERT INTO {s}.note (run_id, conversation_id, user_id, text) "
            "VALUES (%s, %s, %s, %s) RETURNING id) "
            "SELECT (SELECT id FROM n), (SELECT count(*) FROM {s}.note WHERE conversation_id = %s) + 1",
            demo_schema,
        ),
        (run_id, conversation_id, user_id, text, conversation_id),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def list_notes(conn: AsyncConnection, demo_schema: str, conversation_id: str) -> list[dict[str, Any]]:
    cur = await conn.execute(
        _q(
            "SELECT id, run_id, text, created_at FROM {s}.note WHERE conversation_id = %s ORDER BY id",
            demo_schema,
        ),
        (conversation_id,),
    )
    return [
        {"id": r[0], "run_id": str(r[1]), "text": r[2], "created_at": r[3].isoformat()}
        for r in await cur.fetchall()
    ]
