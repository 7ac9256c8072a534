"""The agent-shaped turn (issue #39 point 3): runrow against DBOS Transact, Absurd and LangGraph.

    python bench/agent_turn.py [--server system] [--concurrency 1,16,160] [--turns 200]
                               [--reps 3] [--systems runrow,dbos,absurd,langgraph]
                               [--json bench/results/agent-turn.json]

A turn = 3 durable steps (each returns a small dict), 20 streamed chunks of 5
characters where the system can stream, and a recorded answer (bench/turn_systems.py
has each system's version of it). One PostgreSQL server for all (default durability;
``--server system`` is Debian's stock server), each system in its own database, each
measurement in a fresh child process. A measurement drains ``max(turns, 2 x C)`` turns
with at most C in flight. Rounds interleave the systems (the order rotates every
round); the table gives the median over rounds, and min-max.

Per turn, for the whole measurement (the system's enqueue, start-up, drain and shutdown,
so a few start-up commits are spread over the turns):

* turns/s — turns / the drain's seconds (first turn started to last turn ended);
* WAL bytes — the server's ``pg_current_wal_lsn()`` delta (only one system runs at once);
* commits — ``pg_stat_database.xact_commit`` delta of the system's database, read
  once the child has exited and the figure has stopped moving (a backend's counters
  reach the view when it exits, or up to seconds later while it is alive);
* rows — ``n_tup_ins + n_tup_upd + n_tup_del`` summed over ``pg_stat_user_tables``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

BENCH_DIR = Path(__file__).resolve().parent
SYSTEMS = ("runrow", "dbos", "absurd", "langgraph")
DISTS = {"runrow": "runrow", "dbos": "dbos", "absurd": "absurd-sdk", "langgraph": "langgraph"}
LACKS = {
    "runrow": "",
    "dbos": "",
    "absurd": "no client stream (the 20 chunks are not sent)",
    "langgraph": "no queue (a driver runs C turns at once); stream not stored",
}


def _db(conninfo: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(conninfo, dbname=dbname)


def _url(conninfo: str) -> str:
    d = psycopg.conninfo.conninfo_to_dict(conninfo)
    return f"postgresql://{d.get('user', 'postgres')}@{d.get('host', '127.0.0.1')}:{d.get('port', 5432)}/{d['dbname']}"


def _one(conninfo: str, query: str, params: tuple[Any, ...] = ()) -> Any:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
        return row[0] if row else None


def installed(system: str) -> bool:
    mod = {"runrow": "runrow", "dbos": "dbos", "absurd": "absurd_sdk", "langgraph": "langgraph.graph"}[system]
    try:
        __import__(mod)
        if system == "absurd":
            __import__("absurdctl")  # its schema SQL ships in absurdctl (PyPI), same version
        if system == "langgraph":
            __import__("langgraph.checkpoint.postgres.aio")
    except ImportError:
        return False
    return True


# -- counters ---------------------------------------------------------------------------


def _stats(admin: str, dbname: str) -> tuple[int, int]:
    """(xact_commit, tup_inserted + tup_updated + tup_deleted) of one database."""
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted FROM pg_stat_database WHERE datname = %s",
            (dbname,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _settled(admin: str, dbname: str, timeout: float = 15.0) -> int:
    """The database's xact_commit once it has stopped moving (read 0.3 s apart)."""
    last = _stats(admin, dbname)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = _stats(admin, dbname)
        if now == last:
            break
        last = now
    return last[0]


def _rows(conninfo: str) -> int:
    return int(
        _one(conninfo, "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables")
    )


def _quiesce(admin: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _one(admin, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"):
            return
        time.sleep(0.05)


# -- each system's fresh state ----------------------------------------------------------


def _child(system: str, args: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    cmd = [sys.executable, str(BENCH_DIR / "turn_systems.py"), system, json.dumps(args)]
    (BENCH_DIR / "results").mkdir(exist_ok=True)
    with open(BENCH_DIR / "results" / f"child-turn-{system}.log", "ab") as err:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, timeout=timeout, check=False)
    lines = [ln for ln in out.stdout.decode().splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(
            f"{system} child failed (exit {out.returncode}); see bench/results/child-turn-{system}.log"
        )
    return json.loads(lines[-1][len("RESULT ") :])  # type: ignore[no-any-return]


def setup(admin: str, systems: list[str]) -> dict[str, str]:
    """Creates one database per system and installs what each needs once (outside every
    measurement): Absurd's schema, DBOS's system tables (a first launch), LangGraph's."""
    dbs = {s: _db(admin, f"turn_{s}") for s in systems}
    with psycopg.connect(admin, autocommit=True) as conn:
        for s in systems:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(f"turn_{s}"))
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(f"turn_{s}")))
    if "absurd" in dbs:
        from absurdctl import BUNDLED_SCHEMA_SQL  # absurd.sql of the same release (0.5.1)

        with psycopg.connect(dbs["absurd"], autocommit=True) as conn:
            conn.execute(BUNDLED_SCHEMA_SQL)  # type: ignore[arg-type]
    if "dbos" in dbs:
        _child("dbos", {"url": _url(dbs["dbos"]), "conninfo": dbs["dbos"], "n": 0, "c": 1})
    if "langgraph" in dbs:
        _child("langgraph", {"conninfo": dbs["langgraph"], "n": 0, "c": 1, "setup": True})
    return dbs


