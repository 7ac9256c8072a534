"""The journal's reader (tail): events after a cursor, and the run's ending when there are none.

Its own module rather than part of ``reads``: a tail runs these two statements in a loop
for as long as a client watches, on a connection it may keep, and the benchmarks time them.
Both are plans (see :mod:`._exec`), run by the async tail and the sync one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg.rows import args_row

from .. import _sql
from .._events import Event
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid

    from .._models import RunStatus


class RunEnd(NamedTuple):
    """A run's status and error, whether its journal holds its ending, and its last seq
    (None once trimmed)."""

    status: RunStatus
    error: Any
    journaled_end: bool
    last_seq: int | None


def read_events(schema: str, *, run_id: uuid.UUID, after: int, limit: int) -> Plan[list[Event]]:
    """Up to ``limit`` of the run's events after seq ``after``, in order."""
    rows = yield Query(
        _sql.statement("read_events", schema),
        {"run_id": run_id, "after": after, "limit": limit},
        args_row(Event),
    )
    return rows


def run_terminal_state(schema: str, *, run_id: uuid.UUID) -> Plan[RunEnd | None]:
    """The run's status and journal ending (see :class:`RunEnd`); None if there is no such run."""
    rows = yield Query(_sql.statement("run_terminal_state", schema), {"run_id": run_id})
    return RunEnd(*rows[0]) if rows else None
