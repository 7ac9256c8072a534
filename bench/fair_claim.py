"""What the fair claim costs next to the plain FIFO claim, on one server in one run.

Not a test (pytest does not collect it). Run from the checkout:

    python bench/fair_claim.py [--sizes 1000,100000] [--tenants 100]

For each queue size it seeds that many queued runs over the tenants (two turns per
conversation), then measures, for the fair claim and the FIFO claim alike:

* claim latency: the claim statement (limit 8) in a transaction that is rolled back,
  so every sample sees the same queue; median and p95;
* runs/s: 4 connections each claiming (limit 8) and finalising what they claimed, until
  2,000 runs (or the whole queue) are done, from a fresh copy of the same queue.

It prints the figures and the fair/FIFO ratios.
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


async def _seed(conn: psycopg.AsyncConnection, schema: str, size: int, tenants: int) -> None:
    per = size // tenants
    query = sql.SQL(SEED).format(
        run=sql.Identifier(schema, "agent_run"),
        message=sql.Identifier(schema, "message"),
        event=sql.Identifier(schema, "run_event"),
    )
    # Tenants interleaved in enqueue order, as traffic would be: seed in slices.
    slices = 10
    for s in range(slices):
        for t in range(tenants):
            await conn.execute(
                query,
                {
                    "prefix": f"t{t}-s{s}",
                    "conversations": max(1, per // slices // 2),
                    "tenant": f"tenant-{t}",
                    "n": per // slices,
                },
            )
    await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(schema, "agent_run")))


async def _latency(conn: psycopg.AsyncConnection, query: bytes) -> list[float]:
    out = []
    params = {
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
    for _ in range(SAMPLES):
        async with conn.transaction(force_rollback=True):
            t0 = time.perf_counter()
            cur = await conn.execute(query, params)
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
                cur = await conn.execute(
                    query,
                    {
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
                    },
                )
                rows = await cur.fetchall()
                if not rows:
                    await asyncio.sleep(0.001)
                    continue
                await conn.execute(finalize, finalize_params(ch, [(r[0], r[1], 3) for r in rows]))
                done += len(rows)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(WORKERS)))
    return done / (time.perf_counter() - t0)


async def _fresh(dsn: str, size: int, tenants: int) -> str:
    schema = f"perf_{uuid.uuid4().hex[:8]}"
    await runrow.migrate(dsn, schema=schema)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await _seed(conn, schema, size, tenants)
    return schema


async def _drop(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def _ms(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] * 1000 if q < 100 else max(xs) * 1000


async def measure(dsn: str, sizes: list[int], tenants: int) -> None:
    print(f"fair vs FIFO claim, limit {LIMIT}, {tenants} tenants, PostgreSQL {await _version(dsn)}")
    for size in sizes:
        figures: dict[str, dict[str, float]] = {}
        for name in ("claim", "claim_fifo"):
            schema = await _fresh(dsn, size, tenants)
            query = statement_text(name, schema)
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                lat = await _latency(conn, query)
            rate = await _drain(dsn, schema, query, min(DRAIN, size))
            await _drop(dsn, schema)
            figures[name] = {"p50": _ms(lat, 50), "p95": _ms(lat, 95), "rate": rate}
        fair, fifo = figures["claim"], figures["claim_fifo"]
        for label, f in (("fair", fair), ("fifo", fifo)):
            print(
                f"  {size:>7} queued  {label}: claim p50 {f['p50']:.2f} ms  p95 {f['p95']:.2f} ms"
                f"  {f['rate']:.0f} runs/s"
            )
        print(
            f"  {size:>7} queued  fair/fifo: latency p50 x{fair['p50'] / fifo['p50']:.2f}"
            f"  p95 x{fair['p95'] / fifo['p95']:.2f}  runs/s x{fair['rate'] / fifo['rate']:.2f}"
        )


async def _version(dsn: str) -> str:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SHOW server_version")
        row = await cur.fetchone()
        assert row is not None
        return str(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,100000")
    parser.add_argument("--tenants", type=int, default=100)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    server = EmbeddedPostgres(fast=True, tcp=True)
    server.start()
    try:
        asyncio.run(measure(server.conninfo("postgres"), sizes, args.tenants))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
