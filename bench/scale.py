"""The journal at scale (#44 point 4): the same operations at two journal sizes.

Grows a journal in SQL at a realistic shape (runs of 10-2,000 events, log-uniform, so
most are short; four tenants; runs made over the last three days, each id made at its
creation time; a queued backlog of 2,000), then times each operation, repeated, with
runrow's own API or statements:

  enqueue              runrow.enqueue on a pool
  claim                the fair claim of one queued run (runrow's gateway)
  tail first read      a finished run of about 200 events, read whole by runrow.tail
  tail live wake       an append (and its NOTIFY) to the tail holding it
  queue_position       runrow.queue_position of a run mid-backlog
  dashboard page 1     the admin's runs list, newest first (admin_list_runs)
  dashboard page 200   the same after a keyset cursor 10,000 runs deep
  trim                 runrow.trim(retention=24h), once, last

and reports the database's size, the journal's, a trim's WAL and the dead tuples it leaves
on the journal (pgstattuple). ``--compare`` runs two sizes, each on its own server, and
prints each operation's ratio big/small (the issue's goal: within 1.5x).

    python bench/scale.py --compare 100000 10000000 --json bench/results/scale.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

AVG_EVENTS = 375  # the mean of a log-uniform 10..2000

LOAD_RUNS = """
WITH g AS (
    SELECT i, now() - interval '3 days' + (i::float8 / %(runs)s) * interval '3 days' AS made
    FROM generate_series(0, %(runs)s - 1) i
), m AS (
    INSERT INTO {s}.message (conversation_id, role, content, status, user_id)
    SELECT 'c' || (i / 3), 'user', '"q"', 'sent', 'u' || (i %% 97) FROM g
    RETURNING id, conversation_id, 't' || (abs(hashtext(conversation_id)) %% 4) AS tenant_id
), r AS (
    INSERT INTO {s}.agent_run (id, conversation_id, user_id, tenant_id, user_message_id, status,
                               created_at, started_at, finished_at)
    SELECT {s}.run_id_at(g.made), m.conversation_id, 'u', m.tenant_id, m.id, 'completed',
           g.made, g.made, g.made + interval '1 minute'
    FROM (SELECT *, row_number() OVER () AS k FROM m) m
    JOIN (SELECT *, row_number() OVER () AS k FROM g) g USING (k)
    RETURNING id, created_at
)
SELECT count(*) FROM r
"""

LOAD_EVENTS = """
INSERT INTO {s}.run_event (run_id, seq, type, payload, created_at)
SELECT r.id, s, CASE WHEN s = e.n THEN 'complete' ELSE 'content_delta' END,
       CASE WHEN s = e.n THEN '{{"status": "completed"}}'::jsonb
            ELSE jsonb_build_object('delta', repeat('w', 20 + (s * 37) %% 180)) END,
       r.created_at
FROM {s}.agent_run r
-- (The length is drawn per run: the lateral names r, so it is not evaluated once.)
CROSS JOIN LATERAL (SELECT greatest(10, least(2000, floor(10 * exp(random() * ln(200)))))::int
                    + (r.created_at IS NULL)::int AS n) e
