"""When a schedule's ticks fall: cron expressions (by ``cronsim``) in the schedule's time
zone, or a fixed interval, and which due ticks a fire enqueues under its catch-up policy.

Pure functions of the schedule's spec and a clock: the API (``next_fires``, a resume)
and the worker's fire share them, and tests drive them with any ``now``.

Cron is read as Debian's cron reads it (cronsim's semantics): an expression for a fixed
time of day whose time falls in the hour a spring-forward skips fires once, at the first
valid moment after it (02:30 on the March change in Europe/Berlin fires at 03:00); in
the hour an autumn change repeats, it fires once, at the first occurrence. Expressions
that fire every minute or hour (``*`` in the minute or hour field) follow absolute time:
the repeated hour has its ticks twice and the skipped hour has none.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ._errors import InvalidInput

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["CatchUp", "Overlap", "Spec", "check_spec", "due_ticks", "next_after", "ticks_from"]

Overlap = Literal["skip", "queue"]
CatchUp = Literal["none", "last", "all"]

ON_TIME_SECONDS = 60.0
"""With ``catch_up="none"``, a tick fired at most this late is on time, not missed."""

MAX_INTERVAL_SECONDS = 366 * 86400.0


class Spec:
    """When a schedule fires: ``cron`` in ``timezone``, or every ``interval`` seconds."""

    __slots__ = ("cron", "interval", "zone")

    def __init__(self, cron: str | None, interval: float | None, timezone: str) -> None:
        self.cron = cron
        self.interval = interval
        self.zone = ZoneInfo(timezone)

    def _sim(self, start: datetime, *, reverse: bool = False) -> Iterator[datetime]:
        from cronsim import CronSim  # an optional extra: runrow[schedules]

        assert self.cron is not None
        return CronSim(self.cron, start.astimezone(self.zone), reverse=reverse)


def _cronsim() -> Any:
    try:
        import cronsim
    except ImportError:  # pragma: no cover - the extra is installed in the tests
        raise InvalidInput(
            "cron", "cron expressions need the schedules extra: pip install 'runrow[schedules]'"
        ) from None
    return cronsim


def check_spec(cron: str | None, interval: float | None, timezone: str) -> Spec:
    """The spec, checked; raises :class:`InvalidInput` naming the field."""
    if not isinstance(timezone, str) or not timezone:
        raise InvalidInput("timezone", "must be an IANA time zone name, e.g. 'Europe/Berlin'")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput("timezone", f"unknown time zone {timezone!r}") from None
    if (cron is None) == (interval is None):
        raise InvalidInput("cron", "give exactly one of cron and every")
    if cron is not None:
        if not isinstance(cron, str) or not 1 <= len(cron) <= 200:
            raise InvalidInput("cron", "must be a cron expression")
        cronsim = _cronsim()
        try:
            cronsim.CronSim(cron, datetime.now(UTC))
        except cronsim.CronSimError as exc:
            raise InvalidInput("cron", f"invalid cron expression {cron!r}: {exc}") from None
    elif isinstance(interval, bool) or not isinstance(interval, int | float) or not math.isfinite(interval):
        raise InvalidInput("every", "must be a number of seconds or a timedelta")
    elif not 1 <= interval <= MAX_INTERVAL_SECONDS:
        raise InvalidInput("every", "must be between 1 second and 366 days")
    return Spec(cron, None if interval is None else float(interval), timezone)


def next_after(spec: Spec, after: datetime, *, anchor: datetime | None = None) -> datetime:
    """The first tick strictly after ``after`` (an interval counts from ``anchor``, a past
    tick, so its ticks keep their phase; without one, from ``after``), in UTC."""
    # In UTC: Python adds to an aware datetime in its own zone by wall clock, which a
    # DST change would bend (the session's zone, for a datetime read from the server).
    after = after.astimezone(UTC)
    anchor = None if anchor is None else anchor.astimezone(UTC)
    if spec.interval is None:
        return next(spec._sim(after)).astimezone(UTC)
    if anchor is None or anchor > after:
        return after + timedelta(seconds=spec.interval) if anchor is None else anchor
    steps = math.floor((after - anchor).total_seconds() / spec.interval) + 1
    return anchor + timedelta(seconds=steps * spec.interval)


def ticks_from(spec: Spec, first: datetime, n: int) -> list[datetime]:
    """``n`` ticks from ``first`` (itself a tick), in order."""
    found = [first]
    while len(found) < n:
        found.append(next_after(spec, found[-1], anchor=found[-1]))
    return found


def due_ticks(spec: Spec, first: datetime, now: datetime, catch_up: CatchUp, limit: int) -> list[datetime]:
    """Which due ticks (from ``first``, the schedule's next_fire_at, up to ``now``) a fire
    enqueues, oldest first: ``all`` the latest ``limit`` of them, ``last`` the latest,
    ``none`` the one due tick only if no tick before it was missed and it is on time
    (within :data:`ON_TIME_SECONDS`)."""
    first, now = first.astimezone(UTC), now.astimezone(UTC)  # (see next_after)
    if first > now:
        return []
    want = limit if catch_up == "all" else 2 if catch_up == "none" else 1
    latest: list[datetime] = []
    if spec.interval is None:
        # Backwards from now (cronsim: a start with microseconds is itself a candidate).
        for tick in spec._sim(now.replace(microsecond=1), reverse=True):
            if tick < first or len(latest) == want:
                break
            latest.append(tick.astimezone(UTC))
        latest.reverse()
    else:
        count = math.floor((now - first).total_seconds() / spec.interval) + 1
        step = timedelta(seconds=spec.interval)
        latest = [first + k * step for k in range(max(0, count - want), count)]
    if catch_up == "none" and (len(latest) > 1 or (now - latest[-1]).total_seconds() > ON_TIME_SECONDS):
        return []
    return latest
