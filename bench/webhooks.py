"""Webhook delivery rate (#42): how many outbox deliveries per second one dispatcher's
delivery service posts to a local receiver that answers 204 at once.

Not a test (pytest does not collect it). Run from the checkout, with runrow[webhooks]:

    python bench/webhooks.py [--deliveries 2000] [--reps 3] [--dispatchers 1]

It starts its own server (runrow.embedded, default durability), subscribes a receiver
(http.server with keep-alive, in a thread of this process: its own CPU counts against the
figure), writes the deliveries into the outbox in one statement, as endings would, then
starts the dispatchers and times until every delivery is recorded delivered. Each
delivery costs a claim share, a signed POST and its own recorded outcome (one statement).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import psycopg
from psycopg import sql

import runrow
from runrow.embedded import EmbeddedPostgres

SCHEMA = "bench_hooks"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client reuses its connections

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


async def _agent(run: runrow.RunContext) -> None:
    return None


async def _pending(conn: psycopg.AsyncConnection) -> int:
    cur = await conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE state <> 'delivered'").format(
            sql.Identifier(SCHEMA, "webhook_delivery")
        )
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def one(conninfo: str, url: str, n: int, dispatchers: int) -> float:
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        await runrow.migrate(conninfo, schema=SCHEMA)
        await runrow.add_webhook(conninfo, "bench", url, allow_private=True, schema=SCHEMA)
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (webhook, run_id, lineage, event_type, payload) "
                "SELECT 'bench', r, r, 'run.completed', jsonb_build_object('type', 'run.completed', "
                "'timestamp', now(), 'data', jsonb_build_object('run_id', r, 'status', 'completed')) "
                "FROM (SELECT gen_random_uuid() AS r FROM generate_series(1, %s)) g"
            ).format(sql.Identifier(SCHEMA, "webhook_delivery")),
            (n,),
        )
        start = time.perf_counter()
        async with _Many(conninfo, dispatchers):
            while await _pending(conn):
                await anyio.sleep(0.02)
        return n / (time.perf_counter() - start)


class _Server(ThreadingHTTPServer):
    # A claim posts 32 at once: the default listen backlog (5) drops the rest's SYNs,
    # and each dropped one is retried a whole second later.
    request_queue_size = 128


class _Many:
    """``dispatchers`` Dispatchers running for the block."""

    def __init__(self, conninfo: str, n: int) -> None:
        self.items = [runrow.Dispatcher(conninfo, _agent, schema=SCHEMA, poll=1.0) for _ in range(n)]

    async def __aenter__(self) -> None:
        for d in self.items:
            await d.__aenter__()

    async def __aexit__(self, *exc: object) -> None:
        for d in self.items:
            await d.__aexit__(None, None, None)


async def measure(conninfo: str, n: int, reps: int, dispatchers: int) -> None:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        rates = [await one(conninfo, url, n, dispatchers) for _ in range(reps)]
    finally:
        server.shutdown()
    print(
        f"webhook deliveries, {dispatchers} dispatcher(s), {n} per rep: median "
        f"{statistics.median(rates):,.0f}/s ({', '.join(f'{r:,.0f}' for r in rates)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--deliveries", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dispatchers", type=int, default=1)
    args = parser.parse_args()
    pg = EmbeddedPostgres(fast=False, tcp=True, settings={"max_connections": "200"})
    pg.start()
    try:
        anyio.run(measure, pg.conninfo(via_tcp=True), args.deliveries, args.reps, args.dispatchers)
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
