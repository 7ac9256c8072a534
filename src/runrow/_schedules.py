"""Schedules (#42): turns enqueued on a cron expression or an interval, fired by any
worker, each tick exactly once.

A schedule is a row (``schedule``, migration 11). Every :class:`runrow.Dispatcher` fires
due schedules (``_engine/schedules.py``) with :func:`fire_due_op`: one transaction locks
one due schedule (``FOR UPDATE SKIP LOCKED``: a schedule another worker is firing is
passed over), enqueues its due ticks with the idempotency key
``schedule:<name>:<tick, UTC ISO 8601>`` and advances ``next_fire_at``, and commits. So
a tick is enqueued once however many workers race, and a worker that dies mid-fire
rolls the whole fire back: the next worker fires the same ticks.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from . import _json
from ._db import Database, perform
from ._enqueue import enqueue_in
from ._enqueue_options import DEFAULT_MAX_CONTENT_BYTES, EnqueueOptions
from ._errors import IdempotencyConflict, InvalidInput
from ._gateway import schedules as _gw
from ._names import DEFAULT_SCHEMA, check_schema
from ._ops import in_transaction, self_contained
from ._schedule_time import CatchUp, Overlap, Spec, check_spec, due_ticks, next_after, ticks_from
from ._status import LIVE

if TYPE_CHECKING:
    import uuid
    from collections.abc import Collection

    from ._gateway._exec import Plan
    from ._models import Schedule
    from ._ops import Operation

__all__ = [
    "Fired",
    "add_schedule",
    "add_schedule_op",
    "fire_due_op",
    "list_schedules",
    "list_schedules_op",
    "next_fires",
    "next_fires_op",
    "pause_schedule",
    "remove_schedule",
    "remove_schedule_op",
    "resume_schedule",
    "set_paused_op",
]

MAX_NEXT_FIRES = 1000


class Fired(NamedTuple):
    """What one fire did: the schedule, the runs its ticks enqueued (tick, run id), the
    ticks its overlap policy skipped, and its next tick. ``unreadable``: why this process
    could not read the schedule (an unknown zone, a cron expression its cronsim refuses);
    then nothing was written and the schedule is left for another process."""

    name: str
    runs: list[tuple[datetime, uuid.UUID]]
    skipped: list[datetime]
    next_fire_at: datetime
    unreadable: str | None = None


def tick_key(name: str, tick: datetime) -> str:
    """The idempotency key of a schedule's tick (UTC: unambiguous in a repeated hour)."""
    return f"schedule:{name}:{tick.astimezone(UTC).isoformat()}"


def _now() -> datetime:
    return datetime.now(UTC)


