"""The lease keeper's statements (``heartbeat``, ``cancel_flag`` in ``sql/claims.sql``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _sql
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from collections.abc import Sequence
    from datetime import datetime


def heartbeat(
    schema: str,
    runs: Sequence[tuple[uuid.UUID, uuid.UUID]],
    *,
    lease_seconds: float,
    now: datetime | None = None,
) -> Plan[dict[uuid.UUID, bool]]:
    """Rolls the lease of each ``(run id, claim token)`` still held; returns, for each run
    still this claim's, whether a stop was requested (runs missing are lost)."""
    rows = yield Query(
        _sql.statement("heartbeat", schema),
        {
            "ids": [run_id for run_id, _ in runs],
            "tokens": [token for _, token in runs],
            "lease_seconds": lease_seconds,
            "now": now,
        },
    )
    return {run_id: bool(cancel) for run_id, cancel in rows}


def cancel_requested(schema: str, run_id: uuid.UUID, claim_token: uuid.UUID) -> Plan[bool]:
    """Whether a stop was requested for the run while this claim holds it."""
    rows = yield Query(_sql.statement("cancel_flag", schema), {"run_id": run_id, "claim_token": claim_token})
    return bool(rows) and bool(rows[0][0])