def fresh(system: str, conninfo: str, tag: str) -> dict[str, Any]:
    """Empties the system's tables (or makes a fresh schema) and returns the child's args."""
    if system == "runrow":
        import runrow

        schema = f"turn_{tag}"
        asyncio.run(runrow.migrate(conninfo, schema=schema))
        return {"conninfo": conninfo, "schema": schema}
    with psycopg.connect(conninfo, autocommit=True) as conn:
        if system == "absurd":
            conn.execute("SELECT absurd.drop_queue('turns')")
            conn.execute("SELECT absurd.create_queue('turns')")
            return {"conninfo": conninfo, "queue": "turns"}
        schema = {"dbos": "dbos", "langgraph": "public"}[system]
        names = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename NOT LIKE '%%migration%%'",
                (schema,),
            )
        ]
        if names:
            conn.execute(
                sql.SQL("TRUNCATE {} CASCADE").format(
                    sql.SQL(", ").join(sql.Identifier(schema, n) for n in names)
                )
            )
        conn.execute("VACUUM ANALYZE")
    if system == "dbos":
        return {"url": _url(conninfo), "conninfo": conninfo}
    return {"conninfo": conninfo}


def drop(system: str, conninfo: str, args: dict[str, Any]) -> None:
    if system == "runrow":
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(args["schema"])))


# -- one measurement, the rounds --------------------------------------------------------


def measure_one(admin: str, system: str, conninfo: str, n: int, c: int, tag: str) -> dict[str, Any]:
    dbname = psycopg.conninfo.conninfo_to_dict(conninfo)["dbname"]
    args = {**fresh(system, conninfo, tag), "n": n, "c": c}
    try:
        _quiesce(admin)
        rows0 = _rows(conninfo)
        xact0 = _settled(admin, dbname)
        lsn0 = _one(admin, "SELECT pg_current_wal_lsn()::text")
        got = _child(system, args)
        xact1 = _settled(admin, dbname)
        wal = int(_one(admin, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (lsn0,)))
        rows1 = _rows(conninfo)
    finally:
        drop(system, conninfo, args)
    turns = got["turns"] or 1
    got.update(
        n=n,
        c=c,
        turns_per_s=(got["turns"] / got["seconds"]) if got["seconds"] else None,
        wal_per_turn=wal / turns,
        commits_per_turn=(xact1 - xact0) / turns,
        rows_per_turn=(rows1 - rows0) / turns,
    )
    return got


def measure(
    admin: str, systems: list[str], concurrencies: list[int], turns: int, reps: int, log: Any = None
) -> dict[str, Any]:
    """Every system at every C, ``reps`` interleaved rounds; returns the JSON report."""
    systems = [s for s in systems if installed(s)]
    dbs = setup(admin, systems)
    raw: dict[str, dict[int, list[dict[str, Any]]]] = {s: {c: [] for c in concurrencies} for s in systems}
    for rep in range(reps):
        for c in concurrencies:
            k = (rep + concurrencies.index(c)) % len(systems)
            for s in systems[k:] + systems[:k]:
                got = measure_one(admin, s, dbs[s], max(turns, 2 * c), c, f"{rep}_{c}")
                raw[s][c].append(got)
                if log:
                    log(
                        f"round {rep + 1} c={c} {s}: {got['turns_per_s'] or 0:,.1f} turns/s, "
                        f"{got['wal_per_turn']:,.0f} WAL B, {got['commits_per_turn']:.1f} commits, "
                        f"{got['rows_per_turn']:.1f} rows per turn"
                    )
    return {"systems": systems, "concurrencies": concurrencies, "reps": reps, "results": _summarise(raw)}


