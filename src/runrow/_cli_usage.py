"""``runrow stats``: queue depth, outcomes and, over a period, usage per tenant and agent key
with each tenant's budget (docs/howto/usage.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ._cli_support import database_url, jsonable, out

if TYPE_CHECKING:
    import argparse

__all__ = ["add_stats_parser", "cmd_stats"]


def add_stats_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """The ``stats`` command, under ``sub``."""
    s = sub.add_parser("stats", parents=[common], help="queue depth, running, outcomes, usage")
    s.add_argument(
        "--usage-hours",
        type=float,
        default=24.0,
        help="sum usage over the last N hours, in whole UTC hours (default: %(default)s)",
    )
    s.add_argument(
        "--tenant",
        default=None,
        help="only this tenant's usage ('' for the default tenant; default: every tenant)",
    )


async def cmd_stats(args: argparse.Namespace) -> int:
    from ._db import perform
    from ._queries import queue_stats
    from ._usage import usage_budgets_op, usage_totals

    url = database_url(args)
    s = await queue_stats(url, schema=args.schema)
    hours = args.usage_hours
    if not 0 < hours <= 24 * 366 * 10:
        raise SystemExit("runrow stats: --usage-hours must be above 0 and at most ten years")
    since = datetime.now(UTC) - timedelta(hours=hours)
    totals = await usage_totals(url, tenant=args.tenant, since=since, schema=args.schema)
    budgets = await perform(url, args.schema, usage_budgets_op(schema=args.schema))
    oldest = "-" if s.oldest_queued_seconds is None else f"{s.oldest_queued_seconds:.1f}s"
    lines = [f"queued {s.queued}  running {s.running}  oldest queued {oldest}"]
    lines += [f"  {k:<9} {v}" for k, v in sorted(s.by_status.items())]
    lines.append(
        f"usage since {since:%Y-%m-%d %H:00} UTC (tenant / agent: input, output tokens, cost, records)"
    )
    lines += [
        f"  {_name(t.tenant_id)} / {_name(t.agent_key)}: {t.input_tokens} in, {t.output_tokens} out, "
        f"cost {t.cost:g}, {t.records} records"
        for t in totals
    ] or ["  none recorded"]
    for b in budgets:
        limit = ", ".join(
            x for x in (_of(b.spent_tokens, b.tokens, "tokens"), _of(b.spent_cost, b.cost, "cost")) if x
        )
        state = "SPENT" if b.spent else "ok"
        lines.append(f"budget {_name(b.tenant_id)} per {b.period_seconds}s: {limit} ({state})")
    data: dict[str, Any] = {
        "by_status": s.by_status,
        "oldest_queued_seconds": s.oldest_queued_seconds,
        "usage_since": since.isoformat(),
        "usage": jsonable(totals),
        "budgets": jsonable(budgets),
    }
    out(args, data, "\n".join(lines))
    return 0


def _name(key: str | None) -> str:
    return "(default)" if key is None else key


def _of(spent: float, limit: float | None, what: str) -> str:
    return "" if limit is None else f"{spent:g} of {limit:g} {what}"
