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
import time
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

# Short enough that killing a worker shows the reaper at work within half a minute:
# a killed worker's run ends failed (worker_lost) within lease + grace + poll seconds of
# its last heartbeat. The web process reaps on this timing too (every poll seconds), so
# that nothing depends on a worker being alive to reap the runs of one that died.
_WORKER_TIMING = {"lease": 10.0, "heartbeat": 3.0, "grace": 5.0, "poll": 2.0}
_WORKER_CONCURRENCY = 4
# A worker that dies this soon after its start is restarted after a growing pause
# (1 s, 2 s, 4 s ... at most 30 s), so that a worker that cannot start does not spin.
_QUICK_DEATH = 10.0


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


def _start_worker(url: str, schema: str) -> subprocess.Popen[bytes]:
    t = _WORKER_TIMING
    args = [
        sys.executable, "-m", "runrow.cli", "worker", "runrow.demo.agent:agent",
        "--agent", "researcher=runrow.demo.agent:researcher",  # the research turn's sub-agents
        "--schema", schema, "--concurrency", str(_WORKER_CONCURRENCY), "--drain-seconds", "5",
        "--lease-seconds", str(t["lease"]), "--heartbeat-seconds", str(t["heartbeat"]),
        "--grace-seconds", str(t["grace"]), "--poll-seconds", str(t["poll"]),
        "--log-error-messages",  # the demo's user is its developer: show what failed, in full
    ]  # fmt: skip
    env = {**os.environ, "DATABASE_URL": url, "RUNROW_DEMO_SCHEMA": schema}
    # Its own process group: Ctrl-C reaches the demo, which stops the workers itself.
    proc = subprocess.Popen(
        args, env=env, stdin=subprocess.DEVNULL, preexec_fn=_term_on_parent_death, process_group=0
    )
    print(f"runrow demo: worker pid {proc.pid} started", flush=True)
    return proc


def _how_it_ended(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


class _Workers:
    """The worker processes, each replaced when it dies (a crash, an OOM kill, kill -9)."""

    def __init__(self, n: int, url: str, schema: str) -> None:
        self._url = url
        self._schema = schema
        self.procs = [_start_worker(url, schema) for _ in range(n)]
        self._started = [time.monotonic()] * n
        self._pause = [0.0] * n
        self.stopping = False

    async def watch(self, every: float = 0.5) -> None:
        """Polls the processes until cancelled; a dead one is logged and started again."""
        while True:
            await anyio.sleep(every)
            for i, proc in enumerate(self.procs):
                if self.stopping or (rc := proc.poll()) is None:
                    continue
                lived = time.monotonic() - self._started[i]
                self._pause[i] = min(max(self._pause[i] * 2, 1.0), 30.0) if lived < _QUICK_DEATH else 0.0
                print(
                    f"runrow demo: worker pid {proc.pid} {_how_it_ended(rc)}; its running turns end "
                    f"failed (worker_lost) once their lease lapses; starting a new worker"
                    + (f" in {self._pause[i]:.0f} s" if self._pause[i] else ""),
                    flush=True,
                )
                await anyio.sleep(self._pause[i])
                if not self.stopping:
                    self.procs[i] = _start_worker(self._url, self._schema)
                    self._started[i] = time.monotonic()


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
    t = _WORKER_TIMING
    app = create_app(
        url,
        schema=schema,
        in_process_workers=0 if workers else 1,
        dispatcher_options=t,
        # Separate workers: the web process reaps as well (see _WORKER_TIMING).
        reap_interval=t["poll"] if workers else None,
        reap_grace=t["grace"],
        worker_slots=workers * _WORKER_CONCURRENCY or None,
    )
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3)
    server = _Server(config)
    pool = _Workers(workers, url, schema)
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
                        pool.stopping = True
                        server.should_exit = True
                        return

            tg.start_soon(announce)
            tg.start_soon(on_signal)
            tg.start_soon(pool.watch)
            await server.serve(sockets=[sock])
            tg.cancel_scope.cancel()
    finally:
        pool.stopping = True
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_stop_workers, pool.procs)
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
