"""journal: how many rows text streaming costs, append->tail latency, 200 runs streaming at once."""

from __future__ import annotations

import time
from typing import Any

import anyio
import psycopg
from lib import Bench, Row, child, latency_rows, pct, ratio, summary
from psycopg import sql

import runrow


async def _count_rows(conninfo: str, schema: str, run_ids: list[Any], etype: str | None = None) -> int:
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        q = sql.SQL(
            "SELECT count(*) FROM {}.run_event WHERE run_id = ANY(%s) AND (%s::text IS NULL OR type = %s)"
        )
        cur = await conn.execute(q.format(sql.Identifier(schema)), (run_ids, etype, etype))
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def _wait_finished(conninfo: str, schema: str, run_ids: list[Any], timeout: float) -> None:
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        q = sql.SQL("SELECT count(*) FROM {}.agent_run WHERE id = ANY(%s) AND finished_at IS NULL").format(
            sql.Identifier(schema)
        )
        with anyio.fail_after(timeout):
            while True:
                row = await (await conn.execute(q, (run_ids,))).fetchone()
                if row is not None and row[0] == 0:
                    return
                await anyio.sleep(0.05)


async def rows_per_deltas(b: Bench) -> list[Row]:
    p = b.profile
    n, seconds = p.journal_deltas, p.journal_seconds
    counts: list[float] = []
    async with b.schema("jrows") as s, child("worker", conninfo=b.conninfo, schema=s, concurrency=2) as kid:
        await kid.expect("READY")
        async with await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as conn:
            for rep in range(max(1, p.reps - 1)):
                run = await runrow.enqueue(
                    conn,
                    conversation_id=f"j{rep}",
                    user_id="u",
                    content={"op": "deltas", "n": n, "seconds": seconds},
                    schema=s,
                )
                await _wait_finished(b.conninfo, s, [run.id], seconds * 3 + 30)
                counts.append(float(await _count_rows(b.conninfo, s, [run.id], "content_delta")))
    med, lo, hi = summary(counts)
    limit = 45 * seconds / 10
    note = "" if seconds == 10 else f"scaled down: {n} deltas over {seconds:g}s, goal scaled"
    return [
        Row(
            "journal",
            f"rows for {n:,} deltas over {seconds:g}s",
            med,
            "rows",
            lo,
            hi,
            float(n),
            "one row per delta",
            ratio(med, n),
            f"<= {limit:g} rows",
            med <= limit,
            note,
            counts,
        )
    ]


async def append_to_tail(b: Bench) -> list[Row]:
    """Structural events (written at once, no flush clock) from a child's agent -> a tail here."""
    p = b.profile
    n = p.latency_samples
    lat: list[float] = []
    async with (
        b.schema("jtail") as s,
        child("worker", conninfo=b.conninfo, schema=s, concurrency=2) as kid,
        runrow.NotifyHub(b.conninfo) as hub,
    ):
        await kid.expect("READY")
        async with await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as conn:
            run = await runrow.enqueue(
                conn,
                conversation_id="tail",
                user_id="u",
                content={"op": "ticks", "n": n, "every": 0.02},
                schema=s,
            )
        released = False
        async for ev in runrow.tail(b.conninfo, run.id, hub=hub, schema=s):
            now = time.monotonic()
            if ev.type == "tick":
                lat.append((now - float(ev.payload["t"])) * 1000)
            if not released and ev.seq >= 2:
                await kid.send("release")
                released = True
    return latency_rows(
        "journal",
        "append->tail (hub)",
        lat,
        p.reps + 1,
        baseline=b.raw_wake_ms or None,
        baseline_label="raw LISTEN/NOTIFY" if b.raw_wake_ms else "",
    )


async def streaming(b: Bench, notify: bool) -> dict[str, float]:
    """``stream_runs`` runs streaming text in one worker; a structural event now and then is timed."""
    p = b.profile
    runs = p.stream_runs
    async with (
        b.schema("jstream") as s,
        child(
            "worker",
            conninfo=b.conninfo,
            schema=s,
            concurrency=runs,
            pool_size=16,
            journal_notify=notify,
            lease=60.0,
            heartbeat=10.0,
        ) as kid,
    ):
        await kid.expect("READY")
        ids: list[Any] = []
        async with await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as conn:
            for i in range(runs):
                r = await runrow.enqueue(
                    conn,
                    conversation_id=f"s{i}",
                    user_id="u",
                    content={"op": "stream", "seconds": p.stream_seconds, "every": 0.02, "probe": 0.25},
                    schema=s,
                )
                ids.append(r.id)
        # Wait until every run is running, then release them together.
        async with await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as conn:
            q = sql.SQL("SELECT count(*) FROM {}.agent_run WHERE status = 'running'").format(
                sql.Identifier(s)
            )
            with anyio.fail_after(60):
                while (await (await conn.execute(q)).fetchone() or [0])[0] < runs:
                    await anyio.sleep(0.05)
        before = await _count_rows(b.conninfo, s, ids)
        t0 = time.monotonic()
        await kid.send("release")
        await _wait_finished(b.conninfo, s, ids, p.stream_seconds * 4 + 60)
        elapsed = time.monotonic() - t0
        after = await _count_rows(b.conninfo, s, ids)
        await kid.send("stop")
        res = await kid.result()
    commit = res["commit_ms"]
    return {
        "rows_per_s": (after - before) / elapsed,
        "p50": pct(commit, 50) if commit else float("nan"),
        "p99": pct(commit, 99) if commit else float("nan"),
        "idle_rss_mb": res["idle_rss_kb"] / 1024,
        "peak_rss_mb": res["peak_rss_kb"] / 1024,
    }


async def journal(b: Bench) -> list[Row]:
    rows = await rows_per_deltas(b)
    rows += await append_to_tail(b)
    p = b.profile
    with_n: list[dict[str, float]] = []
    without: list[dict[str, float]] = []
    for rep in range(max(1, p.reps - 1)):
        for notify in (True, False) if rep % 2 == 0 else (False, True):
            (with_n if notify else without).append(await streaming(b, notify))
    label = f"{p.stream_runs} runs streaming"
    for key, unit, name in (
        ("rows_per_s", "rows/s", "rows/s"),
        ("p50", "ms", "commit p50"),
        ("p99", "ms", "commit p99"),
    ):
        a = [r[key] for r in with_n]
        z = [r[key] for r in without]
        med, lo, hi = summary(a)
        base = summary(z)[0]
        rows.append(
            Row(
                "journal",
                f"{label}: {name}, per-flush NOTIFY",
                med,
                unit,
                lo,
                hi,
                base,
                "journal_notify=False",
                ratio(med, base),
                samples=a,
            )
        )
    return rows
