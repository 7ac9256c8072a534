"""Schedules across worker processes (#42 point 1): four real worker processes fire one
every-second schedule for many ticks, one of them killed (SIGKILL) on the way, and every
tick is enqueued exactly once, none missed, none doubled."""

from __future__ import annotations

import itertools
import signal
from datetime import datetime, timedelta

import psycopg
import pytest

import runrow

from .helpers import wait_for
from .test_processes import Workers, workers  # noqa: F401  (the fixture)
from .test_schedules import TURN, _keys

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_four_worker_processes_fire_each_tick_once_and_a_kill_loses_none(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    workers: Workers,  # noqa: F811
) -> None:
    await runrow.add_schedule(dsn, "every-second", every=1, overlap="queue", schema=schema, **TURN)
    procs = [workers.start("record_agent", concurrency=2, poll=0.3) for _ in range(4)]

    async def fired(n: int) -> bool:
        [found] = await runrow.list_schedules(dsn, schema=schema)
        return found.fired_ticks >= n

    await wait_for(lambda: fired(4), timeout=30, what="4 ticks fired by 4 processes")
    procs[0].send_signal(signal.SIGKILL)  # a firer dies, perhaps mid-fire: its tick is not lost
    procs[0].wait()
    await wait_for(lambda: fired(10), timeout=40, what="10 ticks fired after the kill")
    for p in procs[1:]:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)

    keys = await _keys(conn, schema)
    [found] = await runrow.list_schedules(dsn, schema=schema)
    assert len(keys) >= 10 and len(keys) == len(set(keys)) == found.fired_ticks
    # Consecutive ticks, one second apart, across the kill: none missed, none doubled.
    stamps = [datetime.fromisoformat(k.split(":", 2)[2]) for k in keys]
    assert all((b - a) == timedelta(seconds=1) for a, b in itertools.pairwise(stamps)), stamps
