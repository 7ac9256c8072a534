"""What a durable step costs, and how long a retry takes to replay a 100-step turn.

Not a test (pytest does not collect it). Run from the checkout:

    python bench/steps.py [--steps 100] [--reps 5]

On one server (runrow.embedded, default durability), in one run, in interleaved
rounds, one Dispatcher at concurrency 1 runs one turn per measurement whose agent
makes ``--steps`` calls of a tool, timed inside the agent:

* ``direct``: the tool called plainly (the baseline: un-memoised, not durable);
* ``idempotent_step``: each call through ``run.idempotent_step`` (one fenced write);
* ``step``: each call through ``run.step`` (two fenced writes: begun, then recorded);
* ``replay``: the turn retried after the ``step`` attempt recorded every call: each
  call returns its recorded result without running (one read for the whole turn).

Two tools: ``noop`` (returns a small dict) and ``insert`` (a one-row INSERT on its own
pooled connection, a stand-in for a tool with a real side effect). Figures: per-call
µs (median over reps, min-max) and the ratio to ``direct`` with the same tool.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

import runrow
from runrow.embedded import EmbeddedPostgres

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import PROFILES, Bench

MODES = ("direct", "idempotent_step", "step", "replay")


async def measure(conninfo: str, steps: int, reps: int) -> dict[tuple[str, str], list[float]]:
    b = Bench(conninfo, PROFILES["quick"])
    out: dict[tuple[str, str], list[float]] = {}
    async with b.schema("steps") as schema, AsyncConnectionPool(conninfo, min_size=2, open=False) as pool:
        await pool.open(wait=True)
        async with pool.connection() as c:
            await c.execute(
                sql.SQL("CREATE TABLE {}.effect (id bigserial PRIMARY KEY, n int)").format(
                    sql.Identifier(schema)
                )
            )
        insert = sql.SQL("INSERT INTO {}.effect (n) VALUES (%s) RETURNING id").format(sql.Identifier(schema))

        async def noop(i: int) -> dict[str, int]:
            return {"i": i}

        async def write(i: int) -> dict[str, int]:
            async with pool.connection() as c:
                cur = await c.execute(insert, (i,))
                row = await cur.fetchone()
                assert row is not None
                return {"id": row[0]}

        tools = {"noop": noop, "insert": write}
        plan: dict[str, Any] = {}
        took: list[float] = []

        async def agent(run: runrow.RunContext) -> None:
            tool, mode = tools[plan["tool"]], plan["mode"]
            t0 = time.perf_counter()
            for i in range(steps):
                if mode == "direct":
                    await tool(i)
                elif mode == "idempotent_step":
                    await run.idempotent_step("tool", tool, i)
                else:  # step, and replay (the retry of a step attempt)
                    await run.step("tool", tool, i)
            took.append(time.perf_counter() - t0)
            if mode == "step":
                raise RuntimeError("fail, so the next round can replay this turn")

        async with runrow.Dispatcher(conninfo, agent, schema=schema, concurrency=1, poll=0.2):
            for rep in range(reps):
                for tool in tools if rep % 2 == 0 else reversed(tools):
                    last: Any = None
                    for mode in MODES if rep % 2 == 0 else ("step", "replay", "idempotent_step", "direct"):
                        plan.update(tool=tool, mode=mode)
                        took.clear()
                        if mode == "replay":
                            run = await runrow.retry_run(pool, last.id, schema=schema)
                        else:
                            run = await runrow.enqueue(
                                pool,
                                schema=schema,
                                conversation_id=f"{tool}-{mode}-{rep}",
                                user_id="u",
                                content="x",
                            )
                        last = run
                        with anyio.fail_after(120):
                            while not (info := await runrow.get_run(pool, run.id, schema=schema)).terminal:
                                await anyio.sleep(0.01)
                        if info.error and mode != "step":
                            raise RuntimeError(f"{mode}/{tool}: {info.error}")
                        out.setdefault((tool, mode), []).append(took[0] / steps * 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    server = EmbeddedPostgres(fast=False, tcp=True)
    server.start()
    try:
        got = anyio.run(measure, server.conninfo(via_tcp=True), args.steps, args.reps)
    finally:
        server.stop()
    print(f"{args.steps} calls per turn, {args.reps} reps, per-call µs (median, min-max), ratio to direct")
    for tool in ("noop", "insert"):
        base = statistics.median(got[(tool, "direct")])
        for mode in MODES:
            v = got[(tool, mode)]
            med = statistics.median(v)
            print(f"{tool:<7} {mode:<16} {med:>9,.1f} µs  ({min(v):,.1f}-{max(v):,.1f})  x{med / base:,.2f}")
        replay_turn = statistics.median(got[(tool, "replay")]) * args.steps / 1000
        print(f"{tool:<7} replay of the whole {args.steps}-step turn: {replay_turn:,.2f} ms")


if __name__ == "__main__":
    main()
