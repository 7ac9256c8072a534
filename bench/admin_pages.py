"""The admin's pages at 1,000,000 runs versus 1,000: keyset pages cost the same.

Not a test (pytest does not collect it). Run from the checkout:

    python bench/admin_pages.py [--big 1000000] [--small 1000] [--reps 40] [--explain]

On one server (runrow.embedded), two schemas are seeded alike with a bulk
INSERT ... SELECT generate_series: ``--big`` and ``--small`` finished runs over the last
30 days (10 tenants and 10 users, so that every filtered page is full at both sizes; 20 workers; 90% completed, 8% failed, 2% cancelled),
each with its user message and terminal event, plus the same live part in both (100
queued runs, 200 finished in the last hour). Then each page is requested ``--reps``
times through the ASGI app (httpx's ASGITransport, the admin on a psycopg pool), the
two sizes interleaved, and the median latency of each is reported with the ratio
big/small, which must be at most 1.5 (the script exits 1 otherwise).

Pages: the runs list (first page; filtered by status, by tenant, by user; a later page
by its cursor) and a run's detail page. ``--explain`` prints EXPLAIN (ANALYZE, BUFFERS)
of the list and detail statements on the big schema (docs/howto/dashboard.md shows them).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

import runrow
from runrow._gateway import statement_text
from runrow.admin import AdminAccess, create_admin
from runrow.embedded import EmbeddedPostgres

SEED = """
INSERT INTO {s}.message (id, conversation_id, role, content, status, user_id, created_at, turn)
SELECT md5('m' || g)::uuid, 'c' || (g / 4), 'user', '"hello"', 'sent', 'u' || (g %% 10),
       now() - interval '31 days' + g * (interval '30 days' / %(runs)s), g
FROM generate_series(1, %(runs)s) g;
INSERT INTO {s}.agent_run (id, conversation_id, user_id, tenant_id, user_message_id, status, claim_token,
                           claim_expires_at, worker_id, error, created_at, started_at, last_heartbeat_at,
                           finished_at)
SELECT md5('r' || g)::uuid, 'c' || (g / 4), 'u' || (g %% 10), 't' || (g %% 10), md5('m' || g)::uuid,
       CASE WHEN g %% 50 = 0 THEN 'cancelled' WHEN g %% 12 = 0 THEN 'failed' ELSE 'completed' END,
       gen_random_uuid(), NULL, 'w' || (g %% 20),
       CASE WHEN g %% 50 = 0 THEN NULL
            WHEN g %% 24 = 0 THEN '{{"type": "worker_lost"}}'::jsonb
            WHEN g %% 12 = 0 THEN '{{"type": "RuntimeError", "message": "boom"}}'::jsonb END,
       now() - interval '31 days' + g * (interval '30 days' / %(runs)s),
       now() - interval '31 days' + g * (interval '30 days' / %(runs)s) + interval '1 s',
       now() - interval '31 days' + g * (interval '30 days' / %(runs)s) + interval '2 s',
       now() - interval '31 days' + g * (interval '30 days' / %(runs)s) + interval '3 s'
FROM generate_series(1, %(runs)s) g;
INSERT INTO {s}.run_event (run_id, seq, type, payload)
SELECT md5('r' || g)::uuid, s.seq, s.type, s.payload
FROM generate_series(1, %(runs)s) g,
     LATERAL (VALUES (1, 'user_message_created', '{{}}'::jsonb), (2, 'run_queued', '{{}}'::jsonb),
                     (3, 'complete', '{{"status": "completed", "uncertain_tool_calls": []}}'::jsonb)) s(seq, type, payload);
INSERT INTO {s}.message (id, conversation_id, role, content, status, user_id, turn)
SELECT md5('lm' || g)::uuid, 'live' || g, 'user', '"hi"', 'sent', 'u1', %(runs)s + g
FROM generate_series(1, 300) g;
INSERT INTO {s}.agent_run (conversation_id, user_id, tenant_id, user_message_id, status, claim_token,
                           worker_id, created_at, started_at, finished_at)
SELECT 'live' || g, 'u1', 't' || (g %% 10), md5('lm' || g)::uuid,
       CASE WHEN g <= 100 THEN 'queued' ELSE 'completed' END,
       CASE WHEN g <= 100 THEN NULL ELSE gen_random_uuid() END,
       CASE WHEN g <= 100 THEN NULL ELSE 'w1' END,
       now() - interval '50 min', CASE WHEN g <= 100 THEN NULL ELSE now() - interval '40 min' END,
       CASE WHEN g <= 100 THEN NULL ELSE now() - g * interval '5 s' END
