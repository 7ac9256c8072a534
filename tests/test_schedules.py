"""Schedules (#42): each tick enqueued exactly once across racing workers, no tick lost
to a fire that dies, the overlap and catch-up policies, DST, pause and resume."""

from __future__ import annotations

import itertools
import sys
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow import _schedule_time
from runrow._db import perform
from runrow._gateway._exec import run
from runrow._schedules import _fire_one, fire_due_op, tick_key

from .helpers import table, wait_for

pytestmark = pytest.mark.anyio

BERLIN = ZoneInfo("Europe/Berlin")
TURN = {"conversation_id": "c-sched", "user_id": "cron", "content": "tick"}


async def _keys(conn: psycopg.AsyncConnection, schema: str) -> list[str]:
    cur = await conn.execute(
        sql.SQL("SELECT idempotency_key FROM {} ORDER BY queue_order").format(table(schema, "agent_run"))
    )
    return [r[0] for r in await cur.fetchall()]


async def _finish_all(conn: psycopg.AsyncConnection, schema: str) -> None:
    """Ends every live run (as if a worker had run them), so overlap=skip sees none live."""
    await conn.execute(
        sql.SQL(
            "UPDATE {} SET status = 'completed', finished_at = now() WHERE status IN ('queued', 'running')"
        ).format(table(schema, "agent_run"))
    )


async def test_four_racing_firers_enqueue_each_tick_once(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    s = await runrow.add_schedule(
        dsn, "race", every=60, overlap="queue", catch_up="all", schema=schema, **TURN
    )
    ticks = [s.next_fire_at + timedelta(seconds=60 * k) for k in range(20)]
    pools = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(4)]
    try:
        for k, tick in enumerate(ticks):
            now = tick + timedelta(seconds=1) if k % 3 else tick + timedelta(seconds=121)  # some late
            async with anyio.create_task_group() as tg:
                for c in pools:
                    tg.start_soon(_fire_all, c, schema, now)
    finally:
        for c in pools:
            await c.close()
    keys = await _keys(conn, schema)
    assert len(keys) == len(set(keys))
    assert keys[: len(ticks)] == [tick_key("race", t) for t in ticks]
    [found] = await runrow.list_schedules(dsn, schema=schema)
    assert found.fired_ticks == len(keys)


async def _fire_all(c: psycopg.AsyncConnection, schema: str, now: datetime) -> None:
    while await perform(c, schema, fire_due_op(schema, now=now)) is not None:
        pass


async def test_four_dispatchers_fire_each_tick_once(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        return None

    await runrow.add_schedule(dsn, "every-second", every=1, overlap="queue", schema=schema, **TURN)
    opts = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "concurrency": 2}
    async with (
        runrow.Dispatcher(dsn, agent, schema=schema, **opts),
        runrow.Dispatcher(dsn, agent, schema=schema, **opts),
        runrow.Dispatcher(dsn, agent, schema=schema, **opts),
        runrow.Dispatcher(dsn, agent, schema=schema, **opts),
    ):
        await wait_for(lambda: _fired(dsn, schema, 4), timeout=30, what="4 ticks fired")
    keys = await _keys(conn, schema)
    assert len(keys) >= 4 and len(keys) == len(set(keys))
    [found] = await runrow.list_schedules(dsn, schema=schema)
    assert found.fired_ticks == len(keys)
    # Consecutive ticks, one second apart: none missed, none doubled.
    stamps = [datetime.fromisoformat(k.split(":", 2)[2]) for k in keys]
    assert all((b - a) == timedelta(seconds=1) for a, b in itertools.pairwise(stamps))


async def _fired(dsn: str, schema: str, n: int) -> bool:
    [found] = await runrow.list_schedules(dsn, schema=schema)
    return found.fired_ticks >= n


