"""A worker process for the tests: N dispatchers in one OS process, SIGTERM drains.

    python -m tests.worker_proc AGENT_NAME DISPATCHERS CONCURRENCY LEASE HEARTBEAT GRACE POLL

Reads RUNROW_TEST_DSN and RUNROW_TEST_SCHEMA (and RUNROW_TEST_RETRY: max attempts of an
automatic retry policy; RUNROW_TEST_AGENTS: more agents by key, ``key,key``, each the agent
of that name); prints "ready" once every dispatcher runs,
and a drain report line per dispatcher when stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

import anyio

import runrow

from . import agents


async def main(argv: list[str]) -> None:
    name, n, concurrency, lease, heartbeat, grace, poll = argv
    agent = getattr(agents, name)
    dsn, schema = os.environ["RUNROW_TEST_DSN"], os.environ["RUNROW_TEST_SCHEMA"]
    attempts = os.environ.get("RUNROW_TEST_RETRY")  # automatic retries, at once, up to this many attempts
    retry = runrow.RetryPolicy(max_attempts=int(attempts), backoff=0) if attempts else None
    keyed = [k for k in os.environ.get("RUNROW_TEST_AGENTS", "").split(",") if k]
    served = {k: getattr(agents, k) for k in keyed} or None
    async with contextlib.AsyncExitStack() as stack:
        dispatchers = [
            await stack.enter_async_context(
                runrow.Dispatcher(
                    dsn,
                    agent,
                    agents=served,
                    schema=schema,
                    concurrency=int(concurrency),
                    lease=float(lease),
                    heartbeat=float(heartbeat),
                    grace=float(grace),
                    poll=float(poll),
                    reap_interval=float(poll),
                    retry=retry,
                )
            )
            for _ in range(int(n))
        ]
        print("ready", flush=True)
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                break
        for d in dispatchers:
            report = await d.stop(drain_timeout=float(os.environ.get("RUNROW_TEST_DRAIN", "10")))
            print(
                f"drained finished={len(report.finished)} interrupted={len(report.interrupted)} "
                f"left={len(report.left_for_reaper)}",
                flush=True,
            )


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
