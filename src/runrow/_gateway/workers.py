"""The worker registry's statements (``sql/workers.sql``): a dispatcher's registration and
beat, its clean leave, the reaper's removal of the dead, and the reads of the CLI, the
dashboard and the metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from psycopg.rows import class_row

from .. import _sql
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from datetime import datetime


class Registration(NamedTuple):
    """What a dispatcher writes about itself at each beat."""

    id: str
    host: str
    pid: int
    version: str | None
    agent: str
    concurrency: int
    agent_keys: list[str] = []  # noqa: RUF012 - (a NamedTuple field's default, never mutated)
    """The agent keys it serves (``Dispatcher(agents=...)``)."""
    serves_default: bool = True
    """Whether it serves the default agent (runs with no agent key)."""


class WorkerRow(NamedTuple):
    """One live worker, as its last beat left it."""

    id: str
    host: str
    pid: int
    version: str | None
    agent: str
    concurrency: int
    in_flight: int
    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    agent_keys: list[str] | None
    """The agent keys it serves (None: a release before agent keys: the default only)."""
    serves_default: bool | None
    """Whether it serves the default agent (None: a release before agent keys: it does)."""


class Reaped(NamedTuple):
    """A worker the reaper removed."""

    id: str
    host: str
    pid: int
    version: str | None


def beat(
    schema: str,
    who: Registration,
    *,
    in_flight: int,
    lease_seconds: float,
    started_at: datetime | None,
) -> Plan[datetime]:
    """Registers ``who`` or rolls its row; returns its (first) start."""
    (row,) = yield Query(  # (an upsert always returns its row)
        _sql.statement("worker_beat", schema),
        {
            **who._asdict(),
            "in_flight": in_flight,
            "lease_seconds": lease_seconds,
            "started_at": started_at,
        },
    )
    started: datetime = row[0]
    return started


def leave(schema: str, who: Registration) -> Plan[None]:
    """Removes ``who``'s row (a clean stop)."""
    yield Query(_sql.statement("worker_leave", schema), {"id": who.id, "pid": who.pid, "host": who.host})


def reap(schema: str, *, grace_seconds: float, now: datetime | None = None) -> Plan[list[Reaped]]:
    """Removes the workers whose lease lapsed more than ``grace_seconds`` ago."""
    rows = yield Query(_sql.statement("worker_reap", schema), {"grace_seconds": grace_seconds, "now": now})
    return [Reaped(*row) for row in rows]


def list_workers(schema: str) -> Plan[list[WorkerRow]]:
    """The registered workers, by version, then start."""
    rows: list[WorkerRow] = yield Query(
        _sql.statement("worker_list", schema), row_factory=class_row(WorkerRow)
    )
    return rows


def running_of_version(schema: str, version: str) -> Plan[int]:
    """How many runs a worker of ``version`` claimed are running now."""
    rows = yield Query(_sql.statement("worker_version_running", schema), {"version": version})
    return int(rows[0][0]) if rows else 0


def count_by_version(schema: str) -> Plan[dict[str, int]]:
    """Registered workers per version ('' for none)."""
    rows = yield Query(_sql.statement("worker_count_by_version", schema))
    return {version: int(n) for version, n in rows}


class StrandedRun(NamedTuple):
    """A queued run with recorded steps whose version no live worker has."""

    id: uuid.UUID
    conversation_id: str
    version: str
    status: str
    queued_since: datetime


def stranded(schema: str, *, older_than: float, limit: int = 1000) -> Plan[list[StrandedRun]]:
    """Runs queued more than ``older_than`` seconds for a version no live worker has."""
    rows: list[StrandedRun] = yield Query(
        _sql.statement("worker_stranded", schema),
        {"older_than": older_than, "limit": limit},
        row_factory=class_row(StrandedRun),
    )
    return rows


class UnservedKey(NamedTuple):
    """Queued runs of one agent key that no live worker serves."""

    agent_key: str
    """The key ('' for the default agent)."""
    runs: int
    oldest: datetime


def unserved(schema: str) -> Plan[list[UnservedKey]]:
    """The agent keys with queued runs that no live worker serves."""
    rows: list[UnservedKey] = yield Query(
        _sql.statement("worker_unserved", schema), row_factory=class_row(UnservedKey)
    )
    return rows
