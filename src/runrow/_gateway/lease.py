"""The lease keeper's statements (``heartbeat``, ``cancel_flag`` in ``sql/runs.sql``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _sql
from ._exec import execute

if TYPE_CHECKING:
    import uuid
    from collections.abc import Sequence
    from datetime import datetime

    from psycopg import AsyncConnection


async def heartbeat(
    conn: AsyncConnection,
    schema: str,
    runs: Sequence[tuple[uuid.UUID, uuid.UUID]],
    *,
    lease_seconds: float,
    now: datetime | None = None,
) -> dict[uuid.UUID, bool]:
    """Rolls the lease of each ``(run id, claim token)`` still held; returns, for each run
    still this claim's, whether a stop was requested (runs missing are lost)."""
    cur = await execute(
        conn,
        _sql.statement("heartbeat", schema),
        {
            "ids": [run_id for run_id, _ in runs],
            "tokens": [token for _, token in runs],
            "lease_seconds": lease_seconds,
            "now": now,
        },
    )
    return {run_id: bool(cancel) for run_id, cancel in await cur.fetchall()}


async def cancel_requested(
    conn: AsyncConnection, schema: str, run_id: uuid.UUID, claim_token: uuid.UUID
) -> bool:
    """Whether a stop was requested for the run while this claim holds it."""
    cur = await execute(
        conn, _sql.statement("cancel_flag", schema), {"run_id": run_id, "claim_token": claim_token}
    )
    row = await cur.fetchone()
    return row is not None and bool(row[0])
