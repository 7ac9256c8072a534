"""The reaper's statements (``reap_candidates``, ``reap`` in ``sql/endings.sql``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import _sql
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

    from .._names import Channels
    from .._status import RunStatus


@dataclass(frozen=True, slots=True)
class Reaped:
    """A run the reaper ended: its terminal status, the worker that lost it (or that
    parked it, for a waiting run), and why (the terminal event's ``reason``)."""

    run_id: uuid.UUID
    conversation_id: str
    status: RunStatus
    worker_id: str | None
    reason: str


def candidates(
    schema: str, *, grace_seconds: float, limit: int, now: datetime | None = None
) -> Plan[list[uuid.UUID]]:
    """Runs whose lease lapsed more than ``grace_seconds`` ago, oldest first."""
    rows = yield Query(
        _sql.statement("reap_candidates", schema),
        {"now": now, "grace_seconds": grace_seconds, "limit": limit},
    )
    return [row[0] for row in rows]


def reap(
    schema: str,
    ids: list[uuid.UUID],
    *,
    grace_seconds: float,
    channels: Channels,
    now: datetime | None = None,
) -> Plan[list[Reaped]]:
    """Ends those of ``ids`` still expired (re-checked inside the write), each with its
    terminal event; wakes their tails and the queue."""
    rows = yield Query(
        _sql.statement("reap", schema),
        {
            "ids": ids,
            "now": now,
            "grace_seconds": grace_seconds,
            "events_prefix": channels.events_prefix,
            "wake_channel": channels.wake,
        },
    )
    return [Reaped(row[0], row[1], row[2], row[3], row[4]) for row in rows]
