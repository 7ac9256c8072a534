"""Stopping turns: lock a conversation's or one run's active runs, cancel the queued ones
(their messages become drafts) and the waiting ones, flag the running ones.

Every function here is a plan (see :mod:`._exec`), run on an async or a sync connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .. import _sql
from .._models import Draft
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid

    from .._names import Channels
    from .._status import RunStatus


class LockedRun(NamedTuple):
    """A run locked for a stop, its status then, and whether input resumed it (a
    queued run that had started)."""

    id: uuid.UUID
    status: RunStatus
    resumed: bool = False


def lock_conversation_runs(schema: str, *, conversation_id: str) -> Plan[list[LockedRun]]:
    """Locks every queued, running and waiting run of the conversation (FOR UPDATE), in
    queue order."""
    rows = yield Query(_sql.statement("lock_conversation_runs", schema), {"conversation_id": conversation_id})
    return [LockedRun(*r) for r in rows]


def lock_run(schema: str, *, run_id: uuid.UUID) -> Plan[LockedRun | None]:
    """Locks one run (FOR UPDATE); None if there is no such run."""
    rows = yield Query(_sql.statement("lock_run", schema), {"run_id": run_id})
    return LockedRun(*rows[0]) if rows else None


def lock_descendants(
    schema: str, *, conversation_id: str | None = None, run_id: uuid.UUID | None = None
) -> Plan[list[LockedRun]]:
    """Locks every live descendant of the conversation's live turns, or of one run (FOR
    UPDATE), in id order."""
    rows = yield Query(
        _sql.statement("lock_descendants", schema), {"conversation_id": conversation_id, "run_id": run_id}
    )
    return [LockedRun(*r) for r in rows]


def cancel_queued(schema: str, *, ids: list[uuid.UUID], channels: Channels) -> Plan[list[Draft]]:
    """Cancels those of ``ids`` still queued, journals their ending; their messages, as drafts."""
    rows = yield Query(
        _sql.statement("cancel_queued", schema),
        {"ids": ids, "events_prefix": channels.events_prefix, "wake_channel": channels.wake},
    )
    return [Draft(r[0], r[1], r[2]) for r in rows]


def cancel_paused(schema: str, *, ids: list[uuid.UUID], channels: Channels) -> Plan[list[uuid.UUID]]:
    """Cancels those of ``ids`` paused for input (waiting, or queued again by input) and
    journals their ending."""
    rows = yield Query(
        _sql.statement("cancel_paused", schema),
        {"ids": ids, "events_prefix": channels.events_prefix, "wake_channel": channels.wake},
    )
    return [r[0] for r in rows]


def request_cancel(schema: str, *, ids: list[uuid.UUID], cancel_channel: str) -> Plan[list[uuid.UUID]]:
    """Sets the durable cancel flag (and notifies) on those of ``ids`` still running."""
    rows = yield Query(
        _sql.statement("request_cancel", schema), {"ids": ids, "cancel_channel": cancel_channel}
    )
    return [r[0] for r in rows]