async def add_schedule(
    db: Database,
    name: str,
    *,
    conversation_id: str,
    user_id: str,
    content: Any,
    cron: str | None = None,
    every: float | timedelta | None = None,
    timezone: str = "UTC",
    tenant_id: str | None = None,
    request: Any = None,
    overlap: Overlap = "skip",
    catch_up: CatchUp = "last",
    catch_up_limit: int = 100,
    paused: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> Schedule:
    """Adds a schedule: a turn (``conversation_id``, ``user_id``, ``content``, optional
    ``request`` and ``tenant_id``) enqueued at each tick of ``cron`` (a cron expression,
    read in ``timezone``, an IANA name; needs ``runrow[schedules]``) or ``every`` (seconds
    or a timedelta, counted from now), by whichever worker gets there first.

    ``overlap="skip"`` (default) skips a tick while the previous tick's run is live
    (counted in ``skipped_ticks``); ``"queue"`` enqueues it behind that run.
    ``catch_up`` decides what a fire after downtime enqueues: ``"last"`` (default) the
    latest missed tick, ``"all"`` each (the latest ``catch_up_limit``), ``"none"`` only
    a tick that is on time (within a minute). Raises :class:`InvalidInput` naming the
    field (an invalid cron expression, an unknown zone, a name taken), writing nothing.
    """
    op = add_schedule_op(
        name,
        conversation_id=conversation_id,
        user_id=user_id,
        content=content,
        cron=cron,
        every=every,
        timezone=timezone,
        tenant_id=tenant_id,
        request=request,
        overlap=overlap,
        catch_up=catch_up,
        catch_up_limit=catch_up_limit,
        paused=paused,
        schema=schema,
    )
    return await perform(db, schema, op)


def add_schedule_op(
    name: str,
    *,
    conversation_id: str,
    user_id: str,
    content: Any,
    cron: str | None,
    every: float | timedelta | None,
    timezone: str,
    tenant_id: str | None,
    request: Any,
    overlap: Overlap,
    catch_up: CatchUp,
    catch_up_limit: int,
    paused: bool,
    schema: str,
) -> Operation[Schedule]:
    """:func:`add_schedule` as an operation (see ``_ops.py``)."""
    check_schema(schema)
    _check_name(name)
    for field, value in (("conversation_id", conversation_id), ("user_id", user_id)):
        _json.check_id(value, field)
    _json.check_id(tenant_id, "tenant_id", optional=True)
    if overlap not in ("skip", "queue"):
        raise InvalidInput("overlap", "must be 'skip' or 'queue'")
    if catch_up not in ("none", "last", "all"):
        raise InvalidInput("catch_up", "must be 'none', 'last' or 'all'")
    if (
        isinstance(catch_up_limit, bool)
        or not isinstance(catch_up_limit, int)
        or not 1 <= catch_up_limit <= 10000
    ):
        raise InvalidInput("catch_up_limit", "must be an integer from 1 to 10000")
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    spec = check_spec(cron, seconds, timezone)
    new = _gw.NewSchedule(
        name=name,
        cron=cron,
        interval_seconds=spec.interval,
        timezone=timezone,
        conversation_id=conversation_id,
        user_id=user_id,
        tenant_id=tenant_id,
        content=_json.dumps(content, "content", DEFAULT_MAX_CONTENT_BYTES),
        request=None if request is None else _json.dumps(request, "request", DEFAULT_MAX_CONTENT_BYTES),
        overlap=overlap,
        catch_up=catch_up,
        catch_up_limit=catch_up_limit,
        paused=bool(paused),
        next_fire_at=next_after(spec, _now().replace(microsecond=0)),  # (whole seconds: readable keys)
    )
    added: Schedule | None = yield self_contained(_gw.add(schema, new))
    if added is None:
        raise InvalidInput("name", f"a schedule named {name!r} exists")
    return added


def _check_name(name: object) -> None:
    _json.check_id(name, "name", max_len=100)


async def list_schedules(db: Database, *, schema: str = DEFAULT_SCHEMA) -> list[Schedule]:
    """Every schedule, by name, with its next tick and what its fires have done."""
    return await perform(db, schema, list_schedules_op(schema=schema))


def list_schedules_op(*, schema: str) -> Operation[list[Schedule]]:
    """:func:`list_schedules` as an operation."""
    check_schema(schema)
    found: list[Schedule] = yield self_contained(_gw.list_all(schema))
    return found


async def pause_schedule(db: Database, name: str, *, schema: str = DEFAULT_SCHEMA) -> Schedule | None:
    """Pauses the schedule: no worker fires it until it is resumed. None if there is none."""
    return await perform(db, schema, set_paused_op(name, paused=True, schema=schema))


async def resume_schedule(db: Database, name: str, *, schema: str = DEFAULT_SCHEMA) -> Schedule | None:
    """Resumes a paused schedule from its next tick after now: the ticks it missed while
    paused are not caught up (a pause is not downtime). None if there is none."""
    return await perform(db, schema, set_paused_op(name, paused=False, schema=schema))


def set_paused_op(name: str, *, paused: bool, schema: str) -> Operation[Schedule | None]:
    """:func:`pause_schedule` and :func:`resume_schedule` as one operation."""
    check_schema(schema)
    _check_name(name)
    found: Schedule | None = yield in_transaction(_set_paused(schema, name, paused))
    return found


def _set_paused(schema: str, name: str, paused: bool) -> Plan[Schedule | None]:
    found = yield from _gw.get(schema, name=name, lock=True)
    if found is None:
        return None
    if found.paused == paused:
        return found
    next_fire_at = found.next_fire_at
    if not paused and next_fire_at <= _now():
        next_fire_at = next_after(_spec(found), _now(), anchor=found.next_fire_at)
    return (yield from _gw.set_paused(schema, name=name, paused=paused, next_fire_at=next_fire_at))


async def remove_schedule(db: Database, name: str, *, schema: str = DEFAULT_SCHEMA) -> bool:
    """Deletes the schedule (the runs it enqueued stay); False if there was none."""
    return await perform(db, schema, remove_schedule_op(name, schema=schema))


def remove_schedule_op(name: str, *, schema: str) -> Operation[bool]:
    """:func:`remove_schedule` as an operation."""
    check_schema(schema)
    _check_name(name)
    found: bool = yield self_contained(_gw.remove(schema, name=name))
    return found


async def next_fires(
    db: Database, name: str, n: int = 5, *, schema: str = DEFAULT_SCHEMA
) -> list[datetime] | None:
    """The schedule's next ``n`` ticks from its ``next_fire_at`` (as aware datetimes in its
    time zone), paused or not; None if there is no such schedule."""
    return await perform(db, schema, next_fires_op(name, n, schema=schema))


def next_fires_op(name: str, n: int, *, schema: str) -> Operation[list[datetime] | None]:
    """:func:`next_fires` as an operation."""
    check_schema(schema)
    _check_name(name)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NEXT_FIRES:
        raise InvalidInput("n", f"must be an integer from 1 to {MAX_NEXT_FIRES}")
    found: Schedule | None = yield self_contained(_gw.get(schema, name=name))
    if found is None:
        return None
    spec = _spec(found)
    return [t.astimezone(spec.zone) for t in ticks_from(spec, found.next_fire_at, n)]


def _spec(s: Schedule) -> Spec:
    return check_spec(s.cron, s.interval_seconds, s.timezone)


def fire_due_op(
    schema: str, *, now: datetime | None = None, passing: Collection[str] = ()
) -> Operation[Fired | None]:
    """Fires one due schedule in one transaction (see the module's docstring); None when
    none is due (or every due one is being fired by another worker). ``now``: the fire's
    clock (default: the database's), which tests set to simulate downtime. ``passing``:
    schedules to pass over (those this process found unreadable in this pass, so one
    cannot hold up the rest)."""
    fired: Fired | None = yield in_transaction(_fire_one(schema, now, sorted(passing)))
    return fired


def _fire_one(schema: str, now: datetime | None, passing: list[str] | None = None) -> Plan[Fired | None]:
    due = yield from _gw.lock_due(schema, now=now, passing=passing or [])
    if due is None:
        return None
    s, at, live = due.schedule, due.at, due.previous_live
    try:
        spec = _spec(s)
    except InvalidInput as exc:  # written by a host with other tzdata or another cronsim
        return Fired(s.name, [], [], s.next_fire_at, unreadable=str(exc))
    catch_up: CatchUp = "all" if s.catch_up == "all" else "none" if s.catch_up == "none" else "last"
    runs: list[tuple[datetime, uuid.UUID]] = []
    skipped: list[datetime] = []
    for tick in due_ticks(spec, s.next_fire_at, at, catch_up, s.catch_up_limit):
        if s.overlap == "skip" and live:
            skipped.append(tick)
            continue
        try:
            run = yield from enqueue_in(_tick_options(schema, s, tick))
        except IdempotencyConflict:  # the key names another turn (a host enqueued with it):
            skipped.append(tick)  # skipped, not retried forever at the head of the due order
            continue
        runs.append((tick, run.id))
        live = run.status in LIVE
    advance = _gw.Advance(
        next_fire_at=next_after(spec, at, anchor=s.next_fire_at),
        last_tick_at=runs[-1][0] if runs else None,
        last_run_id=runs[-1][1] if runs else None,
        fired=len(runs),
        skipped=len(skipped),
        last_skipped_at=skipped[-1] if skipped else None,
    )
    yield from _gw.advance(schema, name=s.name, to=advance)
    return Fired(s.name, runs, skipped, advance.next_fire_at)


def _tick_options(schema: str, s: Schedule, tick: datetime) -> EnqueueOptions:
    return EnqueueOptions.checked(
        conversation_id=s.conversation_id,
        user_id=s.user_id,
        content=s.content,
        tenant_id=s.tenant_id,
        idempotency_key=tick_key(s.name, tick),
        request=s.request,
        priority=0,
        not_before=None,
        deadline=None,
        on_busy="enqueue",
        max_queued_per_tenant=None,
        max_queued_per_conversation=None,
        schema=schema,
        max_content_bytes=DEFAULT_MAX_CONTENT_BYTES,
    )
