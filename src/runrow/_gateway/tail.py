"""The journal's reader (tail): events after a cursor, and the run's ending when there are none.

Its own module rather than part of ``reads``: a tail runs these two statements in a loop
for as long as a client watches, on a connection it may keep, and the benchmarks time them.
Both are plans (see :mod:`._exec`), run by the async tail and the sync one.
:func:`read_events_many` is the read of many tails at once (see ``runrow._tailbatch``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg.rows import args_row

from .. import _sql
from .._events import Event
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from collections.abc import Sequence

    from .._status import RunStatus


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


class ReadRequest(NamedTuple):
    """One tail's read in a batch: its run, its cursor and its batch size."""

    run_id: uuid.UUID
    after: int
    limit: int


def read_events_many(
    schema: str, requests: Sequence[ReadRequest]
) -> Plan[list[tuple[list[Event], RunEnd | None] | None]]:
    """Many tails' reads as one statement: for each request, in order, what the single
    read (``_tail.read_plan``) returns: ``(events, None)``, or ``([], ending)`` when
    there are none past the cursor; None where there is no such run."""
    rows = yield Query(
        _sql.statement("read_events_many", schema),
        {
            "run_ids": [r.run_id for r in requests],
            "afters": [r.after for r in requests],
            "limits": [r.limit for r in requests],
        },
    )
    out: list[tuple[list[Event], RunEnd | None] | None] = [None] * len(requests)
    events: list[Event] | None = None
    last = 0
    for i, seq, type_, payload, status, error, journaled_end, last_seq in rows:
        if seq is None:
            if status is not None:
                out[i - 1] = ([], RunEnd(status, error, journaled_end, last_seq))
            continue
        if i != last:  # rows come ordered by request, then seq
            events, last = [], i
            out[i - 1] = (events, None)
        assert events is not None
        events.append(Event(seq, type_, payload))
    return out


def primary_wal_lsn(schema: str) -> Plan[str]:
    """Where the primary's WAL ends now (see sql/replica.sql)."""
    rows = yield Query(_sql.statement("primary_wal_lsn", schema), None)
    return str(rows[0][0])


def replica_replayed(schema: str, *, lsn: str) -> Plan[bool]:
    """Whether a standby has replayed its primary's WAL up to ``lsn`` (true off recovery)."""
    rows = yield Query(_sql.statement("replica_replayed", schema), {"lsn": lsn})
    return bool(rows[0][0])
