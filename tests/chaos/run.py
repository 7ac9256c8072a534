"""The chaos and soak runner: ``python tests/chaos/run.py --profile short|long --report FILE.json``.

It starts a private PostgreSQL, migrates runrow's schema, installs the chaos tables
and the transition trigger (tests/chaos/schema.py), starts worker processes
(``python -m runrow.cli worker tests.chaos.agent:agent``) that reach the database
through a TCP proxy it controls, drives a load of conversations (bursts of turns,
tails that disconnect and resume, stops), injects faults on a schedule, lets the
system settle, and hands the database and the tails' transcripts to the checker.
It writes a JSON report (format in tests/chaos/README.md) and exits 1 when an
invariant fails, 2 when the run itself broke (timeout, crash).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import psycopg  # noqa: E402
from psycopg import AsyncConnection, sql  # noqa: E402
from psycopg_pool import AsyncConnectionPool, PoolTimeout  # noqa: E402

import runrow  # noqa: E402
from runrow._enqueue_options import OnBusy  # noqa: E402
from runrow.embedded import EmbeddedPostgres  # noqa: E402
from tests.chaos.checker import INVARIANTS, Transcript, check, summary  # noqa: E402
from tests.chaos.proxy import Proxy  # noqa: E402
from tests.chaos.schema import ident, install, stop_and_log  # noqa: E402

REPORT_FORMAT = "runrow-chaos-report/1"
TREE_FRACTION = 0.15  # of the load's turns, roots of a tree of sub-agents (#41)
STEER_FRACTION = 0.25  # of a burst's later turns, steering messages (#41 point 6: on_busy="steer")
SCHEMA = "runrow"
CHAOS = "chaos"
DBNAME = "chaos"
TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, OSError)

HOOK_KINDS = {
    "kill_after_claim": "after_claim",
    "kill_mid_stream": "mid_stream",
    "kill_before_terminal": "before_terminal",
    "sigstop": "stall",
}
FAULT_KINDS = (
    *HOOK_KINDS,
    "terminate_worker_conn",
    "terminate_hub_listener",
    "pg_restart",
    "proxy_cut",
    "proxy_delay",
)


@dataclass(frozen=True)
class Profile:
    name: str
    load_seconds: float
    rate: float  # turns enqueued per second (target)
    conversations: int
    workers: int
    concurrency: int
    fault_every: tuple[float, float]
    notify_off: tuple[tuple[float, float], ...]  # phases, as fractions of the load time
    hard_timeout: float
    max_backlog: int
    tail_fraction: float
    stop_probability: float
    lease: float = 3.0
    heartbeat: float = 1.0
    grace: float = 2.0
    poll: float = 0.5
    slack: float = 1.5  # scheduling tolerance of a loaded 2-core machine, added to every time bound
    settle_seconds: float = 90.0


PROFILES = {
    "short": Profile(
        "short",
        load_seconds=75,
        rate=6.0,
        conversations=24,
        workers=3,
        concurrency=6,
        fault_every=(2.0, 4.0),
        notify_off=((0.6, 0.85),),
        hard_timeout=240,
        max_backlog=60,
        tail_fraction=0.5,
        stop_probability=0.12,
    ),
    "long": Profile(
        "long",
        load_seconds=1080,
        rate=10.5,
        conversations=120,
        workers=4,
        concurrency=8,
        fault_every=(1.0, 5.0),
        notify_off=((0.3, 0.4), (0.75, 0.85)),
        hard_timeout=1500,
        max_backlog=200,
        tail_fraction=0.3,
        stop_probability=0.08,
    ),
}


def now() -> datetime:
    return datetime.now(UTC)


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Worker:
    slot: int
    worker_id: str
    notify: bool
    proc: subprocess.Popen[bytes]
    state: str = "running"  # running | stopped | draining | dead


@dataclass
class Stats:
    enqueued: int = 0
    enqueue_failures: int = 0
    stops: int = 0
    stop_failures: int = 0
    tail_errors: int = 0
    workers_spawned: int = 0
    faults_skipped: dict[str, int] = field(default_factory=dict)
    faults_failed: dict[str, int] = field(default_factory=dict)


class Chaos:
    def __init__(self, prof: Profile, seed: int, art: Path, emb: EmbeddedPostgres, dsn: str) -> None:
        self.prof = prof
        self.rng = random.Random(seed)
        self.art = art
        self.emb = emb
        self.dsn = dsn  # direct (Unix socket): the runner, the hub, the agent's side effects
        self.proxy = Proxy("127.0.0.1", emb.port)
        self.stats = Stats()
        self.workers: dict[int, Worker] = {}
        self.retired: list[Worker] = []
        self.transcripts: list[Transcript] = []
        self.locks: dict[str, anyio.Lock] = {}
        self.notify_on = True
        self.switching = False
        self.hook_faults_in_flight = 0
        self.backlog = 0
        self.pg_lock = anyio.Lock()
        self.stall_lock = anyio.Lock()
        self.gen = 0
        self.hook_dir = art / "hooks"
        self.hook_dir.mkdir(parents=True, exist_ok=True)
        (art / "workers").mkdir(exist_ok=True)
        # PostgreSQL restarts run on one long-lived thread: the server gets a
        # parent-death signal tied to the thread that started it.
        self.pg_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg")
        self.pool: AsyncConnectionPool[AsyncConnection] = AsyncConnectionPool(
            f"{dsn} application_name=chaos-runner",
            min_size=2,
            max_size=30,
            open=False,
            kwargs={"autocommit": True},
            check=AsyncConnectionPool.check_connection,
            timeout=10,
        )
        self.hub = runrow.NotifyHub(f"{dsn} application_name=chaos-runner-hub", probe_interval=2.0)

    # -- helpers ------------------------------------------------------------------------

    def log(self, msg: str) -> None:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def lock(self, cid: str) -> anyio.Lock:
        return self.locks.setdefault(cid, anyio.Lock())

    async def sql(self, query: str, params: Any = None, *, attempts: int = 50) -> list[tuple[Any, ...]]:
        """One statement on the runner's pool, retried through restarts (bounded)."""
        q = sql.SQL(query).format(run=ident(SCHEMA, "agent_run"), c=sql.Identifier(CHAOS))
        for attempt in range(attempts):
            try:
                async with self.pool.connection() as conn:
                    cur = await conn.execute(q, params)
                    return await cur.fetchall() if cur.description else []
            except TRANSIENT:
                if attempt == attempts - 1:
                    raise
                await anyio.sleep(0.2)
        raise AssertionError("unreachable")

    async def record_fault(
        self,
        kind: str,
        at: datetime,
        *,
        ended_at: datetime | None = None,
        worker_id: str | None = None,
        victims: list[uuid.UUID] | None = None,
        outage: bool = False,
        detail: dict[str, Any] | None = None,
    ) -> None:
        await self.sql(
            "INSERT INTO {c}.fault (kind, at, ended_at, worker_id, victims, outage, detail) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (kind, at, ended_at, worker_id, victims or [], outage, json.dumps(detail or {})),
        )
        self.log(
            f"fault {kind}{f' on {worker_id}' if worker_id else ''}{f' victims {len(victims)}' if victims else ''}"
        )

    def skip(self, kind: str, why: str) -> None:
        self.stats.faults_skipped[kind] = self.stats.faults_skipped.get(kind, 0) + 1
        self.log(f"fault {kind} skipped: {why}")

    # -- workers ------------------------------------------------------------------------

    def spawn(self, slot: int) -> Worker:
        self.gen += 1
        p = self.prof
        wid = f"chaos-w{slot}g{self.gen}"
        args = [
            sys.executable, "-m", "runrow.cli", "worker", "tests.chaos.agent:agent",
            "--database-url", f"host=127.0.0.1 port={self.proxy.port} user=postgres dbname={DBNAME}",
            "--schema", SCHEMA,
            "--concurrency", str(p.concurrency),
            "--lease-seconds", str(p.lease),
            "--heartbeat-seconds", str(p.heartbeat),
            "--grace-seconds", str(p.grace),
            "--poll-seconds", str(p.poll),
            "--drain-seconds", "20",
            "--worker-id", wid,
            # Failed runs are retried (a lost worker's too), so durable steps get replayed.
            "--retry-attempts", "3", "--retry-backoff-seconds", "0",
        ]  # fmt: skip
        if not self.notify_on:
            args.append("--no-notify")
        env = {
            **os.environ,
            "PGAPPNAME": wid,
            "PYTHONPATH": str(ROOT),
            "CHAOS_SIDE_DSN": f"{self.dsn} application_name=chaos-agent",
            "CHAOS_SCHEMA": CHAOS,
            "CHAOS_HOOK_DIR": str(self.hook_dir),
        }
        with open(self.art / "workers" / f"{wid}.log", "wb") as out:
            proc = subprocess.Popen(
                args,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_pdeathsig,
            )
        w = Worker(slot, wid, self.notify_on, proc)
        self.workers[slot] = w
        self.stats.workers_spawned += 1
        return w

    def worker_by_pid(self, pid: int) -> Worker | None:
        for w in self.workers.values():
            if w.proc.pid == pid:
                return w
        return None

    async def retire(self, w: Worker) -> None:
        """SIGTERM (drain) and wait, bounded; SIGKILL if it will not go."""
        w.state = "draining"
        self.retired.append(w)
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGCONT)
            w.proc.send_signal(signal.SIGTERM)
        with anyio.move_on_after(40):
            while w.proc.poll() is None:
                await anyio.sleep(0.1)
        if w.proc.poll() is None:
            self.log(f"worker {w.worker_id} did not drain in time: SIGKILL")
            w.proc.kill()
            w.proc.wait()
        w.state = "dead"

    # -- load ---------------------------------------------------------------------------

    async def enqueue(
        self, cid: str, request: dict[str, Any], n: int, on_busy: OnBusy = "enqueue"
    ) -> uuid.UUID | None:
        key = uuid.uuid4().hex
        deadline = anyio.current_time() + 30
        while True:
            try:
                async with self.lock(cid):
                    run = await runrow.enqueue(
                        self.pool,
                        conversation_id=cid,
                        user_id="chaos",
                        content=f"turn {n} of {cid}",
                        request=request,
                        idempotency_key=key,  # a retry after an unknown outcome is the same turn
                        on_busy=on_busy,
                        schema=SCHEMA,
                    )
                self.stats.enqueued += run.created
                return run.id
            except TRANSIENT:
                if anyio.current_time() > deadline:
                    self.stats.enqueue_failures += 1
                    return None
                await anyio.sleep(0.2)

    async def stop(self, cid: str) -> None:
        for _ in range(20):
            try:
                async with self.lock(cid), self.pool.connection() as conn:
                    await stop_and_log(conn, SCHEMA, CHAOS, cid)
                self.stats.stops += 1
                return
            except TRANSIENT:
                await anyio.sleep(0.3)  # it committed with its log row, or not at all
        self.stats.stop_failures += 1

    async def follow(self, run_id: uuid.UUID, tree: bool = False) -> None:
        """A tail that disconnects at random and resumes from its last seq (with ``tree``,
        the tree's tail, from its last position)."""
        tr = Transcript(str(run_id), tree=[] if tree else None)
        self.transcripts.append(tr)
        cursor = 0
        while not tr.finished:
            hub = self.hub if self.notify_on else None
            try:
                async with contextlib.aclosing(
                    cast(
                        "AsyncGenerator[runrow.Event, None]",
                        runrow.tail(
                            self.pool,
                            run_id,
                            from_seq=cursor,
                            hub=hub,
                            poll=0.5,
                            keepalive=5,
                            schema=SCHEMA,
                            tree=tree,
                        ),
                    )
                ) as events:
                    async for ev in events:
                        if ev.keepalive:
                            continue
                        tr.events.append((ev.seq, ev.type, ev.payload))
                        if tr.tree is not None:
                            tr.tree.append((str(ev.run_id), int(ev.run_seq or 0)))
                        cursor = ev.seq
                        if ev.terminal:
                            tr.finished = True
                            break
                        if self.rng.random() < 0.12:
                            tr.resumes += 1
                            break  # the client went away; it comes back with its cursor
            except TRANSIENT:
                self.stats.tail_errors += 1
                tr.resumes += 1
            if not tr.finished:
                await anyio.sleep(self.rng.uniform(0, 0.4))

    async def burst(self, cid: str, tails: anyio.abc.TaskGroup) -> None:
        for i in range(self.rng.randint(1, 4)):
            request: dict[str, Any] = {
                "steps": self.rng.randint(2, 5),
                "delay": round(self.rng.uniform(0.02, 0.15), 3),
                "message": self.rng.random() < 0.3,
                "durable": self.rng.random() < 0.4,
                "steer_reads": self.rng.random() < 0.6,
            }
            on_busy: OnBusy = "enqueue"
            if self.rng.random() < TREE_FRACTION:  # a tree: the root spawns children, waits, answers
                child = {**request, "steps": self.rng.randint(1, 3), "durable": True}
                request = {"tree": self.rng.randint(2, 4), "child": child, "message": True}
            elif i and self.rng.random() < STEER_FRACTION:  # a steering message into the turn before
                on_busy = "steer"
            rid = await self.enqueue(cid, request, i, on_busy)
            if rid is not None and self.rng.random() < self.prof.tail_fraction:
                tails.start_soon(self.follow, rid)
            if rid is not None and "tree" in request and self.rng.random() < 0.5:
                tails.start_soon(self.follow, rid, True)  # the whole tree's stream too
            if self.rng.random() < 0.5:
                await anyio.sleep(self.rng.uniform(0, 0.3))
        if self.rng.random() < self.prof.stop_probability:
            await anyio.sleep(self.rng.uniform(0, 1.0))
            await self.stop(cid)

    async def load(self, until: float, tails: anyio.abc.TaskGroup) -> None:
        convs = [f"conv-{i:03d}" for i in range(self.prof.conversations)]
        async with anyio.create_task_group() as tg:
            while anyio.current_time() < until:
                await anyio.sleep(self.rng.expovariate(self.prof.rate / 2.5))
                if self.backlog > self.prof.max_backlog:
                    continue
                tg.start_soon(self.burst, self.rng.choice(convs), tails)

    async def watch_backlog(self) -> None:
        while True:
            with contextlib.suppress(*TRANSIENT):
                rows = await self.sql(
                    "SELECT count(*) FROM {run} WHERE status IN ('queued', 'running')", attempts=1
                )
                self.backlog = int(rows[0][0])
            await anyio.sleep(1.0)

    # -- faults -------------------------------------------------------------------------

    async def faults(self, until: float, tails: anyio.abc.TaskGroup) -> None:
        deck: list[str] = []
        limiter = anyio.Semaphore(3)
        async with anyio.create_task_group() as tg:
            while True:
                await anyio.sleep(self.rng.uniform(*self.prof.fault_every))
                if anyio.current_time() >= until:
                    break
                if not deck:
                    deck = list(FAULT_KINDS)
                    self.rng.shuffle(deck)
                tg.start_soon(self.inject, deck.pop(), limiter, tails)

    async def inject(self, kind: str, limiter: anyio.Semaphore, tails: anyio.abc.TaskGroup) -> None:
        async with limiter:
            try:
                if kind in HOOK_KINDS:
                    await self.hook_fault(kind, tails)
                else:
                    await getattr(self, f"fault_{kind}")()
            except Exception as exc:
                self.stats.faults_failed[kind] = self.stats.faults_failed.get(kind, 0) + 1
                self.log(f"fault {kind} failed: {exc!r}")
                traceback.print_exc()

    async def hook_fault(self, kind: str, tails: anyio.abc.TaskGroup) -> None:
        if self.switching:
            return self.skip(kind, "workers are being replaced")
        self.hook_faults_in_flight += 1
        try:
            fid = uuid.uuid4().hex[:12]
            request = {"steps": 4, "delay": 0.05, "hook": HOOK_KINDS[kind], "fault": fid, "hook_wait": 8.0}
            request["message"] = self.rng.random() < 0.5
            rid = await self.enqueue(f"hook-{fid}", request, 0)
            if rid is None:
                return self.skip(kind, "enqueue failed")
            tails.start_soon(self.follow, rid)
            path = self.hook_dir / f"{fid}.json"
            with anyio.move_on_after(15):
                while not path.exists():
                    await anyio.sleep(0.02)
            if not path.exists():
                return self.skip(kind, f"run {rid} did not reach its hook")
            info = json.loads(path.read_text())
            w = self.worker_by_pid(info["pid"])
            if w is None or w.state != "running" or self.switching:
                return self.skip(kind, f"worker {info['worker_id']} is not available")
            if kind == "sigstop":
                await self.stall(w, kind)
            else:
                await self.kill(w, kind, info)
        finally:
            self.hook_faults_in_flight -= 1

    async def victims(self, w: Worker) -> list[uuid.UUID]:
        rows = await self.sql(
            "SELECT id FROM {run} WHERE worker_id = %s AND status = 'running'", (w.worker_id,)
        )
        return [r[0] for r in rows]

    async def kill(self, w: Worker, kind: str, info: dict[str, Any]) -> None:
        at = now()
        w.proc.kill()
        w.state = "dead"
        while w.proc.poll() is None:
            await anyio.sleep(0.01)
        victims = await self.victims(w)
        self.spawn(w.slot)
        await self.record_fault(
            kind, at, worker_id=w.worker_id, victims=victims, detail={"hooked_run": info["run_id"]}
        )

    async def stall(self, w: Worker, kind: str) -> None:
        if self.stall_lock.locked():
            return self.skip(kind, "another worker is stopped")
        async with self.stall_lock:
            at = now()
            w.proc.send_signal(signal.SIGSTOP)
            w.state = "stopped"
            victims = await self.victims(w)
            p = self.prof
            await anyio.sleep(p.lease + p.grace + p.poll + 1.0)
            w.proc.send_signal(signal.SIGCONT)
            if w.state == "stopped":
                w.state = "running"
            await self.record_fault(kind, at, ended_at=now(), worker_id=w.worker_id, victims=victims)

    async def wait_connected(self, worker_ids: list[str], timeout: float) -> None:
        """Waits (bounded) until every worker in ``worker_ids`` has a database connection."""
        with anyio.move_on_after(timeout):
            while True:
                rows = await self.sql(
                    "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                    "WHERE application_name = ANY(%s)",
                    (worker_ids,),
                )
                if rows[0][0] >= len(worker_ids):
                    return
                await anyio.sleep(0.1)
        self.log(f"workers {worker_ids} not connected after {timeout}s; retiring the old ones anyway")

    async def backends(self, hubs: bool) -> list[tuple[int, str, str]]:
        rows = await self.sql(
            "SELECT pid, application_name, state, query FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND (application_name LIKE 'chaos-w%%' OR application_name = 'chaos-runner-hub')"
        )
        out = []
        for pid, app, state, query in rows:
            is_hub = app == "chaos-runner-hub" or query.lstrip().upper().startswith(
                ("LISTEN", "UNLISTEN", "SELECT 1")
            )
            if is_hub == hubs and (hubs or app != "chaos-runner-hub"):
                out.append((pid, app, state or ""))
        return out

    async def fault_terminate_worker_conn(self) -> None:
        cands = await self.backends(hubs=False)
        if not cands:
            return self.skip("terminate_worker_conn", "no worker connection")
        active = [c for c in cands if c[2] == "active"]
        chosen = self.rng.sample(active or cands, min(len(active or cands), self.rng.randint(1, 3)))
        at = now()
        for pid, _, _ in chosen:
            await self.sql("SELECT pg_terminate_backend(%s)", (pid,))
        await self.record_fault(
            "terminate_worker_conn", at, detail={"backends": [[c[1], c[2]] for c in chosen]}
        )

    async def fault_terminate_hub_listener(self) -> None:
        cands = await self.backends(hubs=True)
        if not cands:
            return self.skip("terminate_hub_listener", "no listener")
        pid, app, _ = self.rng.choice(cands)
        at = now()
        await self.sql("SELECT pg_terminate_backend(%s)", (pid,))
        await self.record_fault("terminate_hub_listener", at, detail={"listener": app})

    async def fault_pg_restart(self) -> None:
        if self.pg_lock.locked():
            return self.skip("pg_restart", "a restart is in progress")
        async with self.pg_lock:
            at = now()
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self.pg_thread, self.emb.restart, "immediate")
            ended = now()
            await self.record_fault("pg_restart", at, ended_at=ended, outage=True)

    async def fault_proxy_cut(self) -> None:
        fraction = self.rng.choice((0.3, 0.6, 1.0))
        at = now()
        n = self.proxy.cut(fraction, self.rng)
        await self.record_fault("proxy_cut", at, detail={"fraction": fraction, "connections": n})

    async def fault_proxy_delay(self) -> None:
        delay, seconds = round(self.rng.uniform(0.05, 0.3), 3), round(self.rng.uniform(2.0, 4.0), 2)
        at = now()
        self.proxy.delay = delay
        await anyio.sleep(seconds)
        self.proxy.delay = 0.0
        await self.record_fault(
            "proxy_delay", at, ended_at=now(), detail={"delay": delay, "seconds": seconds}
        )

    async def switch_notify(self, on: bool, tg: anyio.abc.TaskGroup) -> None:
        """Replaces every worker by one with notifications on or off (rolling); the old
        ones drain in the background."""
        self.switching = True
        try:
            with anyio.move_on_after(30):
                while self.hook_faults_in_flight:
                    await anyio.sleep(0.1)
            self.notify_on = on
            olds = list(self.workers.items())
            new = [self.spawn(slot).worker_id for slot, _ in olds]
            # Rolling, as a deploy would be: the old workers drain only once their
            # replacements are connected, so some worker's reaper covers every moment
            # (retiring first left seconds without one while the new processes started).
            await self.wait_connected(new, timeout=20)
            for _, old in olds:
                tg.start_soon(self.retire, old)
        finally:
            self.switching = False

    async def phases(self, start: float) -> None:
        async with anyio.create_task_group() as tg:
            for a, b in self.prof.notify_off:
                await anyio.sleep_until(start + a * self.prof.load_seconds)
                at = now()
                self.log("notifications off: workers restarted with --no-notify, tails poll")
                await self.switch_notify(False, tg)
                await anyio.sleep_until(start + b * self.prof.load_seconds)
                await self.switch_notify(True, tg)
                self.log("notifications back on")
                await self.record_fault("notify_off", at, ended_at=now())

    # -- the whole run ------------------------------------------------------------------

    async def settle(self) -> bool:
        """Waits until no run is queued or running (bounded); True if it got there."""
        for w in self.workers.values():
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
        with anyio.move_on_after(self.prof.settle_seconds):
            while True:
                with contextlib.suppress(*TRANSIENT):
                    rows = await self.sql(
                        "SELECT count(*) FROM {run} WHERE status IN ('queued', 'running')", attempts=1
                    )
                    if rows[0][0] == 0:
                        return True
                await anyio.sleep(0.3)
        return False

    async def run(self) -> dict[str, Any]:
        p = self.prof
        info: dict[str, Any] = {"drained": False, "tails_unfinished": 0}
        await self.pool.open(wait=True)
        async with self.hub, anyio.create_task_group() as main:
            await self.proxy.start(main)
            for slot in range(p.workers):
                self.spawn(slot)
            main.start_soon(self.watch_backlog)
            async with anyio.create_task_group() as tails:
                start = anyio.current_time()
                until = start + p.load_seconds
                self.log(
                    f"load for {p.load_seconds:.0f}s: {p.conversations} conversations, {p.workers} workers"
                )
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.load, until, tails)
                    tg.start_soon(self.faults, until - 3, tails)
                    tg.start_soon(self.phases, start)
                self.proxy.delay = 0.0
                self.log(f"load done ({self.stats.enqueued} turns); settling")
                info["drained"] = await self.settle()
                with anyio.move_on_after(30):
                    while any(not t.finished for t in self.transcripts):
                        await anyio.sleep(0.2)
                info["tails_unfinished"] = sum(1 for t in self.transcripts if not t.finished)
                tails.cancel_scope.cancel()
            self.log("stopping workers")
            async with anyio.create_task_group() as tg:
                for w in list(self.workers.values()):
                    tg.start_soon(self.retire, w)
            main.cancel_scope.cancel()
        return info

    async def close(self) -> None:
        for w in [*self.workers.values(), *self.retired]:
            if w.proc.poll() is None:
                w.proc.kill()
        with anyio.move_on_after(10, shield=True):
            await self.pool.close()


