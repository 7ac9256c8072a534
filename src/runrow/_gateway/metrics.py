"""The Prometheus collector's read (runrow.metrics): live runs per tenant, server-bounded."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .. import _sql
from ._exec import Plan, Query

if TYPE_CHECKING:
    from .._status import RunStatus


class TenantDepth(NamedTuple):
    """Live runs of one tenant ('' for none) in one status, and the oldest one's age."""

    tenant: str
    status: RunStatus
    runs: int
    oldest_seconds: float


def bound_statement_timeout(schema: str, *, timeout_ms: str) -> Plan[None]:
    """Sets ``statement_timeout`` for the rest of the caller's transaction only."""
    yield Query(_sql.statement("metrics_statement_timeout", schema), {"timeout_ms": timeout_ms})


def queue_depth_by_tenant(schema: str) -> Plan[list[TenantDepth]]:
    """Queued and running runs per tenant and status, with the oldest one's age in seconds."""
    rows = yield Query(_sql.statement("queue_depth_by_tenant", schema))
    return [TenantDepth(tenant, status, int(runs), float(oldest)) for tenant, status, runs, oldest in rows]
