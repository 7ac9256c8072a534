"""Profiles one runrow drain of no-op runs, to read the dispatcher's overhead off a profile.

    python bench/profile_drain.py --concurrency 4 --runs 3000 --pyinstrument bench/results/drain.html
    py-spy record -o bench/results/drain.svg -- python bench/profile_drain.py --concurrency 4

Starts its own PostgreSQL (default durability), enqueues (not profiled), drains (profiled
with pyinstrument when asked), then runs the bare claim loop on the same server for context.
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio
from lib import PROFILES, Bench
from scenarios.throughput import drain_bare, drain_runrow

from runrow.embedded import EmbeddedPostgres


async def main(args: argparse.Namespace) -> None:
    pg = EmbeddedPostgres(fast=False, tcp=True, settings={"max_connections": "200"})
    pg.start()
    try:
        b = Bench(pg.conninfo(via_tcp=True), PROFILES["quick"])
        profiler: Any = None
        if args.pyinstrument:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0005, async_mode="disabled")
        for _ in range(args.rounds):
            async with b.schema("prof") as s:
                rate = await drain_runrow(b, s, args.runs, args.concurrency, args.op, profiler)
            async with b.schema("prof") as s:
                bare = await drain_bare(b, s, args.runs, args.concurrency, args.batch, args.op)
            print(
                f"runrow c={args.concurrency}: {rate:.0f} runs/s; bare claim-{args.batch} x {args.concurrency}: "
                f"{bare:.0f} runs/s"
            )
        if profiler is not None:
            profiler.write_html(args.pyinstrument)
            print(profiler.output_text(unicode=False, color=False, show_all=args.show_all))
    finally:
        pg.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--runs", type=int, default=3000)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--op", default="noop")
    p.add_argument("--show-all", action="store_true")
    p.add_argument("--pyinstrument", help="write a pyinstrument HTML profile of the drains here")
    anyio.run(main, p.parse_args(), backend="asyncio")
