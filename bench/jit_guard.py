"""What runrow's JIT guard costs per statement, on one server in one run (#17).

Not a test (pytest does not collect it). Run from the checkout:

    python bench/jit_guard.py [--calls 3000] [--reps 5]

No runrow statement runs with JIT (sql/session.sql). A connection runrow opened itself
has ``jit = off`` for its session: no cost per statement. Any other connection (the
host's pool or connection) pipelines a transaction-local ``set_config`` with the
statement, in the same round trip; inside the host's own transaction the host's setting
is also put back in that round trip. This script times one small runrow statement (the
tail's ``read_events``, on a run with 20 events) through ``runrow._gateway._exec.execute`` in each
of those three cases, interleaved, and prints microseconds per call and the ratio to
the session-configured connection.
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
import psycopg

import runrow
from runrow._gateway import _exec, statement_text
from runrow.embedded import EmbeddedPostgres


async def measure(dsn: str, calls: int, reps: int) -> None:
    schema = "jit_guard"
    await runrow.migrate(dsn, schema=schema)
    run = await runrow.enqueue(dsn, conversation_id="c", user_id="u", content="x", schema=schema)
    query = statement_text("read_events", schema)
    params = {"run_id": run.id, "after": 0, "limit": 500}
    own = await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0)
    await _exec.configure_own(own)
    host = await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0)
    host_tx = await psycopg.AsyncConnection.connect(dsn, prepare_threshold=0)

    async def loop(conn: psycopg.AsyncConnection, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            cur = await _exec.execute(conn, query, params)
            await cur.fetchall()
        return (time.perf_counter() - t0) / n * 1e6

    async def in_tx(n: int) -> float:
        async with host_tx.transaction():
            return await loop(host_tx, n)

    cases = {
        "own connection (session jit=off)": lambda n: loop(own, n),
        "host autocommit (pipelined guard)": lambda n: loop(host, n),
        "host transaction (guard + restore)": in_tx,
    }
    for fn in cases.values():  # warm up: prepared statements, caches
        await fn(200)
    results: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(reps):
        for name, fn in cases.items():
            results[name].append(await fn(calls))
    base = statistics.median(results["own connection (session jit=off)"])
    print(f"{'case':40} {'us/call':>8} {'ratio':>6}  (median of {reps} x {calls} calls)")
    for name, values in results.items():
        med = statistics.median(values)
        print(f"{name:40} {med:8.1f} {med / base:6.2f}")
    for c in (own, host, host_tx):
        await c.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with EmbeddedPostgres(tcp=True) as pg:
        anyio.run(measure, pg.conninfo(via_tcp=True), args.calls, args.reps)


if __name__ == "__main__":
    main()