def build_report(
    prof: Profile,
    seed: int,
    started: datetime,
    elapsed: float,
    result: Any,
    chaos: Chaos,
    info: dict[str, Any],
    error: str | None,
) -> dict[str, Any]:
    invariants = dict.fromkeys(INVARIANTS, False) if result is None else result.invariants
    ok = error is None and result is not None and result.ok and info.get("drained", False)
    faults = {} if result is None else {k: result.faults.get(k, 0) for k in (*FAULT_KINDS, "notify_off")}
    return {
        "format": REPORT_FORMAT,
        "profile": prof.name,
        "seed": seed,
        "started_at": started.isoformat(),
        "duration_seconds": round(elapsed, 1),
        "ok": ok,
        "error": error,
        "drained": info.get("drained", False),
        "config": asdict(prof),
        "counts": {
            **({} if result is None else result.counts),
            "enqueued": chaos.stats.enqueued,
            "enqueue_failures": chaos.stats.enqueue_failures,
            "stop_failures": chaos.stats.stop_failures,
            "tail_errors": chaos.stats.tail_errors,
            "tails_unfinished": info.get("tails_unfinished", 0),
            "worker_processes": chaos.stats.workers_spawned,
            "proxy_connections": chaos.proxy.accepted,
        },
        "faults": faults,
        "faults_total": sum(faults.values()),
        "faults_skipped": chaos.stats.faults_skipped,
        "faults_failed": chaos.stats.faults_failed,
        "recovery_seconds": summary([] if result is None else result.recovery_seconds),
        "recovery_seconds_by_kind": {}
        if result is None
        else {k: summary(v) for k, v in sorted(result.recovery_by_kind.items())},
        "stop_seconds": summary([] if result is None else result.stop_seconds),
        "reap_lateness_seconds": summary([] if result is None else result.reap_lateness_seconds),
        "invariants": invariants,
        "violation_counts": {} if result is None else result.violation_counts,
        "violations": {} if result is None else result.violations,
        "artifacts": str(chaos.art),
    }