async def test_a_fire_killed_mid_transaction_loses_no_tick(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    s = await runrow.add_schedule(dsn, "kill", every=60, schema=schema, **TURN)
    now = s.next_fire_at + timedelta(seconds=1)
    victim = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await victim.execute("BEGIN")
    fired = await run(victim, _fire_one(schema, now))  # the tick enqueued, the row advanced: not committed
    assert fired is not None and len(fired.runs) == 1
    # Meanwhile another worker passes over the locked schedule rather than fire it twice.
    assert await perform(dsn, schema, fire_due_op(schema, now=now)) is None
    await conn.execute("SELECT pg_terminate_backend(%s)", (victim.info.backend_pid,))
    with pytest.raises(psycopg.OperationalError):
        await victim.execute("SELECT 1")
    await victim.close()
    again = await perform(dsn, schema, fire_due_op(schema, now=now))
    assert again is not None and [t for t, _ in again.runs] == [s.next_fire_at]
    assert await _keys(conn, schema) == [tick_key("kill", s.next_fire_at)]


async def test_overlap_skip_skips_while_the_previous_run_is_live(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    s = await runrow.add_schedule(dsn, "skip", every=60, schema=schema, **TURN)
    t0 = s.next_fire_at
    first = await perform(dsn, schema, fire_due_op(schema, now=t0))
    assert first is not None and len(first.runs) == 1
    second = await perform(dsn, schema, fire_due_op(schema, now=t0 + timedelta(seconds=60)))
    assert second is not None and second.runs == [] and second.skipped == [t0 + timedelta(seconds=60)]
    await _finish_all(conn, schema)
    third = await perform(dsn, schema, fire_due_op(schema, now=t0 + timedelta(seconds=120)))
    assert third is not None and len(third.runs) == 1
    [found] = await runrow.list_schedules(dsn, schema=schema)
    assert (found.fired_ticks, found.skipped_ticks) == (2, 1)
    assert found.last_skipped_at == t0 + timedelta(seconds=60)


async def test_overlap_queue_enqueues_behind_the_live_run(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    s = await runrow.add_schedule(dsn, "queue", every=60, overlap="queue", schema=schema, **TURN)
    t0 = s.next_fire_at
    for k in range(3):
        fired = await perform(dsn, schema, fire_due_op(schema, now=t0 + timedelta(seconds=60 * k)))
        assert fired is not None and len(fired.runs) == 1
    assert len(await _keys(conn, schema)) == 3


@pytest.mark.parametrize(("policy", "expected"), [("none", 0), ("last", 1), ("all", 5)])
async def test_catch_up_after_downtime(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, policy: str, expected: int
) -> None:
    s = await runrow.add_schedule(
        dsn,
        "down",
        every=60,
        overlap="queue",
        catch_up=policy,
        catch_up_limit=5,
        schema=schema,
        **TURN,  # type: ignore[arg-type]
    )
    t0 = s.next_fire_at
    # Down for ten ticks (the 11th, t0 + 600 s, is 30 s late).
    now = t0 + timedelta(seconds=630)
    fired = await perform(dsn, schema, fire_due_op(schema, now=now))
    assert fired is not None
    want = [t0 + timedelta(seconds=60 * k) for k in range(11)][11 - expected :] if expected else []
    assert [t for t, _ in fired.runs] == want
    assert fired.next_fire_at == t0 + timedelta(seconds=660)
    assert await perform(dsn, schema, fire_due_op(schema, now=now)) is None
    # catch_up="none" still fires a tick that is on time, once nothing before it was missed.
    on_time = await perform(dsn, schema, fire_due_op(schema, now=t0 + timedelta(seconds=661)))
    assert on_time is not None and [t for t, _ in on_time.runs] == [t0 + timedelta(seconds=660)]


def _berlin(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=BERLIN, fold=fold)  # type: ignore[misc]


def test_dst_march_the_skipped_hour_fires_once_after_it() -> None:
    spec = _schedule_time.check_spec("30 2 * * *", None, "Europe/Berlin")
    first = _schedule_time.next_after(spec, _berlin(2026, 3, 28, 12))
    ticks = _schedule_time.ticks_from(spec, first, 3)
    # 02:30 does not exist on 29 March: that day's tick is 03:00 CEST, once.
    assert [t.astimezone(BERLIN).isoformat() for t in ticks] == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]
    hourly = _schedule_time.check_spec("0 * * * *", None, "Europe/Berlin")
    hours = _schedule_time.ticks_from(
        hourly, _schedule_time.next_after(hourly, _berlin(2026, 3, 29, 0, 30)), 3
    )
    assert [t.astimezone(UTC).hour for t in hours] == [0, 1, 2]  # absolute hours: none doubled


def test_dst_october_the_doubled_hour_fires_once() -> None:
    spec = _schedule_time.check_spec("30 2 * * *", None, "Europe/Berlin")
    ticks = _schedule_time.ticks_from(spec, _schedule_time.next_after(spec, _berlin(2026, 10, 24, 12)), 3)
    assert [t.astimezone(UTC).isoformat() for t in ticks] == [
        "2026-10-25T00:30:00+00:00",  # 02:30 CEST, the first of the two
        "2026-10-26T01:30:00+00:00",
        "2026-10-27T01:30:00+00:00",
    ]
    half = _schedule_time.check_spec("*/30 * * * *", None, "Europe/Berlin")
    run_ = _schedule_time.ticks_from(half, _schedule_time.next_after(half, _berlin(2026, 10, 25, 1, 50)), 6)
    gaps = {b.astimezone(UTC) - a.astimezone(UTC) for a, b in itertools.pairwise(run_)}
    assert gaps == {timedelta(minutes=30)}  # the repeated hour's ticks both fire, 30 min apart
    assert len({tick_key("s", t) for t in run_}) == 6  # and their keys differ (UTC)


async def test_dst_fires_and_next_fires_in_the_schedule_zone(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await runrow.add_schedule(
        dsn, "berlin", cron="30 2 * * *", timezone="Europe/Berlin", schema=schema, **TURN
    )
    # Put the schedule just before the October change, then fire through it.
    spec = _schedule_time.check_spec("30 2 * * *", None, "Europe/Berlin")
    start = _schedule_time.next_after(spec, _berlin(2026, 10, 24, 12))
    await conn.execute(sql.SQL("UPDATE {} SET next_fire_at = %s").format(table(schema, "schedule")), (start,))
    nxt = await runrow.next_fires(dsn, "berlin", 2, schema=schema)
    assert nxt is not None and [t.isoformat() for t in nxt] == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]
    now = _berlin(2026, 10, 25, 2, 59, fold=1)  # in the repeated hour, after both 02:30s
    fired = await perform(dsn, schema, fire_due_op(schema, now=now))
    assert fired is not None and [t for t, _ in fired.runs] == [start]
    assert fired.next_fire_at == _berlin(2026, 10, 26, 2, 30)
    assert await perform(dsn, schema, fire_due_op(schema, now=now)) is None


async def test_pause_and_resume(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    s = await runrow.add_schedule(dsn, "p", every=3600, schema=schema, **TURN)
    paused = await runrow.pause_schedule(dsn, "p", schema=schema)
    assert paused is not None and paused.paused
    assert await perform(dsn, schema, fire_due_op(schema, now=s.next_fire_at + timedelta(hours=5))) is None
    # Resumed after its tick passed (backdated here): it goes on from the next tick after
    # now, in phase, without catching up what the pause held back.
    await conn.execute(
        sql.SQL("UPDATE {} SET next_fire_at = next_fire_at - interval '5 hours'").format(
            table(schema, "schedule")
        )
    )
    resumed = await runrow.resume_schedule(dsn, "p", schema=schema)
    assert resumed is not None and not resumed.paused
    assert resumed.next_fire_at == s.next_fire_at
    assert await perform(dsn, schema, fire_due_op(schema)) is None
    assert await _keys(conn, schema) == []
    assert await runrow.pause_schedule(dsn, "nope", schema=schema) is None
    assert await runrow.remove_schedule(dsn, "p", schema=schema)
    assert not await runrow.remove_schedule(dsn, "p", schema=schema)
    assert await runrow.list_schedules(dsn, schema=schema) == []
    assert await runrow.next_fires(dsn, "p", schema=schema) is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * *"}, "cron"),
        ({"cron": "* * * * *", "every": 5}, "cron"),
        ({}, "cron"),
        ({"every": 0}, "every"),
        ({"every": float("nan")}, "every"),
        ({"every": 60, "timezone": "Mars/Olympus"}, "timezone"),
        ({"every": 60, "overlap": "maybe"}, "overlap"),
        ({"every": 60, "catch_up": "some"}, "catch_up"),
        ({"every": 60, "catch_up_limit": 0}, "catch_up_limit"),
        ({"every": 60, "name": ""}, "name"),
    ],
)
async def test_bad_input_is_refused_naming_the_field(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, kwargs: dict[str, object], field: str
) -> None:
    name = kwargs.pop("name", "bad")
    with pytest.raises(runrow.InvalidInput) as info:
        await runrow.add_schedule(dsn, name, schema=schema, **TURN, **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert await runrow.list_schedules(dsn, schema=schema) == []


async def test_a_name_is_taken_once(dsn: str, schema: str) -> None:
    await runrow.add_schedule(dsn, "dup", every=60, schema=schema, **TURN)
    with pytest.raises(runrow.InvalidInput, match="exists") as info:
        await runrow.add_schedule(dsn, "dup", every=30, schema=schema, **TURN)
    assert info.value.field == "name"


def test_intervals_need_no_cron_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cronsim", None)  # as if runrow[schedules] were not installed
    spec = _schedule_time.check_spec(None, 60, "UTC")
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    assert _schedule_time.due_ticks(spec, t0, t0 + timedelta(seconds=150), "all", 10) == [
        t0,
        t0 + timedelta(seconds=60),
        t0 + timedelta(seconds=120),
    ]
    with pytest.raises(runrow.InvalidInput, match="schedules extra"):
        _schedule_time.check_spec("* * * * *", None, "UTC")


async def test_a_schedule_that_cannot_be_read_does_not_hold_up_the_others(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        return None

    await runrow.add_schedule(dsn, "broken", every=60, schema=schema, **TURN)
    # Its zone became unknown to this host's tzdata (or its cron to this cronsim), and it is
    # due first: the head of every worker's due order.
    await conn.execute(
        sql.SQL("UPDATE {} SET timezone = 'Mars/Olympus', next_fire_at = now() - interval '1 hour'").format(
            table(schema, "schedule")
        )
    )
    await runrow.add_schedule(dsn, "fine", every=1, overlap="queue", schema=schema, **TURN)
    async with runrow.Dispatcher(dsn, agent, schema=schema, poll=0.5, heartbeat=0.2, lease=2.0):
        await wait_for(
            lambda: _named_fired(dsn, schema, "fine"), timeout=20, what="the good schedule to fire"
        )
    broken = next(s for s in await runrow.list_schedules(dsn, schema=schema) if s.name == "broken")
    assert broken.fired_ticks == 0  # left for a worker that can read it, not advanced past


async def _named_fired(dsn: str, schema: str, name: str) -> bool:
    return any(s.name == name and s.fired_ticks >= 1 for s in await runrow.list_schedules(dsn, schema=schema))


async def test_a_tick_whose_key_another_turn_holds_is_skipped_not_stuck(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    s = await runrow.add_schedule(dsn, "held", every=60, overlap="queue", schema=schema, **TURN)
    key = tick_key("held", s.next_fire_at)
    await runrow.enqueue(dsn, schema=schema, idempotency_key=key, **{**TURN, "content": "another turn"})
    fired = await perform(dsn, schema, fire_due_op(schema, now=s.next_fire_at))
    assert fired is not None and fired.runs == [] and fired.skipped == [s.next_fire_at]
    assert fired.next_fire_at == s.next_fire_at + timedelta(seconds=60)
