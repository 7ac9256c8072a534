"""What rate limits cost the claim: 1,000 limited keys at a deep queue, against none.

Not a test (pytest does not collect it). Run from the checkout:

    python bench/rate_limits.py [--size 100000] [--keys 1000] [--order fair]

It seeds ``size`` queued runs (one tenant, one conversation each), their ``limit_key``
spread round-robin over ``keys`` keys, and measures three cases on a fresh copy each:

* ``none``: no limit defined (the claim's path for every host that sets none);
* ``open``: a limit on every key, wide enough never to close (each claim checks each row
  against its keys and counts its starts under the keys' row locks);
* ``half shut``: the same, with every other key's gate shut (the claim walks past the
  shut keys' runs to those under open keys).

For each: the claim latency (limit 8, rolled back, so every sample sees the same queue;
median and p95) and the runs/s of 4 connections claiming 8 at a time and finalising what
they claimed, for 2,000 runs. It prints the figures and each case's ratio to ``none``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

import runrow
from runrow._gateway import statement_text
from runrow._names import Channels
from runrow.embedded import EmbeddedPostgres

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.bulk, the seeding SQL
from tests.bulk import SEED

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for bench/lib.py
from lib import finalize_params

LIMIT = 8
SAMPLES = 200
WORKERS = 4
DRAIN = 2_000
PARAMS = {
    "limit": LIMIT,
    "lease_seconds": 30,
    "worker_id": "perf",
    "now": None,
    "retry_policy": None,
    "version": None,
    "same_version": False,
    "agent_keys": [],
    "serves_default": True,
    "tree_cap": None,
}


async def _fresh(dsn: str, size: int, keys: int, case: str) -> str:
    schema = f"perf_{uuid.uuid4().hex[:8]}"
    await runrow.migrate(dsn, schema=schema)
    run = sql.Identifier(schema, "agent_run")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        query = sql.SQL(SEED).format(
            run=run, message=sql.Identifier(schema, "message"), event=sql.Identifier(schema, "run_event")
        )
        await conn.execute(query, {"prefix": "c", "conversations": size, "tenant": None, "n": size})
        await conn.execute(
            sql.SQL("UPDATE {} SET limit_key = 'k' || (queue_order %% %s)").format(run), (keys,)
        )
        if case != "none":
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (key, runs, per_seconds, gate_until) "
                    "SELECT 'k' || g, 1000000, 3600, CASE WHEN %s AND g %% 2 = 0 "
                    "THEN now() + interval '1 day' END FROM generate_series(0, %s - 1) g"
                ).format(sql.Identifier(schema, "rate_limit")),
                (case == "half shut", keys),
            )
        await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(run))
    return schema


async def _latency(conn: psycopg.AsyncConnection, query: bytes) -> list[float]:
    out = []
    for _ in range(SAMPLES):
        async with conn.transaction(force_rollback=True):
            t0 = time.perf_counter()
            cur = await conn.execute(query, PARAMS)
            rows = await cur.fetchall()
            out.append(time.perf_counter() - t0)
        assert len(rows) == LIMIT, len(rows)
    return out


async def _drain(dsn: str, schema: str, query: bytes, total: int) -> float:
    ch = Channels.for_schema(schema)
    finalize = statement_text("finalize", schema)
    done = 0

    async def worker() -> None:
        nonlocal done
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while done < total:
                cur = await conn.execute(query, PARAMS)
                rows = await cur.fetchall()
                if not rows:
                    await asyncio.sleep(0.001)
                    continue
                await conn.execute(finalize, finalize_params(ch, [(r[0], r[1], 3) for r in rows]))
                done += len(rows)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(WORKERS)))
    return done / (time.perf_counter() - t0)


def _ms(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] * 1000


async def measure(dsn: str, size: int, keys: int, order: str) -> None:
    name = "claim" if order == "fair" else "claim_fifo"
    print(f"{order} claim, limit {LIMIT}, {size} queued under {keys} keys")
    figures: dict[str, dict[str, float]] = {}
    for case in ("none", "open", "half shut"):
        schema = await _fresh(dsn, size, keys, case)
        query = statement_text(name, schema)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            lat = await _latency(conn, query)
        rate = await _drain(dsn, schema, query, DRAIN)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        f = figures[case] = {"p50": _ms(lat, 50), "p95": _ms(lat, 95), "rate": rate}
        base = figures["none"]
        print(
            f"  {case:>9}: claim p50 {f['p50']:.2f} ms  p95 {f['p95']:.2f} ms  {f['rate']:.0f} runs/s"
            f"   vs none: p50 x{f['p50'] / base['p50']:.2f}  runs/s x{f['rate'] / base['rate']:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--order", choices=("fair", "fifo"), default="fair")
    args = parser.parse_args()
    server = EmbeddedPostgres(fast=True, tcp=True)
    server.start()
    try:
        asyncio.run(measure(server.conninfo("postgres"), args.size, args.keys, args.order))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