CROSS JOIN LATERAL generate_series(1, e.n) s
WHERE r.status = 'completed'
"""


async def _timed(fn: Any, n: int) -> dict[str, float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "median_ms": round(statistics.median(samples), 3),
        "p95_ms": round(samples[int(len(samples) * 0.95) - 1], 3),
    }


async def measure(events: int, server: str, dashboard_indexes: bool = False) -> dict[str, Any]:
    import psycopg
    from lib import journal_partitions_from, statement
    from psycopg import sql
    from psycopg_pool import AsyncConnectionPool

    import runrow
    from runrow._gateway import claims, journal
    from runrow._names import Channels
    from runrow.embedded import EmbeddedPostgres

    settings = {"shared_buffers": "1GB", "max_wal_size": "16GB", "checkpoint_timeout": "30min"}
    with EmbeddedPostgres(bin_dir=server, settings=settings) as pg:
        url = pg.conninfo()
        await runrow.migrate(url)
        s = sql.Identifier("runrow")
        out: dict[str, Any] = {"events_target": events, "dashboard_indexes": dashboard_indexes}
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            # Partitions from three days ago: the load makes runs in the past.
            await journal_partitions_from(conn, "runrow", timedelta(days=3))
            started = time.perf_counter()
            await conn.execute(sql.SQL(LOAD_RUNS).format(s=s), {"runs": max(10, events // AVG_EVENTS)})
            await conn.execute(sql.SQL(LOAD_EVENTS).format(s=s), {})
            if dashboard_indexes:  # (opt-in since schema 12: what a large dashboard needs)
                await runrow.migrate(url, dashboard_indexes=True)
            await conn.execute("VACUUM (ANALYZE)")
            await conn.execute("CHECKPOINT")
            out["load_seconds"] = round(time.perf_counter() - started, 1)
            out["events"] = (
                await (await conn.execute(sql.SQL("SELECT count(*) FROM {}.run_event").format(s))).fetchone()
            )[0]  # type: ignore[index]
            out["runs"] = (
                await (await conn.execute(sql.SQL("SELECT count(*) FROM {}.agent_run").format(s))).fetchone()
            )[0]  # type: ignore[index]
            out["database_bytes"] = (
                await (await conn.execute("SELECT pg_database_size(current_database())")).fetchone()
            )[0]  # type: ignore[index]
            samples = await (
                await conn.execute(
                    sql.SQL(
                        "SELECT run_id FROM {}.run_event WHERE type = 'complete' AND seq BETWEEN 190 AND 210 LIMIT 50"
                    ).format(s)
                )
            ).fetchall()
            depth = min(10_000, out["runs"] // 2)  # (page 200 at 50 a page, or half the runs)
            deep = await (
                await conn.execute(
                    sql.SQL(
                        "SELECT created_at, id FROM {}.agent_run ORDER BY created_at DESC, id DESC OFFSET %s LIMIT 1"
                    ).format(s),
                    (depth,),
                )
            ).fetchone()

        async with (
            AsyncConnectionPool(url, min_size=4, max_size=8, open=False) as pool,
            runrow.NotifyHub(url) as hub,
        ):
            backlog = [
                await runrow.enqueue(
                    pool, conversation_id=f"b{i}", user_id="u", content="q", tenant_id=f"t{i % 4}"
                )
                for i in range(2000)
            ]
            n = 0

            async def enqueue() -> None:
                nonlocal n
                n += 1
                await runrow.enqueue(pool, conversation_id=f"e{n}", user_id="u", content="q")

            out["enqueue"] = await _timed(enqueue, 200)

            async def claim_one() -> Any:
                async with pool.connection() as c:
                    return await claims.claim(
                        c,
                        "runrow",
                        order="fair",
                        limit=1,
                        lease_seconds=300,
                        worker_id="bench",
                        now=None,
                        retry_policy=None,
                        version=None,
                        agent_keys=(),
                    )

            out["claim"] = await _timed(claim_one, 200)
            it = iter(samples)

            async def first_read() -> None:
                run_id = next(it)[0]
                got = [e async for e in runrow.tail(pool, run_id, hub=hub)]
                assert got and got[-1].type == "complete"

            out["tail first read (~200 events)"] = await _timed(first_read, len(samples))
            # A live wake: a claimed run's tail, woken by appends with their NOTIFY.
            (live,) = await claim_one()
            seen: asyncio.Queue[int] = asyncio.Queue()

            async def follow() -> None:
                async for e in runrow.tail(pool, live.id, hub=hub, from_seq=2):
                    seen.put_nowait(e.seq)

            follower = asyncio.create_task(follow())
            await asyncio.sleep(0.5)
            ch = Channels.for_schema("runrow")
            seq = 2

            async def wake() -> None:
                nonlocal seq
                seq += 1
                batch = [
                    journal.Appended(live.id, live.claim_token, [(seq, "content_delta", '{"delta": "x"}')])
                ]
                async with pool.connection() as c:
                    await c.execute(statement("append_events", "runrow"), journal.append_params(batch, ch))
                while await seen.get() != seq:
                    pass

            out["tail live wake"] = await _timed(wake, 50)
            follower.cancel()
            middle = backlog[len(backlog) // 2].id
            out["queue_position"] = await _timed(lambda: runrow.queue_position(pool, middle), 100)
            page = statement("admin_list_runs", "runrow")
            base = {
                k: None
                for k in (
                    "status",
                    "tenant_id",
                    "conversation_id",
                    "user_id",
                    "worker_id",
                    "created_from",
                    "created_to",
                    "before_created",
                    "before_id",
                )
            }

            async def page_one() -> None:
                async with pool.connection() as c:
                    await (await c.execute(page, {**base, "limit": 51})).fetchall()

            async def page_deep() -> None:
                async with pool.connection() as c:
                    params = {**base, "limit": 51, "before_created": deep[0], "before_id": deep[1]}  # type: ignore[index]
                    await (await c.execute(page, params)).fetchall()

            out["dashboard page 1"] = await _timed(page_one, 100)
            out["dashboard page 200"] = await _timed(page_deep, 100)

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            wal = (await (await conn.execute("SELECT pg_current_wal_lsn()")).fetchone())[0]  # type: ignore[index]
            started = time.perf_counter()
            result = await runrow.trim(url, retention=timedelta(hours=24))
            out["trim"] = {
                "seconds": round(time.perf_counter() - started, 2),
                "runs": result.runs,
                "partitions": result.partitions,
                "wal_bytes": (
                    await (
                        await conn.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (str(wal),))
                    ).fetchone()
                )[0],  # type: ignore[index]
            }
            dead = 0
            for (table,) in await (
                await conn.execute(
                    "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = 'runrow' AND c.relkind = 'r' AND c.relname LIKE 'run_event%%'"
                )
            ).fetchall():
                dead += (
                    await (
                        await conn.execute("SELECT dead_tuple_count FROM pgstattuple(%s)", (table,))
                    ).fetchone()
                )[0]  # type: ignore[index]
            out["trim"]["dead_tuples_on_the_journal"] = dead
        return out


OPS = (
    "enqueue",
    "claim",
    "tail first read (~200 events)",
    "tail live wake",
    "queue_position",
    "dashboard page 1",
    "dashboard page 200",
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--compare", type=int, nargs=2, metavar=("SMALL", "BIG"))
    parser.add_argument("--server", default="/usr/lib/postgresql/15/bin")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--dashboard-indexes",
        action="store_true",
        help="build the dashboard's opt-in list indexes after the load",
    )
    args = parser.parse_args()
    sizes = args.compare or [args.events]
    results = [asyncio.run(measure(size, args.server, args.dashboard_indexes)) for size in sizes]
    print(json.dumps(results, indent=2, default=str))
    if len(results) == 2:
        small, big = results
        print(f"\n{'operation':32} {'small median ms':>16} {'big median ms':>14} {'big/small':>10}")
        for op in OPS:
            a, b = small[op]["median_ms"], big[op]["median_ms"]
            print(f"{op:32} {a:16.3f} {b:14.3f} {b / a:10.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
