"""The claimer's statements (``claim``, ``claim_fifo`` in ``sql/runs.sql``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from psycopg.rows import class_row

from .. import _sql
from ._exec import execute

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

    from psycopg import AsyncConnection

ClaimOrder = Literal["fair", "fifo"]


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """One run a claim took: the row, stamped with this claim's token and lease."""

    id: uuid.UUID
    claim_token: uuid.UUID
    conversation_id: str
    user_id: str
    tenant_id: str | None
    request: Any
    user_message_id: uuid.UUID
    cancel_requested: bool
    created_at: datetime
    started_at: datetime
    deadline_at: datetime | None
    priority: int
    content: Any
    last_seq: int


async def claim(
    conn: AsyncConnection,
    schema: str,
    *,
    order: ClaimOrder,
    limit: int,
    lease_seconds: float,
    worker_id: str,
    now: datetime | None = None,
) -> list[ClaimedRun]:
    """Claims up to ``limit`` runs (at most one per conversation) in ``order``."""
    cur = conn.cursor(row_factory=class_row(ClaimedRun))
    await execute(
        conn,
        _sql.statement("claim", schema) if order == "fair" else _sql.statement("claim_fifo", schema),
        {"limit": limit, "lease_seconds": lease_seconds, "worker_id": worker_id, "now": now},
        cursor=cur,
    )
    return await cur.fetchall()
