"""The Prometheus collector's read (runrow.metrics): live runs per tenant, server-bounded."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .. import _sql
from ._exec import execute

if TYPE_CHECKING:
    from psycopg import AsyncConnection


class TenantDepth(NamedTuple):
    """Live runs of one tenant ('' for none) in one status, and the oldest one's age."""

    tenant: str
    status: str
    runs: int
    oldest_seconds: float


async def bound_statement_timeout(conn: AsyncConnection, schema: str, *, timeout_ms: str) -> None:
    """Sets ``statement_timeout`` for the rest of the caller's transaction only."""
    await execute(conn, _sql.statement("metrics_statement_timeout", schema), {"timeout_ms": timeout_ms})


async def queue_depth_by_tenant(conn: AsyncConnection, schema: str) -> list[TenantDepth]:
    """Queued and running runs per tenant and status, with the oldest one's age in seconds."""
    cur = await execute(conn, _sql.statement("queue_depth_by_tenant", schema))
    return [
        TenantDepth(tenant, status, int(runs), float(oldest))
        for tenant, status, runs, oldest in await cur.fetchall()
    ]
