"""Would a second ending writer help? The bare folded loop on one connection against the
same jobs in flight split over 2 or 4 connections (issue #24's untried lever).

    python bench/fold_lanes.py [--rounds 3] [--cases 10x1,10x2,16x1,16x2,40x1,40x2,40x4]

Each case ``CxL`` drains no-op runs with ``L`` connections, each looping runrow's own
fold (the previous batch's ``finalize`` and the claim of up to ``C/L`` runs, pipelined
in one implicit transaction, as the Dispatcher's ending writer sends them), so ``C``
runs are in flight in all. ``L=1`` is the design as built (one batch in flight at a
time); ``L>1`` is what overlapping folds on more writer connections could reach at
best, with nothing of runrow's Python. Cases alternate within each round, every drain
on a fresh schema; the table gives the median and the spread over rounds, and each
case's ratio to ``Cx1`` of the same round.
"""

from __future__ import annotations

import argparse
import statistics

import anyio
from lib import PROFILES, Bench
from scenarios.throughput import drain_bare_folded

from runrow.embedded import EmbeddedPostgres


async def main(args: argparse.Namespace) -> None:
    cases = [tuple(int(x) for x in case.split("x")) for case in args.cases.split(",")]
    pg = EmbeddedPostgres(fast=False, tcp=True, settings={"max_connections": "200"})
    pg.start()
    try:
        b = Bench(pg.conninfo(via_tcp=True), PROFILES["quick"])
        rates: dict[tuple[int, ...], list[float]] = {case: [] for case in cases}
        ratios: dict[tuple[int, ...], list[float]] = {case: [] for case in cases}
        for r in range(args.rounds):
            order = cases if r % 2 == 0 else list(reversed(cases))
            got: dict[tuple[int, ...], float] = {}
            for case in order:
                in_flight, lanes = case
                async with b.schema("lanes") as s:
                    await b.quiesce()
                    got[case] = await drain_bare_folded(
                        b, s, max(args.runs, 150 * in_flight), in_flight, lanes
                    )
                print(
                    f"round {r + 1}: {in_flight} in flight x {lanes} lanes: {got[case]:,.0f} runs/s",
                    flush=True,
                )
            for case, rate in got.items():
                rates[case].append(rate)
                one = got.get((case[0], 1))
                if one:
                    ratios[case].append(rate / one)
        print("\n| in flight | lanes | runs/s (median) | min-max | vs 1 lane (median of rounds) |")
        print("|---:|---:|---:|---:|---:|")
        for case in cases:
            v = rates[case]
            ratio = f"{statistics.median(ratios[case]):.2f}" if ratios[case] else "-"
            print(
                f"| {case[0]} | {case[1]} | {statistics.median(v):,.0f} | {min(v):,.0f}-{max(v):,.0f} | {ratio} |"
            )
    finally:
        pg.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=2000, help="runs per drain, at least 150 per run in flight")
    p.add_argument("--cases", default="10x1,10x2,16x1,16x2,40x1,40x2,40x4")
    anyio.run(main, p.parse_args(), backend="asyncio")