def _summarise(raw: dict[str, dict[int, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s, per_c in raw.items():
        out[s] = {}
        for c, runs in per_c.items():
            entry: dict[str, Any] = {"version": runs[0]["version"] if runs else None, "reps": runs}
            for key in ("turns_per_s", "wal_per_turn", "commits_per_turn", "rows_per_turn"):
                vals = [r[key] for r in runs if r[key] is not None]
                if vals:
                    entry[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
            entry["step_calls"] = sum(r["step_calls"] for r in runs)
            entry["steps_expected"] = sum(r["turns"] for r in runs) * 3
            out[s][str(c)] = entry
    return out


def _f(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def table(report: dict[str, Any]) -> str:
    """The Markdown table: a row per system and C, and runrow / the best peer at each C."""
    res = report["results"]
    lines = [
        "| system | C | turns/s (median) | min-max | WAL B/turn | commits/turn | rows/turn | step bodies run / turns x 3 | does not |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in report["systems"]:
        for c in report["concurrencies"]:
            e = res[s][str(c)]
            tp = e.get("turns_per_s")
            if tp is None:
                continue
            lines.append(
                f"| {s} {e['version']} | {c} | {_f(tp['median'])} | {_f(tp['min'])}-{_f(tp['max'])} | "
                f"{_f(e['wal_per_turn']['median'])} | {e['commits_per_turn']['median']:.1f} | "
                f"{e['rows_per_turn']['median']:.1f} | {e['step_calls']} / {e['steps_expected']} | {LACKS[s]} |"
            )
    peers = [s for s in report["systems"] if s != "runrow"]
    if "runrow" in res and peers:
        lines.append("")
        lines.append("| C | runrow turns/s | best peer | runrow / best peer |")
        lines.append("|---:|---:|---|---:|")
        for c in report["concurrencies"]:
            mine = res["runrow"][str(c)].get("turns_per_s")
            best = max(
                (
                    (p, res[p][str(c)]["turns_per_s"]["median"])
                    for p in peers
                    if res[p][str(c)].get("turns_per_s")
                ),
                key=lambda x: x[1],
                default=None,
            )
            if mine and best:
                lines.append(
                    f"| {c} | {_f(mine['median'])} | {best[0]} {_f(best[1])} | {mine['median'] / best[1]:.2f} |"
                )
    return "\n".join(lines)


def rows(report: dict[str, Any]) -> list[Any]:
    """bench/run.py's rows: turns/s per system and C; runrow's ratio is against the best
    peer at that C; the note carries the per-turn WAL, commits and rows."""
    from lib import Row

    res, out = report["results"], []
    for c in report["concurrencies"]:
        best = max(
            (
                (p, res[p][str(c)]["turns_per_s"]["median"])
                for p in report["systems"]
                if p != "runrow" and res[p][str(c)].get("turns_per_s")
            ),
            key=lambda x: x[1],
            default=None,
        )
        for s in report["systems"]:
            e = res[s][str(c)]
            tp = e.get("turns_per_s")
            if tp is None:
                continue
            note = (
                f"{_f(e['wal_per_turn']['median'])} WAL B, {e['commits_per_turn']['median']:.1f} commits, "
                f"{e['rows_per_turn']['median']:.1f} rows per turn" + (f"; {LACKS[s]}" if LACKS[s] else "")
            )
            mine = s == "runrow" and best is not None
            out.append(
                Row(
                    "agent_turn",
                    f"{s} {e['version']} c={c}",
                    tp["median"],
                    "turns/s",
                    tp["min"],
                    tp["max"],
                    best[1] if mine and best else None,
                    f"best peer: {best[0]}" if mine and best else "",
                    tp["median"] / best[1] if mine and best else None,
                    note=note,
                    samples=[r["turns_per_s"] or 0.0 for r in e["reps"]],
                )
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--server", help="as bench/run.py: system, embedded or a directory (default: runrow.embedded's)"
    )
    parser.add_argument("--concurrency", default="1,16,160")
    parser.add_argument("--turns", type=int, default=200, help="turns per measurement (at least 2 x C)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(BENCH_DIR))
    from run import server, server_meta

    wanted = args.systems.split(",")
    missing = [s for s in wanted if not installed(s)]
    if missing:
        print(f"not installed (pip install -e '.[turn-peers]'): {', '.join(missing)}", file=sys.stderr)
    with server(args.server) as pg:
        admin = pg.conninfo(via_tcp=True)
        meta = asyncio.run(server_meta(admin))
        t0 = time.monotonic()
        report = measure(
            admin,
            wanted,
            [int(c) for c in args.concurrency.split(",")],
            args.turns,
            args.reps,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    report["meta"] = {
        "server": meta,
        "bin_dir": str(pg.bin_dir),
        "seconds": round(time.monotonic() - t0, 1),
        "machine": f"{os.cpu_count()} CPUs",
        "missing": missing,
    }
    print(
        f"# The agent-shaped turn: {args.reps} rounds, PostgreSQL {meta['server_version']} "
        f"({pg.bin_dir}), fsync={meta['fsync']}, synchronous_commit={meta['synchronous_commit']}, "
        f"jit={meta['jit']}\n"
    )
    print(table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
