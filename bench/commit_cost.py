"""What the ending's own durable commit costs the claim loop, on one server in one run.

Not a test (pytest does not collect it), and not a setting runrow uses. Run from the
checkout:

    python bench/commit_cost.py [--concurrency 1,4] [--runs 2000] [--reps 3]

It drains no-op runs with runrow's pipelined loop and nothing else (one connection
claims up to c runs while a second writes the previous batch's endings: the
``bare pipelined`` baseline of ``throughput_core``), interleaving two variants:

* ``durable``: the ending writer commits with ``synchronous_commit=on``, as runrow must
  (an ending is visible to tails once committed, so it has to be durable by then);
* ``async ending``: the writer's commits are asynchronous, so only the claims wait for
  their WAL flush. Unsafe (a crash could lose an ending that tails already streamed);
  measured only to show how much of the loop's time the ending's own flush takes.

* ``folded``: runrow's loop since #24: one connection sends the previous batch's
  endings and the next claim pipelined in one transaction (one commit per batch, both
  durable: the ``bare folded`` baseline of ``throughput_core``).

It prints runs/s (and, for the two pipelined variants, the claim's latency, median) for
each, and their ratios to ``durable``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import anyio

from runrow.embedded import EmbeddedPostgres

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for bench/lib.py and scenarios
from lib import PROFILES, Bench
from scenarios.throughput import drain_bare_folded, drain_bare_pipelined


async def drain(b: Bench, schema: str, n: int, concurrency: int, durable: bool) -> tuple[float, float]:
    """(runs/s, claim latency p50 in ms) of the pipelined loop over ``n`` queued runs."""
    latencies: list[float] = []
    rate = await drain_bare_pipelined(
        b, schema, n, concurrency, durable_endings=durable, claim_seconds=latencies
    )
    return rate, statistics.median(latencies) * 1000


async def measure(conninfo: str, concurrencies: list[int], runs: int, reps: int) -> None:
    b = Bench(conninfo, PROFILES["quick"])
    variants = ["durable", "async ending", "folded"]
    for c in concurrencies:
        got: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
        for rep in range(reps):
            for variant in variants if rep % 2 == 0 else list(reversed(variants)):
                async with b.schema("cc") as schema:
                    await b.quiesce()
                    if variant == "folded":
                        got[variant].append((await drain_bare_folded(b, schema, runs, c), float("nan")))
                    else:
                        got[variant].append(await drain(b, schema, runs, c, variant == "durable"))
        for variant in variants:
            rates = [r for r, _ in got[variant]]
            claims = [ms for _, ms in got[variant]]
            print(
                f"c={c:<3} {variant:<13} {statistics.median(rates):>7,.0f} runs/s "
                f"({min(rates):,.0f}-{max(rates):,.0f})  claim p50 {statistics.median(claims):.2f} ms"
            )
        durable = statistics.median(r for r, _ in got["durable"])
        for variant in variants[1:]:
            ratio = statistics.median(r for r, _ in got[variant]) / durable
            print(f"c={c:<3} {variant} / durable: x{ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    server = EmbeddedPostgres(fast=False, tcp=True, settings={"max_connections": "200"})
    server.start()
    try:
        anyio.run(
            measure,
            server.conninfo(via_tcp=True),
            [int(c) for c in args.concurrency.split(",")],
            args.runs,
            args.reps,
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
