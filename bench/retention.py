"""Retention at scale: what one `trim` pass costs over a journal of days of traffic.

Loads DAYS days of finished runs (RUNS_PER_DAY runs a day, EVENTS events each, made
evenly over the days, each run's id made at its creation time) into a fresh schema, then
times `runrow.trim(retention=24h)` and reports what it left: the WAL it wrote, the dead
tuples on the journal that stays (pgstattuple, exact), the rows and partitions gone, and
the journal's size before and after. Run it once per checkout to compare (the checkout
before the partitioned journal deletes row by row):

    python bench/retention.py --src src                  # this checkout
    python bench/retention.py --src /tmp/before/src      # a baseline

Each run starts its own server (Debian's PostgreSQL by default; --server as bench/run.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

LOAD = """
WITH g AS (
    SELECT i, now() - make_interval(days => %(days)s) + (i::float8 / %(runs)s) * make_interval(days => %(days)s) AS made
    FROM generate_series(0, %(runs)s - 1) i
), m AS (
    INSERT INTO {s}.message (conversation_id, role, content, status, user_id)
    SELECT 'c' || i, 'user', '"q"', 'sent', 'u' || (i %% 100) FROM g
    RETURNING id, conversation_id
)
INSERT INTO {s}.agent_run (id, conversation_id, user_id, user_message_id, status, created_at, started_at, finished_at)
SELECT {make_id}, m.conversation_id, 'u', m.id, 'completed', g.made, g.made, g.made + interval '1 minute'
FROM m JOIN g ON m.conversation_id = 'c' || g.i
"""

EVENTS = """
INSERT INTO {s}.run_event (run_id, seq, type, payload, created_at)
SELECT r.id, s, CASE WHEN s = %(events)s THEN 'complete' ELSE 'content_delta' END,
       jsonb_build_object('text', repeat('x', 20 + (s * 7) %% 120)), r.created_at
