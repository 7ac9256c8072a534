"""Checks of usage figures (``RunContext.record_usage``) and usage budgets, before anything is written."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from . import _json
from ._errors import InvalidInput

__all__ = [
    "MAX_COST",
    "MAX_TOKENS",
    "check_cost",
    "check_time",
    "check_tokens",
    "period_seconds",
    "usage_payload",
]

# One record_usage call reports one model call (or a few): a billion tokens or a million
# in cost is a bug (a unit mix-up, a running total passed as an increment), not usage.
MAX_TOKENS = 1_000_000_000
MAX_COST = 1_000_000.0
# A budget is larger than one call, but still bounded: the rollup sums in bigint/numeric.
MAX_BUDGET_TOKENS = 10**15
MAX_BUDGET_COST = 10.0**12
_PERIODS = {"day": 86400, "hour": 3600}
MAX_PERIOD_SECONDS = 366 * 86400


def check_tokens(value: object, field: str, *, limit: int = MAX_TOKENS) -> int:
    """A token count: an integer from 0 to ``limit``; InvalidInput naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(field, f"must be an integer, got {type(value).__name__}")
    if not 0 <= value <= limit:
        raise InvalidInput(field, f"must be between 0 and {limit}, got {value}")
    return value


def check_cost(value: object, field: str = "cost", *, limit: float = MAX_COST) -> float:
    """A cost: a finite number from 0 to ``limit`` (any currency unit, the host's choice)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(field, f"must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidInput(field, f"must be finite, got {value!r}")
    if not 0 <= number <= limit:
        raise InvalidInput(field, f"must be between 0 and {limit:g}, got {value!r}")
    return number


def usage_payload(input_tokens: object, output_tokens: object, cost: object) -> str:
    """The ``usage`` event's payload JSON, or InvalidInput naming the first bad field."""
    payload: dict[str, Any] = {
        "input_tokens": check_tokens(input_tokens, "input_tokens"),
        "output_tokens": check_tokens(output_tokens, "output_tokens"),
        "cost": check_cost(cost),
    }
    return _json.dumps(payload, "usage")


def period_seconds(per: object) -> int:
    """A budget's period: ``"day"`` (the UTC day), ``"hour"``, or whole seconds that are a
    whole number of hours (the rollup's grain), windows aligned to the Unix epoch."""
    if isinstance(per, str):
        if per not in _PERIODS:
            raise InvalidInput("per", f"must be 'day', 'hour' or a number of seconds, got {per!r}")
        return _PERIODS[per]
    if isinstance(per, bool) or not isinstance(per, int):
        raise InvalidInput("per", f"must be 'day', 'hour' or an integer number of seconds, got {per!r}")
    if not 3600 <= per <= MAX_PERIOD_SECONDS or per % 3600:
        raise InvalidInput("per", f"must be a whole number of hours, 1 to 366 days, in seconds; got {per}")
    return per


def check_time(value: object, field: str) -> None:
    """A period bound: None or a timezone-aware datetime."""
    if value is None:
        return
    if not isinstance(value, datetime):
        raise InvalidInput(field, f"must be a datetime or None, got {type(value).__name__}")
    if value.tzinfo is None:
        raise InvalidInput(field, "a datetime must be timezone-aware")