FROM generate_series(1, 300) g
"""


async def seed(conninfo: str, schema: str, runs: int) -> float:
    t0 = time.monotonic()
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        async with conn.transaction():
            for part in filter(str.strip, SEED.split(";\n")):
                q = sql.SQL(part).format(s=sql.Identifier(schema))  # type: ignore[arg-type]
                await conn.execute(q, {"runs": runs})
        for table in ("agent_run", "run_event", "message"):
            await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(schema, table)))
    return time.monotonic() - t0


def _everyone(request: Any) -> AdminAccess:
    return AdminAccess(can_act=True)


def pages(runs: int, cursor: str) -> dict[str, str]:
    mid = runs // 2
    return {
        "list": "/",
        "list status=failed": "/?status=failed",
        "list tenant=t7": "/?tenant=t7",
        "list user=u3": "/?user=u3",
        "list later page": f"/?before={quote(cursor)}",
        "detail": f"/runs/{_rid(mid)}",
    }


def _rid(g: int) -> str:
    import hashlib
    import uuid

    return str(uuid.UUID(hashlib.md5(f"r{g}".encode()).hexdigest()))


async def _cursor(conninfo: str, schema: str, runs: int) -> str:
    async with await psycopg.AsyncConnection.connect(conninfo) as c:
        cur = await c.execute(
            sql.SQL("SELECT created_at, id FROM {} WHERE id = %s").format(
                sql.Identifier(schema, "agent_run")
            ),
            (_rid(runs // 2),),
        )
        row = await cur.fetchone()
        assert row is not None
        return f"{row[0].isoformat()}~{row[1]}"


async def measure(conninfo: str, sizes: dict[str, int], reps: int) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}
    async with AsyncConnectionPool(
        conninfo, min_size=2, max_size=4, open=False, kwargs={"autocommit": True}
    ) as pool:
        await pool.open(wait=True)
        clients, urls = {}, {}
        for label, schema in sizes.items():
            app = create_admin(pool, authorize=_everyone, schema=schema)
            clients[label] = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://admin"
            )
            runs = RUNS[label]
            urls[label] = pages(runs, await _cursor(conninfo, schema, runs))
        try:
            for label, client in clients.items():  # warm up: connections, plans, caches
                for url in urls[label].values():
                    for _ in range(3):
                        assert (await client.get(url)).status_code == 200, url
            for _ in range(reps):
                for page in urls["small"]:
                    for label, client in clients.items():
                        t0 = time.perf_counter()
                        resp = await client.get(urls[label][page])
                        out.setdefault((page, label), []).append((time.perf_counter() - t0) * 1000)
                        assert resp.status_code == 200
        finally:
            for client in clients.values():
                await client.aclose()
    return out


RUNS: dict[str, int] = {}


async def explain(conninfo: str, schema: str, runs: int) -> None:
    cursor = (await _cursor(conninfo, schema, runs)).split("~")
    none: dict[str, Any] = dict.fromkeys(
        ("status", "tenant_id", "conversation_id", "user_id", "worker_id", "created_from", "created_to"), None
    )
    cases: list[tuple[str, str, dict[str, Any]]] = [
        (
            "runs list, first page",
            "admin_list_runs",
            {**none, "before_created": None, "before_id": None, "limit": 51},
        ),
        (
            "runs list, status=failed, a later page",
            "admin_list_runs",
            {**none, "status": "failed", "before_created": cursor[0], "before_id": cursor[1], "limit": 51},
        ),
        (
            "runs list, tenant=t7",
            "admin_list_runs",
            {**none, "tenant_id": "t7", "before_created": None, "before_id": None, "limit": 51},
        ),
        ("counts per status", "admin_status_counts", {"tenant_id": None}),
        ("detail: lineage", "admin_lineage", {"root": _rid(runs // 2)}),
        ("detail: terminal event", "admin_terminal_event", {"run_id": _rid(runs // 2)}),
    ]
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as c:
        for title, name, params in cases:
            cur = await c.execute(
                b"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + statement_text(name, schema), params
            )
            print(f"\n-- {title} ({runs:,} runs)")
            for (line,) in await cur.fetchall():
                print(line)


async def run(conninfo: str, big: int, small: int, reps: int, show_plans: bool) -> int:
    RUNS.update(small=small, big=big)
    schemas: dict[str, str] = {}
    try:
        for label, n in (("small", small), ("big", big)):
            schemas[label] = f"admin_bench_{label}"
            await runrow.migrate(
                conninfo, schema=schemas[label], dashboard_indexes=True
            )  # (opt-in since schema 12)
            print(f"seeded {n:,} runs in {await seed(conninfo, schemas[label], n):.1f} s", flush=True)
        if show_plans:
            await explain(conninfo, schemas["big"], big)
        got = await measure(conninfo, schemas, reps)
    finally:
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as c:
            for s in schemas.values():
                await c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))
    print(f"\nmedian of {reps} requests through the ASGI app, ms: {small:,} runs vs {big:,} runs")
    worst = 0.0
    for page in pages(1, "x~y"):
        a, b = statistics.median(got[(page, "small")]), statistics.median(got[(page, "big")])
        worst = max(worst, b / a)
        print(f"{page:<22} {a:8.2f} {b:8.2f}   ratio {b / a:5.2f}")
    verdict = "ok" if worst <= 1.5 else "TOO SLOW"
    print(f"worst ratio {worst:.2f} (must be at most 1.5): {verdict}")
    return 0 if worst <= 1.5 else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--explain", action="store_true")
    args = parser.parse_args()
    server = EmbeddedPostgres(fast=False, tcp=True)
    server.start()
    try:
        code = anyio.run(run, server.conninfo(via_tcp=True), args.big, args.small, args.reps, args.explain)
    finally:
        server.stop()
    sys.exit(code)


if __name__ == "__main__":
    main()
