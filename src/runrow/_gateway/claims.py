"""The claimer's statements (``claim``, ``claim_fifo`` in ``sql/runs.sql``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from .. import _sql
from ._exec import execute

if TYPE_CHECKING:
    import uuid
    from collections.abc import Callable, Sequence
    from datetime import datetime

    from psycopg import AsyncConnection, AsyncCursor

ClaimOrder = Literal["fair", "fifo"]


class ClaimedRun(NamedTuple):
    """One run a claim took: the row, stamped with this claim's token and lease.

    A named tuple, built straight from the row (the claim's RETURNING list has these
    columns in this order; :func:`_rows` checks the names once per claim): the claim is
    the hot path, and a tuple costs less to build than any other record."""

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
    cur = conn.cursor(row_factory=_rows)
    await execute(
        conn,
        _sql.statement("claim", schema) if order == "fair" else _sql.statement("claim_fifo", schema),
        {"limit": limit, "lease_seconds": lease_seconds, "worker_id": worker_id, "now": now},
        cursor=cur,
    )
    return await cur.fetchall()


def _rows(cursor: AsyncCursor[Any]) -> Callable[[Sequence[Any]], ClaimedRun]:
    """The claim's row factory: each row as a ClaimedRun. The columns' names are checked
    against its fields once per process (reading them is not free, and the claim is the
    hot path): the statement is fixed, so once is enough."""
    global _checked
    result = cursor.pgresult
    if not _checked and result is not None and result.nfields:
        names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
        if names != list(ClaimedRun._fields):
            raise RuntimeError(f"the claim returns {names}, not the fields of ClaimedRun")
        _checked = True
    return ClaimedRun._make


_checked = False