async def dump_evidence(conn: AsyncConnection, result: Any, path: Path) -> None:
    """The rows behind each violation (run row, transition log, journal), for the report."""
    import re

    ids = sorted(
        {m for lst in result.violations.values() for line in lst for m in re.findall(r"[0-9a-f-]{36}", line)}
    )[:60]
    out: dict[str, Any] = {}
    for rid in ids:
        row: dict[str, Any] = {}
        for key, query in (
            ("run", "SELECT * FROM {run} WHERE id = %s"),
            ("transitions", "SELECT * FROM {c}.transition WHERE run_id = %s ORDER BY seq"),
            ("journal", "SELECT seq, type, payload, created_at FROM {ev} WHERE run_id = %s ORDER BY seq"),
            ("side_effects", "SELECT * FROM {c}.side_effect WHERE run_id = %s ORDER BY step"),
        ):
            q = sql.SQL(query).format(
                run=ident(SCHEMA, "agent_run"), ev=ident(SCHEMA, "run_event"), c=sql.Identifier(CHAOS)
            )
            cur = conn.cursor(row_factory=psycopg.rows.dict_row)
            await cur.execute(q, (rid,))
            row[key] = await cur.fetchall()
        out[rid] = row
    path.write_text(json.dumps(out, indent=1, default=str))


