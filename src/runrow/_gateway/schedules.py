"""Schedules: their rows, and the fire's lock and advance (see ``sql/schedules.sql``).

Every function here is a plan (see :mod:`._exec`), run on an async or a sync connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from psycopg.rows import args_row, class_row

from .. import _sql
from .._models import Schedule
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from datetime import datetime


class NewSchedule(NamedTuple):
    """A schedule to insert, as checked (content and request as JSON text)."""

    name: str
    cron: str | None
    interval_seconds: float | None
    timezone: str
    conversation_id: str
    user_id: str
    tenant_id: str | None
    content: str
    request: str | None
    overlap: str
    catch_up: str
    catch_up_limit: int
    paused: bool
    next_fire_at: datetime


class DueSchedule(NamedTuple):
    """A due schedule, locked by the fire's transaction: the row, whether its last tick's
    run is still live, and the fire's clock."""

    schedule: Schedule
    previous_live: bool
    at: datetime


class Advance(NamedTuple):
    """What a fire did to a schedule, written in the fire's transaction."""

    next_fire_at: datetime
    last_tick_at: datetime | None
    last_run_id: uuid.UUID | None
    fired: int
    skipped: int
    last_skipped_at: datetime | None


def add(schema: str, new: NewSchedule) -> Plan[Schedule | None]:
    """Inserts the schedule; None if its name is taken (nothing written)."""
    rows = yield Query(_sql.statement("add_schedule", schema), new._asdict(), class_row(Schedule))
    return rows[0] if rows else None


def list_all(schema: str) -> Plan[list[Schedule]]:
    """Every schedule, by name."""
    rows = yield Query(_sql.statement("list_schedules", schema), row_factory=class_row(Schedule))
    return rows


def get(schema: str, *, name: str, lock: bool = False) -> Plan[Schedule | None]:
    """The schedule named ``name`` (None: no such schedule); ``lock`` holds its row until
    the caller's transaction ends."""
    text = _sql.statement("lock_schedule", schema) if lock else _sql.statement("get_schedule", schema)
    rows = yield Query(text, {"name": name}, class_row(Schedule))
    return rows[0] if rows else None


def set_paused(schema: str, *, name: str, paused: bool, next_fire_at: datetime) -> Plan[Schedule | None]:
    """Pauses or resumes the schedule, with its next tick; None if there is none."""
    rows = yield Query(
        _sql.statement("set_schedule_paused", schema),
        {"name": name, "paused": paused, "next_fire_at": next_fire_at},
        class_row(Schedule),
    )
    return rows[0] if rows else None


def remove(schema: str, *, name: str) -> Plan[bool]:
    """Deletes the schedule; False if there was none."""
    rows = yield Query(_sql.statement("remove_schedule", schema), {"name": name})
    return bool(rows)


def _due_row(*values: object) -> DueSchedule:
    *fields, previous_live, at = values
    return DueSchedule(Schedule(*fields), bool(previous_live), at)  # type: ignore[arg-type]


def lock_due(schema: str, *, now: datetime | None, passing: list[str]) -> Plan[DueSchedule | None]:
    """In the fire's transaction: one due schedule, locked (SKIP LOCKED: one another
    worker is firing is passed over), other than those named in ``passing``; None when
    none is due."""
    rows = yield Query(
        _sql.statement("due_schedule", schema), {"now": now, "passing": passing}, args_row(_due_row)
    )
    return rows[0] if rows else None


def advance(schema: str, *, name: str, to: Advance) -> Plan[None]:
    """In the fire's transaction: the schedule's next tick and its counts."""
    yield Query(_sql.statement("advance_schedule", schema), {"name": name, **to._asdict()})


def seconds_to_next(schema: str, *, passing: list[str]) -> Plan[float | None]:
    """Seconds until the earliest unpaused schedule not in ``passing`` is due (<= 0:
    due); None: none."""
    rows = yield Query(_sql.statement("next_schedule_due", schema), {"passing": passing})
    return None if not rows or rows[0][0] is None else float(rows[0][0])
