"""The operator dashboard's reads (runrow.admin): sql/admin.sql, each statement run
unprepared, so the planner sees the filter values and picks the filter's index."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg.rows import class_row

from .. import _sql
from .._models import RunInfo
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from datetime import datetime


class RunFilter(NamedTuple):
    """The runs list's filters (None: no such filter); ``created_to`` is exclusive."""

    status: str | None = None
    tenant_id: str | None = None
    conversation_id: str | None = None
    user_id: str | None = None
    worker_id: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None


class Attempt(NamedTuple):
    """One attempt of a turn (its lineage), or one turn of a conversation."""

    id: uuid.UUID
    status: str
    attempt: int
    user_id: str | None
    tenant_id: str | None
    worker_id: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: dict[str, Any] | None


class StepRow(NamedTuple):
    """One durable step of a turn."""

    position: int
    key: str
    occurrence: int
    run_id: uuid.UUID
    status: str
    idempotent: bool
    started_at: datetime
    recorded_at: datetime | None
    error: Any


class TenantHealth(NamedTuple):
    """One tenant's queue: queued and running runs, the oldest wait, its policy."""

    tenant: str
    queued: int
    running: int
    oldest_wait_seconds: float | None
    weight: int | None
    max_running: int | None


class WorkerRow(NamedTuple):
    """A worker seen in running runs' claims."""

    worker_id: str | None
    runs: int
    last_heartbeat_at: datetime | None
    next_lease_expiry: datetime | None


class Bucket(NamedTuple):
    """Runs finished in one time bucket."""

    bucket: datetime
    completed: int
    ended_otherwise: int
    reaped: int


def list_runs(
    schema: str, f: RunFilter, *, before: tuple[datetime, uuid.UUID] | None, limit: int
) -> Plan[list[RunInfo]]:
    """One page of runs, newest first, after the keyset cursor ``before`` (created_at, id)."""
    params: dict[str, Any] = dict(f._asdict())
    params.update(
        before_created=None if before is None else before[0],
        before_id=None if before is None else before[1],
        limit=limit,
    )
    rows = yield Query(
        _sql.statement("admin_list_runs", schema), params, row_factory=class_row(RunInfo), prepare=False
    )
    return rows


def status_counts(schema: str, *, tenant_id: str | None) -> Plan[dict[str, int]]:
    """Live runs per status, and those finished in the last hour."""
    rows = yield Query(_sql.statement("admin_status_counts", schema), {"tenant_id": tenant_id}, prepare=False)
    return {str(s): int(n) for s, n in rows}


def lineage(schema: str, *, root: uuid.UUID) -> Plan[list[tuple[Any, ...]]]:
    """The turn's attempts: (id, status, attempt, retry_of, tenant_id, created_at, finished_at, error)."""
    rows = yield Query(_sql.statement("admin_lineage", schema), {"root": root})
    return list(rows)


def terminal_event(schema: str, *, run_id: uuid.UUID) -> Plan[dict[str, Any] | None]:
    """The payload of the run's terminal event, if it has one."""
    rows = yield Query(_sql.statement("admin_terminal_event", schema), {"run_id": run_id})
    return dict(rows[0][0]) if rows else None


def steps(schema: str, *, lineage_id: uuid.UUID, limit: int) -> Plan[list[StepRow]]:
    """The turn's durable steps in call order."""
    rows = yield Query(_sql.statement("admin_steps", schema), {"lineage_id": lineage_id, "limit": limit})
    return [StepRow(*row) for row in rows]


def conversation_runs(schema: str, *, conversation_id: str, limit: int) -> Plan[list[Attempt]]:
    """A conversation's turns in order."""
    rows = yield Query(
        _sql.statement("admin_conversation_runs", schema),
        {"conversation_id": conversation_id, "limit": limit},
    )
    return [Attempt(*row) for row in rows]


def tenant_health(schema: str, *, tenant_id: str | None) -> Plan[list[TenantHealth]]:
    """Per tenant: queued, running, oldest wait, weight and cap."""
    rows = yield Query(_sql.statement("admin_tenant_health", schema), {"tenant_id": tenant_id}, prepare=False)
    return [TenantHealth(*row) for row in rows]


def workers(schema: str, *, tenant_id: str | None) -> Plan[list[WorkerRow]]:
    """Workers holding running runs: how many, and their last heartbeat."""
    rows = yield Query(_sql.statement("admin_workers", schema), {"tenant_id": tenant_id}, prepare=False)
    return [WorkerRow(*row) for row in rows]


def finished_series(
    schema: str, *, tenant_id: str | None, window_seconds: float, bucket_seconds: float
) -> Plan[list[Bucket]]:
    """Runs finished per bucket over the last ``window_seconds``."""
    rows = yield Query(
        _sql.statement("admin_finished_series", schema),
        {"tenant_id": tenant_id, "window_seconds": window_seconds, "bucket_seconds": bucket_seconds},
        prepare=False,
    )
    return [Bucket(b, int(c), int(o), int(r)) for b, c, o, r in rows]


def depth_series(
    schema: str, *, tenant_id: str | None, window_seconds: float, bucket_seconds: float
) -> Plan[list[int]]:
    """Queue depth at the end of each bucket over the last ``window_seconds`` (oldest first)."""
    rows = yield Query(
        _sql.statement("admin_depth_series", schema),
        {"tenant_id": tenant_id, "window_seconds": window_seconds, "bucket_seconds": bucket_seconds},
        prepare=False,
    )
    changes = {int(slot): int(delta) for slot, delta in rows}
    depth, out = 0, []
    for slot in range(int(window_seconds // bucket_seconds)):
        depth += changes.pop(slot, 0)
        out.append(depth)
    if out:  # the current, partial bucket
        out[-1] += sum(changes.values())
    return out
