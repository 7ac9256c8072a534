"""wake_latency and cancel_latency: a producer here, an idle worker in a child process.

Times are ``time.monotonic()`` in both processes (one system-wide clock on Linux). The
producer reads its clock when the commit has returned; the child reads its clock when
the agent starts (or sees its cancellation) and prints it.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import psycopg
from lib import Bench, Child, Row, child, latency_rows

import runrow


async def _wake_sample(b: Bench, conn: psycopg.AsyncConnection, kid: Child, schema: str, i: int) -> float:
    run = await runrow.enqueue(
        conn, conversation_id=f"w{i}", user_id="u", content={"op": "start"}, schema=schema
    )
    t0 = time.monotonic()
    got = await kid.expect("START", timeout=30)
    run_id, t = got.split()
    assert run_id == str(run.id), (run_id, run.id)
    return (float(t) - t0) * 1000


async def _raw_sample(conn: psycopg.AsyncConnection, kid: Child, channel: str) -> float:
    await conn.execute("SELECT pg_notify(%s, '')", (channel,))
    t0 = time.monotonic()
    return (float(await kid.expect("GOT", timeout=30)) - t0) * 1000


async def wake(b: Bench) -> list[Row]:
    """enqueue commit -> agent started, idle dispatcher; hub on, hub off (poll), raw LISTEN/NOTIFY."""
    p = b.profile
    poll_off = 0.1
    samples: dict[str, list[float]] = {"hub": [], "poll": [], "raw": []}
    async with b.schema("wake_on") as s_on, b.schema("wake_off") as s_off:
        raw_channel = "bench_raw_wake"
        async with (
            child("worker", conninfo=b.conninfo, schema=s_on, concurrency=4) as on,
            child(
                "worker", conninfo=b.conninfo, schema=s_off, concurrency=4, notifications=False, poll=poll_off
            ) as off,
            child("listen", conninfo=b.conninfo, channel=raw_channel) as raw,
            await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as conn,
        ):
            for k in (on, off, raw):
                await k.expect("READY")
            await anyio.sleep(0.2)
            for i in range(-3, p.latency_samples):  # three warm-up rounds
                got = {
                    "hub": await _wake_sample(b, conn, on, s_on, i),
                    "poll": await _wake_sample(b, conn, off, s_off, i),
                    "raw": await _raw_sample(conn, raw, raw_channel),
                }
                if i >= 0:
                    for k, v in got.items():
                        samples[k].append(v)
                await anyio.sleep(0.02)  # let the finalize land: the next sample meets an idle worker
    b.raw_wake_ms = samples["raw"]
    blocks = p.reps + 1
    rows = latency_rows(
        "wake_latency",
        "hub on",
        samples["hub"],
        blocks,
        baseline=samples["raw"],
        baseline_label="raw LISTEN/NOTIFY",
        goals=(("<= 3 ms", lambda v: v <= 3.0), ("<= 10 ms", lambda v: v <= 10.0)),
    )
    rows += latency_rows(
        "wake_latency",
        f"hub off (poll {poll_off}s)",
        samples["poll"],
        blocks,
        baseline=samples["raw"],
        baseline_label="raw LISTEN/NOTIFY",
    )
    rows += latency_rows("wake_latency", "raw LISTEN/NOTIFY round trip", samples["raw"], blocks)
    return rows


async def _cancel_sample(conn: psycopg.AsyncConnection, kid: Child, schema: str, i: int) -> float:
    run = await runrow.enqueue(
        conn, conversation_id=f"x{i}", user_id="u", content={"op": "hold"}, schema=schema
    )
    got = await kid.expect("START", timeout=30)
    assert got.split()[0] == str(run.id)
    await runrow.cancel_run(conn, run.id, schema=schema)
    t0 = time.monotonic()
    got = await kid.expect("CANCELLED", timeout=30)
    run_id, t = got.split()
    assert run_id == str(run.id)
    return (float(t) - t0) * 1000


async def cancel(b: Bench) -> list[Row]:
    """cancel_run commit -> the agent sees its cancellation; hub on and off (heartbeat fallback)."""
    p = b.profile
    heartbeat = 1.0
    samples: dict[str, list[float]] = {"hub": [], "off": []}
    async with b.schema("cancel_on") as s_on, b.schema("cancel_off") as s_off:
        common: dict[str, Any] = {
            "conninfo": b.conninfo,
            "concurrency": 4,
            "heartbeat": heartbeat,
            "lease": 4.0,
        }
        async with (
            child("worker", schema=s_on, **common) as on,
            child("worker", schema=s_off, notifications=False, poll=0.1, **common) as off,
            await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as conn,
        ):
            for k in (on, off):
                await k.expect("READY")
            for i in range(-1, p.cancel_samples):
                a = await _cancel_sample(conn, on, s_on, i)
                c = await _cancel_sample(conn, off, s_off, i)
                if i >= 0:
                    samples["hub"].append(a)
                    samples["off"].append(c)
    blocks = p.reps + 1
    rows = latency_rows(
        "cancel_latency",
        "hub on",
        samples["hub"],
        blocks,
        baseline=b.raw_wake_ms or None,
        baseline_label="raw LISTEN/NOTIFY" if b.raw_wake_ms else "",
        goals=(("<= 100 ms", lambda v: v <= 100.0), None),
    )
    rows += latency_rows(
        "cancel_latency",
        f"hub off (heartbeat {heartbeat:g}s)",
        samples["off"],
        blocks,
        baseline=[heartbeat * 1000],
        baseline_label="heartbeat period",
    )
    return rows
