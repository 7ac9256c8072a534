"""Tenants and the fair queue: policies (weight, running cap), and where a queued run stands."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from psycopg.rows import args_row

from .. import _sql
from .._models import TenantPolicy
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

    from .._status import RunStatus


class QueueSpot(NamedTuple):
    """A run's status and, while it is queued, its rank in its tenant, its place in the
    fair order, the seconds until it is due, and whether the counts are exact."""

    status: RunStatus
    rank_in_tenant: int | None
    position: int | None
    due_in: float | None
    exact: bool


def set_tenant_policy(
    schema: str, *, tenant_id: str | None, weight: int, max_running: int | None
) -> Plan[TenantPolicy]:
    """Upserts the tenant's policy and returns it as stored."""
    rows = yield Query(
        _sql.statement("set_tenant_policy", schema),
        {"tenant_id": tenant_id, "weight": weight, "max_running": max_running},
        args_row(TenantPolicy),
    )
    policy: TenantPolicy = rows[0]  # (an upsert always returns its row)
    return policy


def list_tenant_policies(schema: str) -> Plan[list[TenantPolicy]]:
    """Every tenant policy set, by tenant key."""
    rows = yield Query(_sql.statement("list_tenant_policies", schema), row_factory=args_row(TenantPolicy))
    return rows


def queue_position(
    schema: str, *, run_id: uuid.UUID, now: datetime | None, cap: int, min_walk: int
) -> Plan[QueueSpot | None]:
    """Where the run stands in the fair order (walks stop after ``cap`` index entries, each
    other tenant's at least ``min_walk`` deep); None if there is no such run. A plan (see
    :mod:`._exec`)."""
    rows = yield Query(
        _sql.statement("queue_position", schema),
        {"run_id": run_id, "now": now, "cap": cap, "min_walk": min_walk},
    )
    if not rows:
        return None
    status, rank, position, due_in, exact = rows[0]
    return QueueSpot(
        status,
        None if rank is None else int(rank),
        None if position is None else int(position),
        due_in,
        bool(exact),
    )
