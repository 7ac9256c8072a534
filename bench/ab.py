"""A/B: two checkouts' Dispatchers, alternated round by round on one server.

For a refactor whose promise is "same speed": each round runs side A and side B (in
alternating order, so drift on a shared machine falls on both), each in a fresh child
process that imports runrow from its own ``src`` directory and drains the same work on
its own schema. It reports the median over rounds per case and B/A.

    python bench/ab.py --a /path/to/old/src --b src --rounds 6

Cases: ``core cN`` (no-op runs, one conversation each, ``Dispatcher(concurrency=N)``,
runs/s, and the worker process's CPU time per run, which a busy machine disturbs far
less than runs/s), ``full cN`` (the same with two journal events per run), ``wake`` (enqueue commit
to the agent's start on an idle worker with a hub, ms) and ``cancel`` (``cancel_run``
commit to the agent seeing its cancellation, ms). The child uses only API that both
sides share (``enqueue``, ``cancel_run``, ``Dispatcher``, ``migrate``), so any two
checkouts since the split of the engine (#19) and before it can be compared.

``--turn-concurrency 1,16,160`` adds ``turn cN``: the agent-shaped turn of issue #39
(3 ``run.step`` calls, 20 ``run.text`` chunks of 5 characters, ``run.write_message``),
turns/s. If either side has no ``RunContext.step`` (before #20), both sides run the turn
without its steps, and the report says so. ``--concurrency`` sets the drains' in-flight
counts (default 1,4,16); ``--server system`` runs on Debian's stock server (as
bench/run.py; default: runrow.embedded's choice). bench/baseline.py runs this against
the pinned baseline.

``--statements`` says where a difference comes from: the server loads pg_stat_statements,
and each side's statements are summed over its rounds (server time and WAL bytes per
call, and per drained run), matched across sides by their text with the schema name
taken out, largest total difference first. (The counters cost the server a little on
both sides alike; read the ratios from a run without it.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CONCURRENCIES = (1, 4, 16)
STEPS, CHUNKS, CHUNK = 3, 20, "abcde"  # the agent-shaped turn (bench/turn_systems.py)


def _drain_size(runs: int, c: int) -> int:
    """Runs per drain: half of ``runs`` at c=1, ``runs`` x c/4 up to 4 x ``runs`` above."""
    return runs // 2 if c <= 1 else runs * min(max(1, c // 4), 4)


# -- the child: one side, one round ---------------------------------------------------


async def _child(
    conninfo: str, schema: str, runs: int, samples: int, cases: str, opts: dict[str, Any]
) -> dict[str, float]:
    import anyio

    import runrow

    await runrow.migrate(conninfo, schema=schema)
    results: dict[str, float] = {}
    timing = {"poll": 1.0, "lease": 30.0, "heartbeat": 10.0}
    done = [0]
    started: dict[str, float] = {}
    cancelled: dict[str, float] = {}

    async def tool(k: int) -> dict[str, Any]:
        return {"tool": k, "ok": True}

    async def agent(run: runrow.RunContext) -> None:
        op = run.content["op"]
        if op == "turn":
            if opts.get("turn_steps"):
                for k in range(STEPS):
                    await run.step("tool", tool, k)  # type: ignore[attr-defined]  # absent before #20
            for _ in range(CHUNKS):
                await run.text(CHUNK)
            await run.write_message({"text": CHUNK * CHUNKS})
        elif op == "full":
            await run.text("x")
            await run.emit({"type": "tool_call", "name": "noop"})
        elif op == "wake":
            started[str(run.run_id)] = time.monotonic()
        elif op == "hold":
            started[str(run.run_id)] = time.monotonic()
            try:
                await anyio.sleep_forever()
            finally:
                cancelled[str(run.run_id)] = time.monotonic()
        done[0] += 1

    async def enqueue(n: int, op: str, prefix: str) -> None:
        import psycopg

        conns = [await psycopg.AsyncConnection.connect(conninfo, autocommit=True) for _ in range(8)]
        try:

            async def worker(k: int) -> None:
                for i in range(k, n, 8):
                    await runrow.enqueue(
                        conns[k],
                        conversation_id=f"{prefix}{i}",
                        user_id="u",
                        content={"op": op},
                        schema=schema,
                    )

            async with anyio.create_task_group() as tg:
                for k in range(8):
                    tg.start_soon(worker, k)
        finally:
            for c in conns:
                await c.close()

    wanted = set(cases.split(",")) if cases else None
    plan = [("noop", "core", c) for c in opts.get("concurrency", CONCURRENCIES)]
    plan += [("full", "full", c) for c in opts.get("concurrency", CONCURRENCIES)]
    plan += [("turn", "turn", c) for c in opts.get("turn_concurrency", ())]
    for op, label, c in plan:
        case = f"{label} c{c}"
        if wanted is not None and case not in wanted:
            continue
        n = _drain_size(runs, c)
        if op == "turn":  # a turn costs about ten no-op runs' commits
            n = max(2 * c, n // 4)
        await enqueue(n, op, f"{op}{c}-")
        done[0] = 0
        async with runrow.Dispatcher(conninfo, agent, schema=schema, concurrency=c, **timing):
            t0, cpu0 = time.monotonic(), time.process_time()
            while done[0] < n:
                await anyio.sleep(0.002)
            elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
        results[case] = n / elapsed
        results["_drained"] = results.get("_drained", 0.0) + n
        # The worker process's CPU per run: robust to a busy machine, unlike runs/s.
        # (It includes this loop's 2 ms polls: the same on both sides.)
        results[f"{case} cpu us/run"] = cpu / n * 1e6

    if wanted is not None and not wanted & {"wake", "cancel"}:
        return results
    async with runrow.Dispatcher(conninfo, agent, schema=schema, concurrency=4, **timing):
        await anyio.sleep(0.5)  # the hub is listening and the claimer idle
        wakes = []
        for i in range(samples):
            t0 = time.monotonic()
            run = await runrow.enqueue(
                conninfo, conversation_id=f"w{i}", user_id="u", content={"op": "wake"}, schema=schema
            )
            with anyio.fail_after(10):
                while str(run.id) not in started:
                    await anyio.sleep(0.0005)
            wakes.append((started[str(run.id)] - t0) * 1000)
            await anyio.sleep(0.05)
        cancels = []
        for i in range(max(4, samples // 3)):
            run = await runrow.enqueue(
                conninfo, conversation_id=f"h{i}", user_id="u", content={"op": "hold"}, schema=schema
            )
            with anyio.fail_after(10):
                while str(run.id) not in started:
                    await anyio.sleep(0.0005)
            t0 = time.monotonic()
            await runrow.cancel_run(conninfo, run.id, schema=schema)
            with anyio.fail_after(10):
                while str(run.id) not in cancelled:
                    await anyio.sleep(0.0005)
            cancels.append((cancelled[str(run.id)] - t0) * 1000)
    results["wake p50 ms"] = statistics.median(wakes)
    results["cancel p50 ms"] = statistics.median(cancels)
    return results


# -- the parent -------------------------------------------------------------------------


def has_steps(src: Path) -> bool:
    """Whether the runrow under ``src`` has ``RunContext.step`` (issue #20)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = "import runrow; print(hasattr(runrow.RunContext, 'step'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


def _run_side(
    src: Path, conninfo: str, schema: str, runs: int, samples: int, cases: str, opts: dict[str, Any]
) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [
        sys.executable,
        __file__,
        "--child",
        conninfo,
        schema,
        str(runs),
        str(samples),
        cases,
        json.dumps(opts),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"side {src} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _statements(conninfo: str, schema: str) -> dict[str, list[float]]:
    """This schema's statements since the last reset: text (schema taken out) -> [calls,
    server ms, WAL bytes]; pg_stat_statements is reset for the next side."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query, calls, total_exec_time, wal_bytes FROM pg_stat_statements WHERE query LIKE %s",
            (f"%{schema}%",),
        ).fetchall()
        conn.execute("SELECT pg_stat_statements_reset()")
    found: dict[str, list[float]] = {}
    for query, calls, ms, wal in rows:
        text = re.sub(r"--[^\n]*", " ", query.replace(f'"{schema}"', "S").replace(schema, "S"))
        text = " ".join(text.split())
        sums = found.setdefault(text, [0.0, 0.0, 0.0])
        sums[0] += calls
        sums[1] += ms
        sums[2] += float(wal)
    return found


def _print_statements(per: dict[str, dict[str, list[float]]], runs: dict[str, float]) -> None:
    texts = set(per["a"]) | set(per["b"])
    zero = [0.0, 0.0, 0.0]

    def per_run(side: str, text: str) -> float:
        return per[side].get(text, zero)[1] / max(runs[side], 1.0) * 1000.0

    print(f"\nstatements (server time per drained run, us; A {runs['a']:,.0f} runs, B {runs['b']:,.0f})")
    print(
        f"{'A us/run':>9}{'B us/run':>9}{'A calls':>8}{'B calls':>8}{'A us/call':>10}{'B us/call':>10}"
        f"{'A WAL':>7}{'B WAL':>7}  statement (calls and WAL bytes per run)"
    )
    total = {"a": 0.0, "b": 0.0}
    for text in sorted(texts, key=lambda t: -abs(per_run("b", t) - per_run("a", t))):
        a, b = per["a"].get(text, zero), per["b"].get(text, zero)
        total["a"] += per_run("a", text)
        total["b"] += per_run("b", text)
        ca = a[1] / a[0] * 1000.0 if a[0] else 0.0
        cb = b[1] / b[0] * 1000.0 if b[0] else 0.0
        wa = a[2] / max(runs["a"], 1.0)
        wb = b[2] / max(runs["b"], 1.0)
        na = a[0] / max(runs["a"], 1.0)
        nb = b[0] / max(runs["b"], 1.0)
        print(
            f"{per_run('a', text):>9.1f}{per_run('b', text):>9.1f}{na:>8.2f}{nb:>8.2f}{ca:>10.1f}{cb:>10.1f}"
            f"{wa:>7.0f}{wb:>7.0f}  {text[:100]}"
        )
    print(f"{total['a']:>9.1f}{total['b']:>9.1f}  (all statements)")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--a", required=True, type=Path, help="side A's src directory (the baseline)")
    parser.add_argument("--b", required=True, type=Path, help="side B's src directory")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=1200, help="runs drained per case at c=4 (scaled by c)")
    parser.add_argument("--samples", type=int, default=30, help="wake samples per round (a third for cancel)")
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    parser.add_argument(
        "--cases", default="", help="only these, comma-separated (e.g. 'core c1,core c16,wake')"
    )
    parser.add_argument(
        "--concurrency", default="1,4,16", help="in-flight counts of the core and full drains"
    )
    parser.add_argument(
        "--turn-concurrency", default="", help="in-flight counts of the agent-shaped turn (none)"
    )
    parser.add_argument("--server", help="as bench/run.py: system, embedded or a directory")
    parser.add_argument(
        "--statements", action="store_true", help="per-statement server time and WAL of each side"
    )
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runrow.embedded import EmbeddedPostgres

    opts: dict[str, Any] = {
        "concurrency": [int(c) for c in args.concurrency.split(",") if c],
        "turn_concurrency": [int(c) for c in args.turn_concurrency.split(",") if c],
    }
    if opts["turn_concurrency"]:
        steps = {"a": has_steps(args.a.resolve()), "b": has_steps(args.b.resolve())}
        opts["turn_steps"] = all(steps.values())
        if not opts["turn_steps"]:
            lacking = " and ".join(side.upper() for side, ok in steps.items() if not ok)
            print(
                f"turn: side {lacking} has no run.step: both sides run the turn without its 3 steps",
                flush=True,
            )
    bin_dir = None
    if args.server:
        from run import bin_dir as find_bin_dir

        bin_dir = find_bin_dir(args.server)
    per: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
    stmts: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
    drained = {"a": 0.0, "b": 0.0}
    settings = {"shared_preload_libraries": "pg_stat_statements"} if args.statements else None
    with EmbeddedPostgres(bin_dir=bin_dir, settings=settings) as pg:
        conninfo = pg.conninfo()
        if args.statements:
            import psycopg

            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
        for r in range(args.rounds):
            order = ("a", "b") if r % 2 == 0 else ("b", "a")
            for side in order:
                src = args.a if side == "a" else args.b
                got = _run_side(
                    src.resolve(), conninfo, f"ab_{side}{r}", args.runs, args.samples, args.cases, opts
                )
                for case, value in got.items():
                    per[side].setdefault(case, []).append(value)
                if args.statements:
                    for text, sums in _statements(conninfo, f"ab_{side}{r}").items():
                        into = stmts[side].setdefault(text, [0.0, 0.0, 0.0])
                        for i, v in enumerate(sums):
                            into[i] += v
                    drained[side] += got.get("_drained", 0.0)
                print(
                    f"round {r + 1} {side}: "
                    + ", ".join(f"{k} {v:,.1f}" for k, v in got.items() if not k.startswith("_")),
                    flush=True,
                )
    print(f"\n{'case':<16}{'A median':>12}{'B median':>12}{'B/A':>8}   A rounds | B rounds")
    summary: dict[str, Any] = {}
    if args.statements:
        _print_statements(stmts, drained)
    for case in per["a"]:
        if case.startswith("_"):
            continue
        a, b = statistics.median(per["a"][case]), statistics.median(per["b"][case])
        summary[case] = {"a": per["a"][case], "b": per["b"][case], "ratio": b / a}
        fa = " ".join(f"{v:,.0f}" if v > 50 else f"{v:.1f}" for v in per["a"][case])
        fb = " ".join(f"{v:,.0f}" if v > 50 else f"{v:.1f}" for v in per["b"][case])
        print(f"{case:<16}{a:>12,.1f}{b:>12,.1f}{b / a:>8.3f}   {fa} | {fb}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "a": str(args.a),
                    "b": str(args.b),
                    "turn_steps": opts.get("turn_steps"),
                    "server": str(pg.bin_dir),
                    "cases": summary,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        import anyio

        conninfo, schema, runs, samples, cases = (
            sys.argv[2],
            sys.argv[3],
            int(sys.argv[4]),
            int(sys.argv[5]),
            sys.argv[6],
        )
        child_opts = json.loads(sys.argv[7]) if len(sys.argv) > 7 else {}
        figures = anyio.run(_child, conninfo, schema, runs, samples, cases, child_opts, backend="asyncio")
        print(json.dumps(figures), flush=True)
        sys.exit(0)
    sys.exit(main())
