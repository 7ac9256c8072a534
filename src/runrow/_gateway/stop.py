"""Stopping turns: lock a conversation's or one run's active runs, cancel the queued ones
(their messages become drafts), flag the running ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .. import _sql
from .._models import Draft
from ._exec import execute

if TYPE_CHECKING:
    import uuid

    from psycopg import AsyncConnection

    from .._models import RunStatus


class LockedRun(NamedTuple):
    """A run locked for a stop, and its status then."""

    id: uuid.UUID
    status: RunStatus


async def lock_conversation_runs(
    conn: AsyncConnection, schema: str, *, conversation_id: str
) -> list[LockedRun]:
    """Locks every queued and running run of the conversation (FOR UPDATE), in queue order."""
    cur = await execute(
        conn, _sql.statement("lock_conversation_runs", schema), {"conversation_id": conversation_id}
    )
    return [LockedRun(rid, status) for rid, status in await cur.fetchall()]


async def lock_run(conn: AsyncConnection, schema: str, *, run_id: uuid.UUID) -> LockedRun | None:
    """Locks one run (FOR UPDATE); None if there is no such run."""
    cur = await execute(conn, _sql.statement("lock_run", schema), {"run_id": run_id})
    row = await cur.fetchone()
    return None if row is None else LockedRun(row[0], row[1])


async def cancel_queued(
    conn: AsyncConnection, schema: str, *, ids: list[uuid.UUID], events_prefix: str
) -> list[Draft]:
    """Cancels those of ``ids`` still queued, journals their ending; their messages, as drafts."""
    cur = await execute(
        conn, _sql.statement("cancel_queued", schema), {"ids": ids, "events_prefix": events_prefix}
    )
    return [Draft(r[0], r[1], r[2]) for r in await cur.fetchall()]


async def request_cancel(
    conn: AsyncConnection, schema: str, *, ids: list[uuid.UUID], cancel_channel: str
) -> list[uuid.UUID]:
    """Sets the durable cancel flag (and notifies) on those of ``ids`` still running."""
    cur = await execute(
        conn, _sql.statement("request_cancel", schema), {"ids": ids, "cancel_channel": cancel_channel}
    )
    return [r[0] for r in await cur.fetchall()]
