"""Sub-agent trees (issue #41): what a tree of runs costs against the same runs alone.

Not a test (pytest does not collect it). Run from the checkout:

    python bench/tree.py [--trees 40] [--reps 3] [--concurrency 16,160]

On one server (runrow.embedded, default durability), one Dispatcher per measurement,
interleaved rounds:

* ``tree``: ``--trees`` root turns; each root spawns 10 children in one
  ``spawn_many``, parks in ``wait_for_children`` (holding no slot), is queued again by its
  last child's ending, replays its two recorded steps and writes the children's answers.
  Each child is a 3-step turn (3 ``run.step`` calls returning a small dict) and an answer.
* ``flat``: the same number of runs (11 per tree) as independent 3-step turns, each in a
  conversation of its own.

Both are queued before the Dispatcher starts; the drain is timed (a tree's spawns, its
children's enqueues, are part of its work; the flat turns' enqueues are not) and its WAL
counted.

Figures: trees/s, runs/s, WAL bytes per run, and the tree's overhead: the time per run
of ``tree`` over the time per run of ``flat`` (1.00 would be a tree costing exactly its
11 runs; above it, what spawning, parking and the resume add).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

import anyio
import psycopg
from psycopg import sql

import runrow
from runrow.embedded import EmbeddedPostgres

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import PROFILES, Bench

CHILDREN = 10
STEPS = 3


async def _noop(i: int) -> dict[str, int]:
    return {"i": i}


async def leaf(run: runrow.RunContext) -> None:
    """A 3-step turn and an answer."""
    for i in range(STEPS):
        await run.step(f"tool-{i}", _noop, i)
    await run.write_message("done")


async def orchestrator(run: runrow.RunContext) -> None:
    """Spawns CHILDREN leaves at once, waits for them without a slot, answers with theirs."""
    children = await run.spawn_many([("leaf", f"part {i}") for i in range(CHILDREN)])
    results = await run.wait_for_children(children)
    await run.write_message([r.get() for r in results])


async def _progress(conn: psycopg.AsyncConnection[object], schema: str) -> tuple[int, int, int]:
    """(runs ended, runs failed, WAL position in bytes)."""
    query = sql.SQL(
        "SELECT count(*) FILTER (WHERE status IN ('completed', 'failed', 'cancelled', 'expired')),"
        " count(*) FILTER (WHERE status <> 'completed' AND status IN ('failed', 'cancelled', 'expired')),"
        " pg_current_wal_lsn() - '0/0'::pg_lsn FROM {}.agent_run"
    ).format(sql.Identifier(schema))
    cur = await conn.execute(query)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


async def measure(conninfo: str, mode: str, trees: int, concurrency: int) -> dict[str, float]:
    """One drain of ``trees`` trees (or as many flat turns); its rates and WAL per run."""
    b = Bench(conninfo, PROFILES["quick"])
    runs = trees * (CHILDREN + 1)
    async with (
        b.schema(f"tree_{mode}") as schema,
        await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn,
    ):
        dispatcher = runrow.Dispatcher(
            conninfo,
            orchestrator,
            agents={"leaf": leaf},
            schema=schema,
            concurrency=concurrency,
            poll=0.2,
            max_children=CHILDREN,
        )
        tag = uuid.uuid4().hex[:6]
        for i in range(trees if mode == "tree" else runs):  # queued first: the drain is timed
            await runrow.enqueue(
                conn,
                schema=schema,
                conversation_id=f"{tag}-{i}",
                user_id="u",
                content="go",
                agent_key=None if mode == "tree" else "leaf",
            )
        _, _, wal0 = await _progress(conn, schema)
        async with dispatcher:
            t0 = time.perf_counter()
            with anyio.fail_after(600):
                while True:
                    ended, failed, wal = await _progress(conn, schema)
                    if failed:
                        raise RuntimeError(f"{mode}: {failed} runs did not complete")
                    if ended >= runs:
                        break
                    await anyio.sleep(0.02)
            took = time.perf_counter() - t0
    return {"trees/s": trees / took, "runs/s": runs / took, "wal/run": (wal - wal0) / runs}


async def bench(conninfo: str, trees: int, reps: int, levels: list[int]) -> None:
    got: dict[tuple[str, int], list[dict[str, float]]] = {}
    for rep in range(reps):
        for c in levels:
            for mode in ("tree", "flat") if rep % 2 == 0 else ("flat", "tree"):
                r = await measure(conninfo, mode, trees, c)
                got.setdefault((mode, c), []).append(r)
                print(f"round {rep + 1} c{c} {mode}: " + ", ".join(f"{k} {v:,.1f}" for k, v in r.items()))
    print(
        f"\n{trees} trees of {CHILDREN + 1} runs (children: {STEPS}-step turns); {reps} reps; median (min-max)"
    )
    print(f"{'case':<10} {'trees/s':>18} {'runs/s':>22} {'WAL B/run':>10} {'overhead':>9}")
    for c in levels:
        flat_runs = statistics.median(r["runs/s"] for r in got[("flat", c)])
        for mode in ("tree", "flat"):
            rows = got[(mode, c)]

            def span(key: str, rows: list[dict[str, float]] = rows) -> str:
                v = [r[key] for r in rows]
                return f"{statistics.median(v):,.1f} ({min(v):,.0f}-{max(v):,.0f})"

            wal = statistics.median(r["wal/run"] for r in rows)
            runs_s = statistics.median(r["runs/s"] for r in rows)
            trees_s = span("trees/s") if mode == "tree" else "-"
            print(
                f"{mode} c{c:<5} {trees_s:>18} {span('runs/s'):>22} {wal:>10,.0f} {flat_runs / runs_s:>9.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--trees", type=int, default=40)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", default="16,160")
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    server = EmbeddedPostgres(fast=False, tcp=True)
    server.start()
    try:
        anyio.run(bench, server.conninfo(via_tcp=True), args.trees, args.reps, levels)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
