"""Usage accounting: the rollup's sums, a run's own usage, and per-tenant budgets."""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg.rows import args_row

from .. import _sql
from .._models import RunUsage, UsageBudget, UsageTotal
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from datetime import datetime


def usage_totals(
    schema: str, *, tenant_key: str | None, since: datetime | None, until: datetime | None
) -> Plan[list[UsageTotal]]:
    """Sums per tenant and agent key over [since, until) in whole hours (one tenant, or all)."""
    rows = yield Query(
        _sql.statement("usage_totals", schema),
        {"tenant_key": tenant_key, "since": since, "until": until},
        args_row(UsageTotal),
    )
    return rows


def run_usage(schema: str, run_id: uuid.UUID) -> Plan[RunUsage]:
    """The sum of one run's journaled usage events."""
    rows = yield Query(_sql.statement("run_usage", schema), {"run_id": run_id}, args_row(RunUsage))
    usage: RunUsage = rows[0]  # (an aggregate: always one row)
    return usage


def set_usage_budget(
    schema: str, *, tenant_id: str | None, tokens: int | None, cost: float | None, period_seconds: int
) -> Plan[None]:
    """Upserts the tenant's budget."""
    yield Query(
        _sql.statement("set_usage_budget", schema),
        {"tenant_id": tenant_id, "tokens": tokens, "cost": cost, "period_seconds": period_seconds},
    )


def usage_budgets(schema: str, *, tenant_key: str | None) -> Plan[list[UsageBudget]]:
    """The budgets set (one tenant's, or all), each with its current period's spending."""
    rows = yield Query(
        _sql.statement("usage_budgets", schema), {"tenant_key": tenant_key}, args_row(UsageBudget)
    )
    return rows


def remove_usage_budget(schema: str, *, tenant_id: str | None) -> Plan[bool]:
    """Deletes the tenant's budget; whether there was one."""
    rows = yield Query(_sql.statement("remove_usage_budget", schema), {"tenant_id": tenant_id})
    return bool(rows)
