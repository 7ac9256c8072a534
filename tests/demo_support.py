"""Shared by the demo's tests: the demo app served by a real uvicorn, and an SSE reader."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import psycopg
import uvicorn
from psycopg import sql

from runrow.demo import DemoAgent, create_app

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    import httpx

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


class QuietServer(uvicorn.Server):
    """uvicorn without signal handlers (the test process owns its signals)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def serve_demo(
    dsn: str,
    schema: str,
    *,
    token_delay: float = 0.01,
    workers: int = 1,
    keepalive: float = 15.0,
    approval_timeout: float | None = None,
    port: int | None = None,
    keep_demo_schema: bool = False,
    **app_options: Any,
) -> AsyncIterator[str]:
    """The demo app on a free port of 127.0.0.1 (or ``port``, to serve again where a
    stopped one was), with ``workers`` in-process dispatchers. Its own tables go when it
    stops, unless ``keep_demo_schema`` (a restart: another serve_demo follows)."""
    demo_schema = f"{schema}_demo"
    app = create_app(
        dsn,
        schema=schema,
        in_process_workers=workers,
        agent=DemoAgent(
            dsn, demo_schema=demo_schema, token_delay=token_delay, approval_timeout=approval_timeout
        ),
        dispatcher_options={"poll": 0.5, "flush_interval": 0.05, "lease": 10.0, "heartbeat": 2.0},
        keepalive=keepalive,
        **app_options,
    )
    try:
        async with serve_asgi(app, port=port) as base:
            yield base
    finally:
        if not keep_demo_schema:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(demo_schema))
                )


@asynccontextmanager
async def serve_asgi(app: Any, *, port: int | None = None) -> AsyncIterator[str]:
    """``app`` served by a real uvicorn (lifespan included) on 127.0.0.1; yields its base URL."""
    port = port or free_port()
    server = QuietServer(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1)
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(20):
            while not server.started:
                await anyio.sleep(0.02)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer demo-{user}"}


@dataclass
class SSE:
    id: str | None = None
    event: str | None = None
    data: Any = None
    comments: list[str] = field(default_factory=list)


async def read_sse(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    *,
    stop_after: int | None = None,
    until: str | None = None,
    want_comment: bool = False,
    timeout: float = 30.0,
) -> list[SSE]:
    """Reads an event stream into events (and comments), until it ends, ``stop_after``
    events or the first event of type ``until`` (a waiting run's stream does not end)."""
    events: list[SSE] = []
    current = SSE()
    with anyio.fail_after(timeout):
        async with client.stream("GET", url, headers=headers) as resp:
            assert resp.status_code == 200, await resp.aread()
            assert resp.headers["content-type"].startswith("text/event-stream")
            async for line in resp.aiter_lines():
                if line == "":
                    if current.event is not None or current.data is not None:
                        events.append(current)
                        if stop_after is not None and len(events) >= stop_after:
                            return events
                        if until is not None and current.event == until:
                            return events
                    elif current.comments and want_comment:
                        events.append(current)
                        return events
                    current = SSE()
                elif line.startswith(":"):
                    current.comments.append(line[1:].strip())
                else:
                    name, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if name == "id":
                        current.id = value
                    elif name == "event":
                        current.event = value
                    elif name == "data":
                        current.data = json.loads(value)
    return events


def answer_text(events: list[SSE]) -> str:
    return "".join(e.data["delta"] for e in events if e.event == "content_delta" and "stream" not in e.data)


class DemoProcess:
    """``runrow demo`` as a user runs it (its default workers and timing), on the test's
    database and schema; its output goes to ``log``."""

    def __init__(self, dsn: str, schema: str, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNROW_DEMO_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [sys.executable, "-m", "runrow.cli", "demo", "--port", str(self.port)]
        cmd += ["--database-url", dsn, "--schema", schema]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait_for(self, pattern: str, timeout: float = 30.0, *, count: int = 1) -> list[re.Match[str]]:
        """The first ``count`` matches of ``pattern`` in the output, waiting for them."""
        deadline = time.monotonic() + timeout
        while True:
            found = list(re.finditer(pattern, self.output()))
            if len(found) >= count:
                return found[:count]
            if self.proc.poll() is not None:
                raise AssertionError(f"runrow demo exited with {self.proc.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} ({count}) in the demo's output:\n{self.output()}")
            await anyio.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
