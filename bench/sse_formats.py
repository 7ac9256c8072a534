"""What each stream format costs per delivered event: runrow's own against the AI SDK's
and AG-UI's, in one run.

Not a test (pytest does not collect it). Run from the checkout:

    python bench/sse_formats.py [--events 2000] [--reps 7]

One finished run with a journal of ``--events`` events (text deltas of ~40 characters,
a tool call every 50 events, one ``complete``) is written to a server of its own
(runrow.embedded, default durability). Two measurements, in interleaved rounds:

* ``encode``: the CPU per journal event of turning the events into SSE bytes, in this
  process, no I/O: runrow's format (JSON of the event, one SSE message) against
  ``runrow.protocols.ProtocolStream`` plus the same SSE framing;
* ``http``: a client reads the whole stream from ``GET /v1/runs/{id}/events?format=``
  of ``runrow.http`` served by uvicorn in a child process; figures are the wall time
  per journal event seen by the client and the server process's CPU per journal event
  (from /proc), so the client's own parsing is not counted.

Figures: the median over reps (min-max), and the ratio to runrow's format.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import httpx
import psycopg
from psycopg import sql
from sse_starlette import ServerSentEvent

import runrow
from runrow.embedded import EmbeddedPostgres
from runrow.protocols import ProtocolStream

FORMATS = ("runrow", "ai-sdk", "ag-ui")
SCHEMA = "bench_sse"
SRC = Path(__file__).resolve().parents[1] / "src"

SERVER = """
import sys, uvicorn
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.routing import Mount
from runrow.http import create_api
url, schema, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
pool = AsyncConnectionPool(url, open=False, kwargs={"autocommit": True})
from contextlib import asynccontextmanager
@asynccontextmanager
async def lifespan(app):
    async with pool:
        yield
api = create_api(pool, authenticate=lambda r: "bench", schema=schema)
app = Starlette(routes=[Mount("", app=api)], lifespan=lifespan)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def journal(n: int) -> list[runrow.Event]:
    """A run's journal as a tail yields it: enqueue's two events, text, tool calls, the end."""
    events = [
        runrow.Event(1, "user_message_created", {"message_id": str(uuid.uuid4())}),
        runrow.Event(2, "run_queued", {"run_id": str(uuid.uuid4())}),
    ]
    while len(events) < n - 1:
        seq = len(events) + 1
        if seq % 50 == 0:
            events.append(
                runrow.Event(seq, "tool_call_started", {"tool_call_id": f"c{seq}", "name": "search"})
            )
            events.append(
                runrow.Event(
                    seq + 1, "tool_call_finished", {"tool_call_id": f"c{seq}", "ok": True, "result": {"n": 3}}
                )
            )
        else:
            events.append(
                runrow.Event(seq, "content_delta", {"delta": f"word {seq} and a few more words here. "})
            )
    events.append(runrow.Event(len(events) + 1, "complete", {"status": "completed"}))
    return events


def encode(fmt: str, events: list[runrow.Event]) -> int:
    """SSE bytes for the whole journal in ``fmt`` (what the HTTP layer writes)."""
    total = 0
    if fmt == "runrow":
        for ev in events:
            data = json.dumps(ev.to_dict(), ensure_ascii=False, default=str)
            total += len(ServerSentEvent(data=data, event=ev.type, id=str(ev.seq), sep="\n").encode())
        return total
    stream = ProtocolStream(fmt, run_id=uuid.uuid4(), conversation_id="bench")
    for ev in events:
        for sse_id, frame in stream.feed(ev):
            total += len(ServerSentEvent(data=frame.data, event=frame.event, id=sse_id, sep="\n").encode())
    return total


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def write_run(url: str, n: int) -> str:
    """A finished run whose journal holds ``n`` events, written as a worker would."""
    await runrow.migrate(url, schema=SCHEMA)
    run = await runrow.enqueue(url, conversation_id="c", user_id="bench", content="go", schema=SCHEMA)
    rows = [(run.id, ev.seq, ev.type, json.dumps(ev.payload)) for ev in journal(n)[2:-1]]
    insert = sql.SQL("INSERT INTO {}.run_event (run_id, seq, type, payload) VALUES (%s, %s, %s, %s)")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        await cur.executemany(insert.format(sql.Identifier(SCHEMA)), rows)
    # End it the way a stop does (the terminal event is runrow's own).
    await runrow.cancel_run(url, run.id, schema=SCHEMA)
    return str(run.id)


async def read(client: httpx.AsyncClient, url: str) -> int:
    messages = 0
    async with client.stream("GET", url) as resp:
        assert resp.status_code == 200, resp.status_code
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                messages += 1
    return messages


def report(title: str, unit: str, figures: dict[str, list[float]]) -> None:
    base = statistics.median(figures["runrow"])
    print(f"\n{title}\n\n| format | {unit} (median) | min-max | ratio to runrow |\n|---|---|---|---|")
    for fmt in FORMATS:
        med = statistics.median(figures[fmt])
        print(f"| {fmt} | {med:.2f} | {min(figures[fmt]):.2f}-{max(figures[fmt]):.2f} | {med / base:.2f} |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()

    events = journal(args.events)
    cpu: dict[str, list[float]] = {f: [] for f in FORMATS}
    for rep in range(args.reps):
        for fmt in FORMATS[rep % 3 :] + FORMATS[: rep % 3]:  # rotate the order each round
            start = time.process_time()
            encode(fmt, events)
            cpu[fmt].append((time.process_time() - start) / len(events) * 1e6)
    report(f"encode: CPU per journal event, {len(events)} events, in process", "µs", cpu)

    with EmbeddedPostgres(fast=False, tcp=True) as pg:
        url = pg.conninfo()
        run_id = await write_run(url, args.events)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p),
        }
        server = subprocess.Popen([sys.executable, "-c", SERVER, url, SCHEMA, str(port)], env=env)
        try:
            wall: dict[str, list[float]] = {f: [] for f in FORMATS}
            server_cpu: dict[str, list[float]] = {f: [] for f in FORMATS}
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                for _ in range(100):
                    try:
                        await client.get("/openapi.json")
                        break
                    except httpx.TransportError:
                        await anyio.sleep(0.1)
                for fmt in FORMATS:  # warm up each path once
                    await read(client, f"/v1/runs/{run_id}/events?format={fmt}")
                for rep in range(args.reps):
                    for fmt in FORMATS[rep % 3 :] + FORMATS[: rep % 3]:
                        before, t0 = cpu_seconds(server.pid), time.perf_counter()
                        await read(client, f"/v1/runs/{run_id}/events?format={fmt}")
                        elapsed, used = time.perf_counter() - t0, cpu_seconds(server.pid) - before
                        wall[fmt].append(elapsed / args.events * 1e6)
                        server_cpu[fmt].append(used / args.events * 1e6)
        finally:
            server.terminate()
            server.wait()
    report(f"http: wall time per journal event, client reading a finished run of {args.events}", "µs", wall)
    report("http: the server process's CPU per journal event", "µs", server_cpu)


if __name__ == "__main__":
    anyio.run(main)
