"""fanout: 1,000 concurrent tails of live runs in this process, over one pool and one NotifyHub.

The runs live in a child worker. This process only tails: its connections carry an
application_name, so pg_stat_activity (sampled from a separate monitor connection)
tells pool connections and the hub's LISTEN connection apart.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import psycopg
from lib import Bench, Row, child, pct, ratio
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

import runrow
from runrow._gateway import statement_text

POOL_SIZE = 10


async def fanout(b: Bench) -> list[Row]:
    p = b.profile
    n = p.fanout_tails
    got_ready = 0
    got_ping = 0
    ended = 0
    lat: list[float] = []
    bare: list[float] = []
    delivered: dict[str, tuple[float, float]] = {}  # run id: (stamped, delivered)
    peak: dict[str, int] = {"pool": 0, "hub": 0}
    stop_monitor = anyio.Event()
    paused = [False]  # the monitor sleeps through the idle window: its own CPU must not count

    async def monitor() -> None:
        q = "SELECT application_name, count(*) FROM pg_stat_activity WHERE application_name LIKE 'bench_fanout_%' GROUP BY 1"
        async with await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as conn:
            while not stop_monitor.is_set():
                if paused[0]:
                    await anyio.sleep(0.1)
                    continue
                for app, count in await (await conn.execute(q)).fetchall():
                    key = "hub" if app.endswith("hub") else "pool"
                    peak[key] = max(peak[key], int(count))
                with anyio.move_on_after(0.1):
                    await stop_monitor.wait()

    async def one_tail(pool: Any, hub: runrow.NotifyHub, run_id: Any, schema: str) -> None:
        nonlocal got_ready, got_ping, ended
        async for ev in runrow.tail(pool, run_id, hub=hub, schema=schema):
            if ev.type == "ready":
                got_ready += 1
            elif ev.type == "ping":
                now, stamp = time.monotonic(), float(ev.payload["t"])
                lat.append((now - stamp) * 1000)
                delivered[str(run_id)] = (stamp, now)
                got_ping += 1
        ended += 1

    async with (
        b.schema("fanout") as s,
        child(
            "worker", conninfo=b.conninfo, schema=s, concurrency=n, pool_size=16, lease=120.0, heartbeat=30.0
        ) as kid,
    ):
        await kid.expect("READY")
        ids = await b.enqueue_many(s, n, prefix="f", content={"op": "fanout"})
        async with await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as conn:
            q = sql.SQL("SELECT count(*) FROM {}.run_event WHERE type = 'ready'").format(sql.Identifier(s))
            with anyio.fail_after(120):
                while (await (await conn.execute(q)).fetchone() or [0])[0] < n:
                    await anyio.sleep(0.1)
        pool: AsyncConnectionPool[psycopg.AsyncConnection] = AsyncConnectionPool(
            b.app_conninfo("bench_fanout_pool"),
            min_size=1,
            max_size=POOL_SIZE,
            open=False,
            kwargs={"autocommit": True},
        )
        await pool.open(wait=True)
        try:
            async with (
                runrow.NotifyHub(b.app_conninfo("bench_fanout_hub")) as hub,
                anyio.create_task_group() as tg,
            ):
                tg.start_soon(monitor)
                for rid in ids:
                    tg.start_soon(one_tail, pool, hub, rid, s)
                with anyio.fail_after(120):
                    while got_ready < n:
                        await anyio.sleep(0.05)
                await anyio.sleep(0.5)  # let the catch-up's last wakes settle
                paused[0] = True
                await anyio.sleep(0.2)
                cpu0, t0 = time.process_time(), time.monotonic()
                await anyio.sleep(p.fanout_idle)
                cpu = (time.process_time() - cpu0) / (time.monotonic() - t0) * 100
                paused[0] = False
                cpu1 = time.process_time()
                await kid.send("release")
                with anyio.fail_after(120):
                    while got_ping < n:
                        await anyio.sleep(0.02)
                # This process's CPU from the release to the last delivery, per event
                # (the hub's dispatch, the tails' reads and their decoding).
                cpu_event = (time.process_time() - cpu1) / n * 1e6
                await kid.send("stop")
                with anyio.fail_after(120):
                    while ended < n:
                        await anyio.sleep(0.05)
                stop_monitor.set()
                result = await kid.result()
                committed = result["committed"]
                emit_cpu = result["emit_cpu_us"]
            # The baseline, same pool and runs: one read of each run's journal, all at
            # once, which is what the tails must do once the hub wakes them (a tail's
            # delivery adds the append, the NOTIFY, the hub and the tail's own work).
            read = statement_text("read_events", s)
            cpu_bare0, t_bare = time.process_time(), time.monotonic()

            async def one_read(rid: Any) -> None:
                async with pool.connection() as conn:
                    await (await conn.execute(read, {"run_id": rid, "after": 0, "limit": 1})).fetchall()
                bare.append((time.monotonic() - t_bare) * 1000)

            async with anyio.create_task_group() as tg2:
                for rid in ids:
                    tg2.start_soon(one_read, rid)
            cpu_bare = (time.process_time() - cpu_bare0) / n * 1e6
        finally:
            await pool.close()
    # The writer's share: from the stamp to the child's append returning (its commit,
    # which sends the NOTIFY); this process's share: from that commit to the delivery.
    commit = [(committed[r] - stamp) * 1000 for r, (stamp, _) in delivered.items()]
    after_commit = [(now - committed[r]) * 1000 for r, (_, now) in delivered.items()]
    return [
        Row(
            "fanout",
            f"{n} tails: DB connections (peak, pool + hub)",
            float(peak["pool"] + peak["hub"]),
            "conns",
            None,
            None,
            float(POOL_SIZE + 1),
            f"pool max {POOL_SIZE} + 1 hub",
            None,
            f"<= {POOL_SIZE} + 1",
            peak["pool"] + peak["hub"] <= POOL_SIZE + 1,
        ),
        Row(
            "fanout",
            f"{n} tails: LISTEN connections",
            float(peak["hub"]),
            "conns",
            None,
            None,
            1.0,
            "one NotifyHub",
            None,
            "1",
            peak["hub"] == 1,
        ),
        Row(
            "fanout",
            f"{n} tails: process CPU over {p.fanout_idle:g} idle s",
            cpu,
            "% of a core",
            None,
            None,
            None,
            "",
            None,
            "<= 2%",
            cpu <= 2.0,
        ),
        Row(
            "fanout",
            f"{n} tails: delivery p50",
            pct(lat, 50),
            "ms",
            None,
            None,
            pct(bare, 50),
            f"{n} reads at once through the same pool",
            ratio(pct(lat, 50), pct(bare, 50)),
            note="one event on each of the runs at once",
        ),
        Row(
            "fanout",
            f"{n} tails: delivery p99",
            pct(lat, 99),
            "ms",
            None,
            None,
            pct(bare, 99),
            f"{n} reads at once through the same pool",
            ratio(pct(lat, 99), pct(bare, 99)),
            note="one event on each of the runs at once",
        ),
        *(
            Row(
                "fanout",
                f"{n} tails: {what} p{q}",
                pct(values, q),
                "ms",
                None,
                None,
                pct(bare, q),
                f"{n} reads at once through the same pool",
                ratio(pct(values, q), pct(bare, q)),
                note=note,
            )
            for what, values, note in (
                ("emit commit", commit, "the child's append, included in delivery"),
                ("delivery after commit", after_commit, "this process's share"),
            )
            for q in (50, 99)
        ),
        Row(
            "fanout",
            f"{n} tails: process CPU per delivered event",
            cpu_event,
            "us",
            None,
            None,
            cpu_bare,
            f"per read of {n} reads at once through the same pool",
            ratio(cpu_event, cpu_bare),
            goal="<= 19",  # (#39: half the 38 us of session 17)
            met=cpu_event <= 19,
            note="release to last delivery, this process",
        ),
        Row(
            "fanout",
            f"{n} tails: worker CPU per structural emit",
            emit_cpu,
            "us",
            None,
            None,
            None,
            "",
            None,
            goal="<= 15",  # (#39: half the ~30 us of session 17's in-process probe)
            met=emit_cpu is not None and emit_cpu <= 15,
            note="the child worker's CPU, release to the last append returning",
        ),
    ]
