"""A benchmark child process: a runrow worker, or a raw LISTEN loop, driven over stdin/stdout.

    python bench/child.py worker '{"conninfo": ..., "schema": ..., ...}'
    python bench/child.py listen '{"conninfo": ..., "channel": ...}'

It prints ``READY`` when it can be measured, event lines (``START <run> <t>``,
``CANCELLED <run> <t>``, ``GOT <t>``; ``t`` is ``time.monotonic()``, which is one
system-wide clock on Linux, so the parent can subtract its own readings), and
``RESULT <json>`` after ``stop`` arrives on stdin. What a run's agent does is chosen
by the run's content (``{"op": ...}``), so one worker serves every scenario.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import sys
import time
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

import runrow


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def rss_kb(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class State:
    def __init__(self) -> None:
        self.t_first: float | None = None
        self.commit_ms: list[float] = []
        self.committed: dict[str, float] = {}
        # fanout: this process's CPU from the release to the last run's append returning
        self.fanout_runs = 0
        self.cpu_release: float | None = None
        self.cpu_committed: float | None = None
        self.go = anyio.Event()
        self.release = anyio.Event()
        self.stop = anyio.Event()


async def agent_for(state: State, run: runrow.RunContext) -> None:
    now = time.monotonic()
    if state.t_first is None:
        state.t_first = now
    spec: dict[str, Any] = run.content if isinstance(run.content, dict) else {"op": "noop"}
    op = spec.get("op", "noop")
    if op == "noop":
        return
    if op == "full":  # two journal events: one delta, one tool event
        await run.text("x")
        await run.emit({"type": "tool_call", "name": "noop"})
        return
    if op == "start":
        out(f"START {run.run_id} {now:.6f}")
        return
    if op == "hold":
        out(f"START {run.run_id} {now:.6f}")
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            out(f"CANCELLED {run.run_id} {time.monotonic():.6f}")
            raise
    if op == "ticks":  # structural events, written at once: the append->tail path
        await state.release.wait()
        for _ in range(int(spec["n"])):
            await run.emit({"type": "tick", "t": time.monotonic()})
            await anyio.sleep(float(spec["every"]))
        return
    if op == "deltas":  # n text deltas evenly over the given seconds
        n, seconds = int(spec["n"]), float(spec["seconds"])
        burst = max(1, n // max(1, int(seconds / 0.01)))
        start = time.monotonic()
        sent = 0
        while sent < n:
            for _ in range(min(burst, n - sent)):
                await run.text("tok ")
                sent += 1
            await anyio.sleep_until(start + seconds * sent / n)
        return
    if op == "stream":  # deltas all along, a structural event now and then (timed: commit latency)
        seconds, every, probe = float(spec["seconds"]), float(spec["every"]), float(spec["probe"])
        await state.release.wait()
        end = time.monotonic() + seconds
        next_probe = time.monotonic() + probe
        while time.monotonic() < end:
            await run.text("tok ")
            if time.monotonic() >= next_probe:
                t0 = time.monotonic()
                await run.emit({"type": "tool_call", "name": "probe"})
                state.commit_ms.append((time.monotonic() - t0) * 1000)
                next_probe += probe
            await anyio.sleep(every)
        return
    if op == "fanout":  # a live run: a first event, quiet until released, then one stamped event
        await run.emit({"type": "ready"})
        await state.release.wait()
        t = time.monotonic()
        await run.emit({"type": "ping", "t": t})
        state.committed[str(run.run_id)] = time.monotonic()  # when the append returned
        if len(state.committed) == state.fanout_runs:
            state.cpu_committed = time.process_time()
        await state.stop.wait()
        return
    raise ValueError(f"unknown op {op!r}")


async def read_commands(state: State) -> None:
    stdin = anyio.wrap_file(sys.stdin)
    async for line in stdin:
        cmd = line.strip()
        if cmd == "go":
            state.go.set()
        elif cmd == "release":
            state.cpu_release = time.process_time()
            state.release.set()
        elif cmd == "stop":
            state.stop.set()
            state.release.set()
            state.go.set()
            return
    state.stop.set()
    state.release.set()
    state.go.set()


async def worker(args: dict[str, Any]) -> None:
    state = State()
    state.fanout_runs = int(args.get("concurrency", 0))
    pool: AsyncConnectionPool[psycopg.AsyncConnection] | None = None
    db: Any = args["conninfo"]
    if args.get("pool_size"):
        pool = AsyncConnectionPool(
            args["conninfo"],
            min_size=1,
            max_size=int(args["pool_size"]),
            open=False,
            kwargs={"autocommit": True},
        )
        await pool.open(wait=True)
        db = pool
    opts = {
        k: args[k]
        for k in (
            "concurrency",
            "poll",
            "heartbeat",
            "lease",
            "notifications",
            "flush_interval",
        )
        if k in args
    }
    last = {"completed": 0, "t": 0.0}
    async with anyio.create_task_group() as tg:
        tg.start_soon(read_commands, state)
        if args.get("wait_go"):
            out("READY")
            await state.go.wait()
        idle_rss = rss_kb()

        async def agent(run: runrow.RunContext) -> None:
            await agent_for(state, run)

        d = runrow.Dispatcher(db, agent, schema=args["schema"], **opts)
        if "journal_notify" in args:
            # A benchmark switch, not a constructor option: measures what the NOTIFY costs.
            d._settings = dataclasses.replace(d.settings, journal_notify=bool(args["journal_notify"]))
        async with d:
            if not args.get("wait_go"):
                out("READY")
            idle_rss = max(idle_rss, rss_kb())
            while not state.stop.is_set():
                stats = d.get_stats()
                done = stats["completed"] + stats["failed"] + stats["cancelled"]
                if done != last["completed"]:
                    last["completed"], last["t"] = done, time.monotonic()
                with anyio.move_on_after(0.002):
                    await state.stop.wait()
            report = await d.stop(5.0)
        tg.cancel_scope.cancel()
    if pool is not None:
        await pool.close()
    out(
        "RESULT "
        + json.dumps(
            {
                "t_first": state.t_first,
                "t_last": last["t"] or None,
                "completed": last["completed"],
                "stats": d.get_stats(),
                "commit_ms": state.commit_ms,
                "committed": state.committed,
                "emit_cpu_us": (
                    (state.cpu_committed - state.cpu_release) / len(state.committed) * 1e6
                    if state.cpu_committed is not None and state.cpu_release is not None
                    else None
                ),
                "idle_rss_kb": idle_rss,
                "peak_rss_kb": rss_kb("VmHWM"),
                "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "cpu_s": time.process_time(),
                "interrupted": len(report.interrupted),
            }
        )
    )


async def listen(args: dict[str, Any]) -> None:
    """The raw baseline: one autocommit connection, LISTEN, report each notification's arrival."""
    state = State()
    async with await psycopg.AsyncConnection.connect(args["conninfo"], autocommit=True) as conn:
        await conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(args["channel"])))
        out("READY")
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_commands, state)

            async def watch() -> None:
                async for _ in conn.notifies():
                    out(f"GOT {time.monotonic():.6f}")

            tg.start_soon(watch)
            await state.stop.wait()
            tg.cancel_scope.cancel()
    out("RESULT {}")


def main() -> None:
    mode, raw = sys.argv[1], sys.argv[2]
    args = json.loads(raw)
    fn = {"worker": worker, "listen": listen}[mode]
    anyio.run(fn, args, backend="asyncio")


if __name__ == "__main__":
    main()
