"""Rate limits and gates (``sql/limits.sql``): what the claim reads and counts."""

from __future__ import annotations

from psycopg.rows import args_row

from .. import _sql
from .._models import RateLimit
from ._exec import Plan, Query


def set_rate_limit(schema: str, *, key: str, runs: int, per_seconds: float) -> Plan[RateLimit]:
    """Upserts the key's limit and returns it as stored."""
    rows = yield Query(
        _sql.statement("set_rate_limit", schema),
        {"key": key, "runs": runs, "per_seconds": per_seconds},
        args_row(RateLimit),
    )
    limit: RateLimit = rows[0]  # (an upsert always returns its row)
    return limit


def list_rate_limits(schema: str) -> Plan[list[RateLimit]]:
    """Every key with a limit or a gate, by key."""
    rows = yield Query(_sql.statement("list_rate_limits", schema), row_factory=args_row(RateLimit))
    return rows


def remove_rate_limit(schema: str, *, key: str) -> Plan[bool]:
    """Removes the key's limit; False if it had none."""
    rows = yield Query(_sql.statement("remove_rate_limit", schema), {"key": key})
    return bool(rows)
