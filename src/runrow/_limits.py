"""Rate limits at the claim: at most N runs started per period under a key.

A run is limited under its keys: ``tenant:<tenant_id>`` (``tenant:`` for the default
tenant), ``agent:<agent_key>`` (runs of a named agent), and the ``limit_key`` its enqueue
gave (e.g. the model provider it calls). The claim (``sql/claims.sql``) passes over runs
under a key whose window is spent or whose gate is shut, so runs under other keys keep
starting, and counts each start in its keys' windows under a row lock, so the limit holds
across any number of workers. With no limit defined the claim reads the table once.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TYPE_CHECKING

from . import _json
from ._db import Database, perform
from ._errors import InvalidInput
from ._gateway import limits as _gw
from ._names import DEFAULT_SCHEMA, check_schema
from ._ops import self_contained

if TYPE_CHECKING:
    from ._models import RateLimit
    from ._ops import Operation

__all__ = ["list_rate_limits", "remove_rate_limit", "set_rate_limit"]

MAX_RUNS = 1_000_000
"""The largest ``runs`` a limit takes."""
MAX_PER_SECONDS = 366 * 86400.0
"""The longest period a limit takes (a leap year)."""
MIN_PER_SECONDS = 0.001
KEY_MAX_LEN = 300


def check_key(key: object) -> str:
    """``key`` as a limit key; :class:`InvalidInput` unless it is non-empty text."""
    _json.check_id(key, "key", max_len=KEY_MAX_LEN)
    assert isinstance(key, str)  # (check_id refused anything else)
    return key


def _check_runs(runs: object) -> int:
    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= MAX_RUNS:
        raise InvalidInput("runs", f"must be an integer between 1 and {MAX_RUNS}")
    return runs


def _check_per(per: object) -> float:
    if isinstance(per, timedelta):
        per = per.total_seconds()
    if isinstance(per, bool) or not isinstance(per, int | float):
        raise InvalidInput("per", "must be a number of seconds or a timedelta")
    seconds = float(per)
    if not math.isfinite(seconds) or not MIN_PER_SECONDS <= seconds <= MAX_PER_SECONDS:
        raise InvalidInput(
            "per", f"must be between {MIN_PER_SECONDS} s and {MAX_PER_SECONDS:.0f} s (366 days)"
        )
    return seconds


async def set_rate_limit(
    db: Database, key: str, *, runs: int, per: float | timedelta, schema: str = DEFAULT_SCHEMA
) -> RateLimit:
    """Lets at most ``runs`` runs under ``key`` start per ``per`` (seconds or a timedelta).

    ``key`` is ``tenant:<tenant_id>``, ``agent:<agent_key>`` or a ``limit_key`` given to
    :func:`runrow.enqueue`. A window opens at the first start after the previous window
    closed; once ``runs`` runs started in it, the claim passes over the key's queued runs
    (taking runs under other keys) until it closes. The limit holds across every worker:
    each claim counts its starts under a lock on the key's row. Setting an existing key's
    limit replaces it and keeps the open window's count. Raises :class:`InvalidInput`
    (nothing written) for an empty key, ``runs`` outside 1..1,000,000 or ``per`` outside
    1 ms..366 days.
    """
    return await perform(db, schema, set_rate_limit_op(key, runs=runs, per=per, schema=schema))


def set_rate_limit_op(key: str, *, runs: int, per: float | timedelta, schema: str) -> Operation[RateLimit]:
    """:func:`set_rate_limit` as an operation (for the async and the sync API)."""
    check_schema(schema)
    checked = check_key(key)
    n = _check_runs(runs)
    seconds = _check_per(per)
    stored: RateLimit = yield self_contained(
        _gw.set_rate_limit(schema, key=checked, runs=n, per_seconds=seconds)
    )
    return stored


async def list_rate_limits(db: Database, *, schema: str = DEFAULT_SCHEMA) -> list[RateLimit]:
    """Every key with a limit or a shut gate, by key, with its open window's count."""
    return await perform(db, schema, list_rate_limits_op(schema=schema))


def list_rate_limits_op(*, schema: str) -> Operation[list[RateLimit]]:
    """:func:`list_rate_limits` as an operation."""
    check_schema(schema)
    found: list[RateLimit] = yield self_contained(_gw.list_rate_limits(schema))
    return found


async def remove_rate_limit(db: Database, key: str, *, schema: str = DEFAULT_SCHEMA) -> bool:
    """Removes ``key``'s limit (its runs start freely from the next claim); False if it had
    none. A gate still shut on the key stays until it opens."""
    return await perform(db, schema, remove_rate_limit_op(key, schema=schema))


def remove_rate_limit_op(key: str, *, schema: str) -> Operation[bool]:
    """:func:`remove_rate_limit` as an operation."""
    check_schema(schema)
    checked = check_key(key)
    removed: bool = yield self_contained(_gw.remove_rate_limit(schema, key=checked))
    return removed
