"""The journal's reader (tail): events after a cursor, and the run's ending when there are none.

Its own module rather than part of ``reads``: a tail runs these two statements in a loop
for as long as a client watches, on a connection it may keep, and the benchmarks time them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg.rows import args_row

from .. import _sql
from .._events import Event
from ._exec import execute

if TYPE_CHECKING:
    import uuid

    from psycopg import AsyncConnection

    from .._models import RunStatus


class RunEnd(NamedTuple):
    """A run's status and error, whether its journal holds its ending, and its last seq
    (None once trimmed)."""

    status: RunStatus
    error: Any
    journaled_end: bool
    last_seq: int | None


async def read_events(
    conn: AsyncConnection, schema: str, *, run_id: uuid.UUID, after: int, limit: int
) -> list[Event]:
    """Up to ``limit`` of the run's events after seq ``after``, in order."""
    cur = conn.cursor(row_factory=args_row(Event))
    await execute(
        conn,
        _sql.statement("read_events", schema),
        {"run_id": run_id, "after": after, "limit": limit},
        cursor=cur,
    )
    return await cur.fetchall()


async def run_terminal_state(conn: AsyncConnection, schema: str, *, run_id: uuid.UUID) -> RunEnd | None:
    """The run's status and journal ending (see :class:`RunEnd`); None if there is no such run."""
    cur = await execute(conn, _sql.statement("run_terminal_state", schema), {"run_id": run_id})
    row = await cur.fetchone()
    return None if row is None else RunEnd(*row)
