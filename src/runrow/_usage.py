"""Usage accounting: what runs recorded (``RunContext.record_usage``), summed per tenant and
agent key, and optional per-tenant budgets that enqueue enforces.

Where the sums come from: each ``usage`` event is added to ``usage_rollup`` (one row per
tenant, agent key and UTC hour) by the statement that journals it, so a sum over a
period reads a few rollup rows, never the journal, and survives journal retention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _json
from ._db import Database, perform
from ._errors import InvalidInput
from ._gateway import usage as _gw
from ._json import parse_run_id
from ._names import DEFAULT_SCHEMA, check_schema
from ._ops import in_transaction, self_contained
from ._usage_check import (
    MAX_BUDGET_COST,
    MAX_BUDGET_TOKENS,
    check_cost,
    check_time,
    check_tokens,
    period_seconds,
)

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

    from ._gateway._exec import Plan
    from ._models import RunUsage, UsageBudget, UsageTotal
    from ._ops import Operation

__all__ = [
    "get_usage_budget",
    "get_usage_budget_op",
    "remove_usage_budget",
    "remove_usage_budget_op",
    "run_usage",
    "run_usage_op",
    "set_usage_budget",
    "set_usage_budget_op",
    "usage_budgets_op",
    "usage_totals",
    "usage_totals_op",
]


async def usage_totals(
    db: Database,
    *,
    tenant: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[UsageTotal]:
    """Usage summed per tenant and agent key over ``[since, until)`` (None: unbounded),
    for every tenant, or for one: ``tenant`` is its id, ``""`` the default tenant.

    The sums are kept per UTC hour: ``since`` and ``until`` are taken down to their hour.
    They count every ``usage`` event journaled so far, from runs ended or still running.
    """
    return await perform(db, schema, usage_totals_op(tenant=tenant, since=since, until=until, schema=schema))


def usage_totals_op(
    *, tenant: str | None, since: datetime | None, until: datetime | None, schema: str
) -> Operation[list[UsageTotal]]:
    """:func:`usage_totals` as an operation."""
    check_schema(schema)
    key = None if tenant is None else "" if tenant == "" else _tenant_key(tenant)
    check_time(since, "since")
    check_time(until, "until")
    found: list[UsageTotal] = yield self_contained(
        _gw.usage_totals(schema, tenant_key=key, since=since, until=until)
    )
    return found


async def run_usage(db: Database, run_id: uuid.UUID | str, *, schema: str = DEFAULT_SCHEMA) -> RunUsage:
    """One run's usage: the sum of the ``usage`` events in its journal (zero for a run
    that recorded none, for an unknown id, and once retention trimmed its journal)."""
    return await perform(db, schema, run_usage_op(run_id, schema=schema))


def run_usage_op(run_id: uuid.UUID | str, *, schema: str) -> Operation[RunUsage]:
    """:func:`run_usage` as an operation."""
    check_schema(schema)
    rid = parse_run_id(run_id)
    found: RunUsage = yield self_contained(_gw.run_usage(schema, rid))
    return found


async def set_usage_budget(
    db: Database,
    tenant_id: str | None,
    *,
    tokens: int | None = None,
    cost: float | None = None,
    per: str | int = "day",
    schema: str = DEFAULT_SCHEMA,
) -> UsageBudget:
    """Sets the tenant's usage budget per period (``tenant_id=None``: the default tenant).

    ``tokens`` limits input plus output tokens, ``cost`` the cost (at least one of them);
    ``per`` is ``"day"`` (the UTC day), ``"hour"``, or seconds that are a whole number of
    hours (windows aligned to the Unix epoch). Once the usage recorded in the current
    period reaches a limit, :func:`runrow.enqueue` for the tenant raises
    :class:`runrow.Overloaded` with ``reason="usage_budget"`` until the next period.

    Precision: the check runs in the enqueue's own statement against the usage recorded
    so far. Runs already queued or running are not stopped, and usage reaches the
    rollup when a run's journal is next written, so a tenant can overspend by what its
    admitted runs go on to record. Replaces a budget set before; returns it as stored.
    """
    return await perform(
        db, schema, set_usage_budget_op(tenant_id, tokens=tokens, cost=cost, per=per, schema=schema)
    )


def set_usage_budget_op(
    tenant_id: str | None, *, tokens: int | None, cost: float | None, per: str | int, schema: str
) -> Operation[UsageBudget]:
    """:func:`set_usage_budget` as an operation."""
    check_schema(schema)
    _json.check_id(tenant_id, "tenant_id", optional=True)
    if tokens is None and cost is None:
        raise InvalidInput("tokens", "a budget needs tokens=, cost= or both")
    if tokens is not None:
        check_tokens(tokens, "tokens", limit=MAX_BUDGET_TOKENS)
    number = None if cost is None else check_cost(cost, "cost", limit=MAX_BUDGET_COST)
    seconds = period_seconds(per)
    found: UsageBudget | None = yield in_transaction(_set(schema, tenant_id, tokens, number, seconds))
    assert found is not None  # (just written, in the same transaction)
    return found


def _set(
    schema: str, tenant_id: str | None, tokens: int | None, cost: float | None, seconds: int
) -> Plan[UsageBudget | None]:
    yield from _gw.set_usage_budget(
        schema, tenant_id=tenant_id, tokens=tokens, cost=cost, period_seconds=seconds
    )
    found = yield from _gw.usage_budgets(schema, tenant_key=tenant_id or "")
    return found[0] if found else None


async def get_usage_budget(
    db: Database, tenant_id: str | None, *, schema: str = DEFAULT_SCHEMA
) -> UsageBudget | None:
    """The tenant's usage budget with what it has spent in the current period; None if
    it has none."""
    return await perform(db, schema, get_usage_budget_op(tenant_id, schema=schema))


def get_usage_budget_op(tenant_id: str | None, *, schema: str) -> Operation[UsageBudget | None]:
    """:func:`get_usage_budget` as an operation."""
    check_schema(schema)
    found: list[UsageBudget] = yield self_contained(
        _gw.usage_budgets(schema, tenant_key=_tenant_key(tenant_id))
    )
    return found[0] if found else None


def usage_budgets_op(*, schema: str) -> Operation[list[UsageBudget]]:
    """Every budget set, with its current period's spending (the CLI's and dashboard's list)."""
    check_schema(schema)
    found: list[UsageBudget] = yield self_contained(_gw.usage_budgets(schema, tenant_key=None))
    return found


async def remove_usage_budget(db: Database, tenant_id: str | None, *, schema: str = DEFAULT_SCHEMA) -> bool:
    """Removes the tenant's usage budget (its usage stays counted); False if it had none."""
    return await perform(db, schema, remove_usage_budget_op(tenant_id, schema=schema))


def remove_usage_budget_op(tenant_id: str | None, *, schema: str) -> Operation[bool]:
    """:func:`remove_usage_budget` as an operation."""
    check_schema(schema)
    _json.check_id(tenant_id, "tenant_id", optional=True)
    found: bool = yield self_contained(_gw.remove_usage_budget(schema, tenant_id=tenant_id))
    return found


def _tenant_key(tenant_id: object) -> str:
    _json.check_id(tenant_id, "tenant_id", optional=True)
    return "" if tenant_id is None else str(tenant_id)
