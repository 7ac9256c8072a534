"""``runrow demo``: a database (embedded unless ``DATABASE_URL`` is set), migrations,
workers and the web server, stopped together on Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import uvicorn

import runrow
from runrow.embedded import EmbeddedPostgres

from .app import create_app

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["default_data_dir", "run_demo"]

# Short enough that killing a worker shows the reaper at work within half a minute.
_WORKER_TIMING = {"lease": 10.0, "heartbeat": 3.0, "grace": 5.0, "poll": 2.0}


def default_data_dir() -> Path:
    """Where the demo keeps its database between runs.

    ``RUNROW_DEMO_DIR`` if set; otherwise ``$XDG_DATA_HOME/runrow/demo`` (default
    ``~/.local/share/runrow/demo``). Under root the server runs as an unprivileged account
    that cannot enter root's private home, and runrow never loosens a folder's
    permissions, so root's demo lives in ``/var/tmp/runrow-demo-root`` instead.
    """
    if env := os.environ.get("RUNROW_DEMO_DIR"):
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/tmp/runrow-demo-root")  # noqa: S108 - checked: must be ours and not writable by others
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "runrow" / "demo"


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: ``runrow demo`` owns SIGINT and SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _term_on_parent_death() -> None:  # pragma: no cover - runs in the child before exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _start_workers(n: int, url: str, schema: str) -> list[subprocess.Popen[bytes]]:
    t = _WORKER_TIMING
    args = [
        sys.executable, "-m", "runrow.cli", "worker", "runrow.demo.agent:agent",
        "--schema", schema, "--concurrency", "4", "--drain-seconds", "5",
        "--lease-seconds", str(t["lease"]), "--heartbeat-seconds", str(t["heartbeat"]),
        "--grace-seconds", str(t["grace"]), "--poll-seconds", str(t["poll"]),
    ]  # fmt: skip
    env = {**os.environ, "DATABASE_URL": url, "RUNROW_DEMO_SCHEMA": schema}
    return [
        # Own process groups: Ctrl-C reaches the demo, which stops the workers itself.
        subprocess.Popen(
            args, env=env, stdin=subprocess.DEVNULL, preexec_fn=_term_on_parent_death, process_group=0
        )
        for _ in range(n)
    ]


def _stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)  # drains: running turns get up to 5 s
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def _serve(url: str, sock: socket.socket, workers: int, schema: str) -> None:
    applied = await runrow.migrate(url, schema=schema)
    if applied:
        print(f"runrow demo: migrated schema {schema!r} ({', '.join(map(str, applied))})", flush=True)
    app = create_app(
        url, schema=schema, in_process_workers=0 if workers else 1, dispatcher_options=_WORKER_TIMING
    )
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3)
    server = _Server(config)
    procs = _start_workers(workers, url, schema) if workers else []
    try:
        async with anyio.create_task_group() as tg:

            async def announce() -> None:
                while not server.started:
                    if server.should_exit:
                        return
                    await anyio.sleep(0.05)
                shown = f"[{host}]" if ":" in host else host
                print(
                    f"runrow demo: open http://{shown}:{port}/  "
                    f"({workers or 'in-process'} worker{'s' if workers != 1 else ''}; Ctrl-C stops everything)",
                    flush=True,
                )

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        print(f"runrow demo: {signal.Signals(signum).name}, stopping", flush=True)
                        server.should_exit = True
                        return

            tg.start_soon(announce)
            tg.start_soon(on_signal)
            await server.serve(sockets=[sock])
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_stop_workers, procs)
    if not server.started:
        raise SystemExit(f"runrow demo: could not serve on {host}:{port} (is the port in use?)")


def run_demo(
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    database_url: str | None = None,
    schema: str = "runrow",
    data_dir: Path | None = None,
) -> int:
    """Runs the demo until SIGINT/SIGTERM; returns the exit status."""
    url = database_url or os.environ.get("DATABASE_URL")
    # Bind first: a busy port is reported before anything else starts.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"runrow demo: cannot listen on {host}:{port}: {exc.strerror}; try --port") from None
    pg: EmbeddedPostgres | None = None
    try:
        if not url:
            base = data_dir or default_data_dir()
            pg = EmbeddedPostgres(base, cleanup=False)
            print(f"runrow demo: starting PostgreSQL (data in {base})", flush=True)
            url = pg.start()  # from the main thread: the server dies with this process
            print(f"runrow demo: PostgreSQL {pg.bin_dir} on socket {pg.socket_dir}", flush=True)
        anyio.run(_serve, url, sock, workers, schema, backend="asyncio")
    finally:
        sock.close()
        if pg is not None and pg.running:
            pg.stop()
            print("runrow demo: PostgreSQL stopped", flush=True)
    print("runrow demo: stopped", flush=True)
    return 0