async def amain(args: argparse.Namespace) -> int:
    prof = PROFILES[args.profile]
    if args.load_seconds:
        prof = Profile(**{**asdict(prof), "load_seconds": args.load_seconds})
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    started = now()
    stamp = started.strftime("%Y%m%d-%H%M%S")
    art = (
        Path(args.artifacts)
        if args.artifacts
        else ROOT / "tests" / "artifacts" / f"chaos-{prof.name}-{stamp}"
    )
    art.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    # fsync off is safe against a server crash (the OS keeps what was written), but
    # synchronous_commit must stay on: otherwise an acknowledged commit can be lost.
    emb = EmbeddedPostgres(
        tcp=True, fast=True, settings={"max_connections": "400", "synchronous_commit": "on"}
    )
    emb.start()
    chaos: Chaos | None = None
    result = None
    info: dict[str, Any] = {}
    error: str | None = None
    try:
        with psycopg.connect(emb.conninfo(), autocommit=True) as c:
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DBNAME)))
        dsn = emb.conninfo(DBNAME)
        await runrow.migrate(dsn, schema=SCHEMA)
        meta = {"lease": prof.lease, "heartbeat": prof.heartbeat, "grace": prof.grace, "tick": prof.poll}
        async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
            await install(
                conn, SCHEMA, CHAOS, {**meta, "slack": prof.slack, "profile": prof.name, "seed": seed}
            )
        chaos = Chaos(prof, seed, art, emb, dsn)
        chaos.log(f"profile {prof.name}, seed {seed}, artifacts {art}")
        try:
            with anyio.fail_after(prof.hard_timeout):
                info = await chaos.run()
        except TimeoutError:
            error = f"hard timeout ({prof.hard_timeout:.0f}s) hit"
        except Exception as exc:
            error = f"runner crashed: {exc!r}"
            traceback.print_exc()
        finally:
            await chaos.close()
        if error:
            chaos.log(error)
        (art / "transcripts.json").write_text(json.dumps([t.to_json() for t in chaos.transcripts]))
        with anyio.fail_after(120):
            async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
                result = await check(conn, SCHEMA, CHAOS, chaos.transcripts)
                if not result.ok:
                    await dump_evidence(conn, result, art / "evidence.json")
    finally:
        with contextlib.suppress(OSError):
            (art / "server.log").write_bytes(emb.log_path.read_bytes())
        emb.stop()
        if chaos is not None:
            chaos.pg_thread.shutdown(wait=False)  # only now: the server is tied to that thread
    assert chaos is not None
    report = build_report(prof, seed, started, time.monotonic() - t0, result, chaos, info, error)
    text = json.dumps(report, indent=2, default=str)
    Path(args.report).write_text(text + "\n")
    (art / "report.json").write_text(text + "\n")
    inv = report["invariants"]
    chaos.log(
        f"{report['counts'].get('runs', 0)} runs, {report['faults_total']} faults, recovery "
        f"{report['recovery_seconds']}, invariants: {sum(inv.values())}/{len(inv)} hold"
    )
    for name, ok in inv.items():
        if not ok:
            chaos.log(f"FAILED {name}: {report['violations'].get(name, ['(see error)'])[:3]}")
    if error:
        return 2
    return 0 if report["ok"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="short")
    parser.add_argument("--report", required=True, help="where to write the JSON report")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--artifacts", help="folder for logs and transcripts (default tests/artifacts/...)")
    parser.add_argument("--load-seconds", type=float, help="override the profile's load duration")
    args = parser.parse_args()
    prof = PROFILES[args.profile]
    # Last resort: if the event loop itself wedges, end the process (children follow it).
    watchdog = threading.Timer(prof.hard_timeout + 240, lambda: os._exit(3))
    watchdog.daemon = True
    watchdog.start()
    return anyio.run(amain, args, backend="asyncio")


if __name__ == "__main__":
    sys.exit(main())