FROM {s}.agent_run r CROSS JOIN generate_series(1, %(events)s) s
"""

STEPS = """
INSERT INTO {s}.run_step (lineage_id, key, occurrence, position, run_id, status, idempotent, result, recorded_at)
SELECT r.id, 'tool', s - 1, s - 1, r.id, 'recorded', false, jsonb_build_object('out', repeat('y', 40)), r.created_at
FROM {s}.agent_run r CROSS JOIN generate_series(1, %(steps)s) s
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src")
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--runs-per-day", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=100, help="events per run")
    parser.add_argument("--steps", type=int, default=0, help="step records per run (each its own lineage)")
    parser.add_argument("--server", default="/usr/lib/postgresql/15/bin")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--split",
        action="store_true",
        help="time trim's per-run pass and its partition drop apart (this checkout only)",
    )
    parser.add_argument(
        "--erase-requests",
        action="store_true",
        help="trim with erase_requests (the per-run pass over every run; schema 28 on)",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(args.src.resolve()))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    print(json.dumps(asyncio.run(_measure(args)), indent=2))


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    from datetime import timedelta

    import psycopg
    from psycopg import sql

    import runrow
    from runrow.embedded import EmbeddedPostgres

    settings = {"shared_buffers": "512MB", "max_wal_size": "8GB", "checkpoint_timeout": "30min"}
    with EmbeddedPostgres(bin_dir=args.server, settings=settings) as pg:
        url = pg.conninfo()
        await runrow.migrate(url)
        s = sql.Identifier("runrow")
        partitioned = runrow.latest_version() >= 20
        runs = args.days * args.runs_per_day
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            if partitioned:  # partitions from DAYS ago: the load makes runs in the past
                from lib import journal_partitions_from

                await journal_partitions_from(conn, "runrow", timedelta(days=args.days))
            make_id = (
                sql.SQL("{}.run_id_at(g.made)").format(s) if partitioned else sql.SQL("gen_random_uuid()")
            )
            started = time.perf_counter()
            await conn.execute(sql.SQL(LOAD).format(s=s, make_id=make_id), {"days": args.days, "runs": runs})
            await conn.execute(sql.SQL(EVENTS).format(s=s), {"events": args.events})
            if args.steps:
                await conn.execute(sql.SQL(STEPS).format(s=s), {"steps": args.steps})
            await conn.execute("VACUUM (ANALYZE)")
            await conn.execute("CHECKPOINT")
            loaded = time.perf_counter() - started
            size_before = await _one(conn, sql.SQL("SELECT {}").format(_journal_size(s)))
            wal_before = await _one(conn, "SELECT pg_current_wal_lsn()")
            started = time.perf_counter()
            if args.split:  # runrow.trim's two halves, timed apart (its own code, in order)
                result, runs_seconds = await _trim_split(url, args.erase_requests)
            elif args.erase_requests:
                result = await runrow.trim(
                    url, retention=timedelta(hours=24), batch=1000, erase_requests=True
                )
            else:
                result = await runrow.trim(url, retention=timedelta(hours=24), batch=1000)
            took = time.perf_counter() - started
            wal = await _one(conn, "SELECT pg_current_wal_lsn() - %s::pg_lsn", (str(wal_before),))
            left = await _one(conn, sql.SQL("SELECT count(*) FROM {}.run_event").format(s))
            dead = 0
            tables = await (
                await conn.execute(
                    "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = 'runrow' AND c.relkind = 'r' AND c.relname LIKE 'run_event%%'"
                )
            ).fetchall()
            for (table,) in tables:
                dead += await _one(conn, "SELECT dead_tuple_count FROM pgstattuple(%s)", (table,))
            size_after = await _one(conn, sql.SQL("SELECT {}").format(_journal_size(s)))
            steps_left = await _one(conn, sql.SQL("SELECT count(*) FROM {}.run_step").format(s))
            steps_dead = await _one(conn, "SELECT dead_tuple_count FROM pgstattuple('runrow.run_step')")
            started = time.perf_counter()
            await conn.execute(sql.SQL("VACUUM {}.run_event").format(s))
            vacuum = time.perf_counter() - started
    report = {
        "src": str(args.src),
        "partitioned": partitioned,
        "events_loaded": runs * args.events,
        "runs_loaded": runs,
        "steps_loaded": runs * args.steps,
        "load_seconds": round(loaded, 1),
        "trim_seconds": round(took, 2),
        **({"trim_per_run_pass_seconds": round(runs_seconds, 2)} if args.split else {}),
        "erase_requests": args.erase_requests,
        "trim_runs": result.runs,
        "trim_events_deleted_row_by_row": result.events,
        "trim_partitions_dropped": getattr(result, "partitions", 0),
        "events_left": left,
        "trim_wal_bytes": int(wal),
        "dead_tuples_left_on_the_journal": dead,
        "steps_left": steps_left,
        "dead_tuples_left_on_run_step": steps_dead,
        "journal_bytes_before": size_before,
        "journal_bytes_after": size_after,
        "vacuum_after_seconds": round(vacuum, 2),
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


async def _trim_split(url: str, erase_requests: bool) -> tuple[Any, float]:
    """What runrow.trim does (24 h, batches of 1,000), with the per-run pass timed alone
    (its own two halves, called in its order). A checkout before schema 28 has no
    horizon: its per-run pass takes every run, and its drop returns a count alone."""
    import inspect

    from runrow import TrimResult
    from runrow._retention import drop_expired_partitions, trim_runs

    extra = (
        {"erase_requests": erase_requests}
        if "erase_requests" in inspect.signature(trim_runs).parameters
        else {}
    )
    started = time.perf_counter()
    runs, events = await trim_runs(
        url, schema="runrow", retention_seconds=86400, batch=1000, now=None, **extra
    )
    pass_seconds = time.perf_counter() - started
    dropped = await drop_expired_partitions(url, schema="runrow", retention_seconds=86400, now=None)
    if isinstance(dropped, tuple):  # (partitions, runs trimmed by the horizon)
        return TrimResult(runs + dropped[1], events, dropped[0]), pass_seconds
    return TrimResult(runs, events, dropped), pass_seconds


def _journal_size(s: Any) -> Any:
    from psycopg import sql

    return sql.SQL(
        "(SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'runrow' AND c.relkind = 'r' AND c.relname LIKE 'run_event%%')"
    )


async def _one(conn: Any, query: Any, params: Any = None) -> Any:
    row = await (await conn.execute(query, params)).fetchone()
    return row[0]


if __name__ == "__main__":
    main()
