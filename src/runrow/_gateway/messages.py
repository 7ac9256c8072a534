"""A run's fenced transcript writes (``write_message``, ``message_landed`` in ``sql/messages.sql``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import _sql
from ._exec import execute

if TYPE_CHECKING:
    import uuid

    from psycopg import AsyncConnection


@dataclass(frozen=True, slots=True)
class MessageState:
    """What a read-back found after a transcript write of unknown outcome."""

    landed: bool
    owned: bool
    """Whether the claim is still this worker's."""


async def write(
    conn: AsyncConnection,
    schema: str,
    *,
    message_id: uuid.UUID,
    run_id: uuid.UUID,
    claim_token: uuid.UUID,
    role: str,
    content: str,
) -> bool:
    """Appends a message to the run's conversation, fenced by the claim; False if the
    fence matched nothing (or the id exists already: an earlier attempt landed)."""
    cur = await execute(
        conn,
        _sql.statement("write_message", schema),
        {
            "message_id": message_id,
            "run_id": run_id,
            "claim_token": claim_token,
            "role": role,
            "content": content,
        },
    )
    return await cur.fetchone() is not None


async def landed(
    conn: AsyncConnection, schema: str, *, message_id: uuid.UUID, run_id: uuid.UUID, claim_token: uuid.UUID
) -> MessageState:
    """Whether the message exists, and whether the claim still holds."""
    cur = await execute(
        conn,
        _sql.statement("message_landed", schema),
        {"message_id": message_id, "run_id": run_id, "claim_token": claim_token},
    )
    row = await cur.fetchone()
    assert row is not None
    return MessageState(bool(row[0]), bool(row[1]))
