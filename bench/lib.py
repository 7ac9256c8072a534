"""Shared pieces of the benchmark suite: results, statistics, schemas, child processes."""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
import uuid
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import psycopg
from psycopg import sql

import runrow
from runrow._gateway import endings, journal, statement_positional, statement_text
from runrow._names import Channels

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from anyio.abc import Process

BENCH_DIR = Path(__file__).resolve().parent
CHILD = BENCH_DIR / "child.py"


# -- profiles ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    name: str
    reps: int  # repetitions of each throughput measurement (interleaved with the baseline)
    runs: int  # runs drained per throughput measurement
    peer_jobs: int  # jobs drained per peer measurement
    enqueue_runs: int  # runs enqueued per enqueue measurement
    latency_samples: int  # wake / tail samples per variant
    cancel_samples: int
    journal_deltas: int  # deltas streamed by one run ...
    journal_seconds: float  # ... over this long
    stream_runs: int  # concurrent streaming runs (journal 200-run case, memory)
    stream_seconds: float
    fanout_tails: int
    fanout_idle: float
    scale_small: int  # finished runs in the small table
    scale_big: int  # finished runs in the big table
    scale_events_small: int  # journal rows in the small table
    scale_events_big: int
    scale_samples: int
    concurrencies: tuple[int, ...] = (1, 4, 16)
    full_concurrencies: tuple[int, ...] = (4, 16)  # throughput_full cases
    peer_concurrencies: tuple[int, ...] = (4,)
    # Drains scale with the jobs in flight, so a fast case is not over in a few tenths of
    # a second (where one stall is a tenth of the figure): a drain is at least
    # runs / peer_jobs and drain_per_slot x in flight, up to drain_max (0: no scaling).
    drain_per_slot: int = 0
    drain_max: int = 0
    peer_reps: int = 0  # repetitions of the peers scenario (0: reps)
    # backlog (issue #17): queued runs at depth (vs 2,000), the drain's timed window of runs
    # after a warm-up (the median of backlog_reps windows, each from full depth) and its
    # time cap in seconds, (d)'s samples per variant, the runs queued in case (c)'s one
    # conversation, and whether (d) is also sampled on stale statistics.
    backlog_depth: int = 100_000
    backlog_window: int = 1_000
    backlog_warmup: int = 50
    backlog_reps: int = 3
    backlog_cap: float = 10.0
    backlog_samples: int = 40
    backlog_big: int = 10_000
    backlog_stale_d: bool = True

    def drain_size(self, base: int, in_flight: int) -> int:
        """Jobs to drain for a measurement with ``in_flight`` jobs picked at once."""
        return max(base, min(self.drain_per_slot * in_flight, self.drain_max))


PROFILES = {
    "quick": Profile(
        name="quick",
        reps=2,
        runs=1_000,
        peer_jobs=1_000,
        enqueue_runs=200,
        latency_samples=40,
        cancel_samples=8,
        journal_deltas=2_500,
        journal_seconds=2.5,
        stream_runs=200,
        stream_seconds=2.0,
        fanout_tails=1_000,
        fanout_idle=3.0,
        scale_small=1_000,
        scale_big=100_000,
        scale_events_small=100_000,
        scale_events_big=200_000,
        scale_samples=100,
        full_concurrencies=(4,),
    ),
    "full": Profile(
        name="full",
        reps=3,
        runs=1_500,
        peer_jobs=1_500,
        enqueue_runs=800,
        latency_samples=300,
        cancel_samples=60,
        journal_deltas=10_000,
        journal_seconds=10.0,
        stream_runs=200,
        stream_seconds=10.0,
        fanout_tails=1_000,
        fanout_idle=10.0,
        scale_small=1_000,
        scale_big=1_000_000,
        scale_events_small=100_000,
        scale_events_big=1_000_000,
        scale_samples=400,
        full_concurrencies=(1, 4, 16),
        peer_concurrencies=(1, 4, 16),
        drain_per_slot=250,
        drain_max=6_000,
        peer_reps=5,
        backlog_warmup=100,
        backlog_reps=9,
        backlog_cap=40.0,
        backlog_samples=200,
    ),
}
# CI's check that every scenario still runs end to end: one repetition of each, small
# sizes. Its figures are too small to mean anything; quick and full are for numbers.
PROFILES["smoke"] = replace(
    PROFILES["quick"],
    name="smoke",
    reps=1,
    peer_reps=1,
    runs=300,
    peer_jobs=300,
    enqueue_runs=100,
    latency_samples=10,
    cancel_samples=3,
    journal_deltas=500,
    journal_seconds=1.0,
    stream_runs=50,
    stream_seconds=1.0,
    fanout_tails=200,
    fanout_idle=1.0,
    scale_big=10_000,
    scale_events_big=20_000,
    scale_samples=20,
    backlog_depth=10_000,
    backlog_window=300,
    backlog_reps=1,
    backlog_cap=5.0,
    backlog_samples=10,
    backlog_big=2_000,
    backlog_stale_d=False,
)


# -- results ----------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the report: runrow's figure next to its same-run baseline."""

    scenario: str
    case: str
    value: float | None
    unit: str
    min: float | None = None
    max: float | None = None
    baseline: float | None = None
    baseline_label: str = ""
    ratio: float | None = None
    goal: str = ""
    met: bool | None = None
    note: str = ""
    samples: list[float] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("samples")
        d["reps"] = [round(s, 4) for s in self.samples]
        return d


def summary(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of per-repetition figures."""
    return statistics.median(values), min(values), max(values)


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of ``values``."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def chunks(values: list[float], n: int) -> list[list[float]]:
    """Splits samples (taken in rounds) into ``n`` blocks, for a min-max across blocks."""
    n = max(1, min(n, len(values)))
    size = math.ceil(len(values) / n)
    return [values[i : i + size] for i in range(0, len(values), size)]


def latency_rows(
    scenario: str,
    case: str,
    samples_ms: list[float],
    blocks: int,
    *,
    baseline: list[float] | None = None,
    baseline_label: str = "",
    goals: tuple[tuple[str, Callable[[float], bool]] | None, tuple[str, Callable[[float], bool]] | None] = (
        None,
        None,
    ),
    note: str = "",
) -> list[Row]:
    """p50 and p99 rows: the value pools every sample, min-max spans the blocks' figures."""
    rows = []
    for p, goal in zip((50, 99), goals, strict=True):
        if not samples_ms:
            rows.append(Row(scenario, f"{case} p{p}", None, "ms", note="no samples"))
            continue
        per_block = [pct(b, p) for b in chunks(samples_ms, blocks)]
        value = pct(samples_ms, p)
        base = pct(baseline, p) if baseline else None
        rows.append(
            Row(
                scenario,
                f"{case} p{p}",
                value,
                "ms",
                min(per_block),
                max(per_block),
                base,
                baseline_label,
                ratio(value, base),
                goal[0] if goal else "",
                goal[1](value) if goal else None,
                note,
                per_block,
            )
        )
    return rows


# -- database helpers -------------------------------------------------------------------


class Bench:
    """What every scenario gets: the server's conninfo, the profile, a few helpers."""

    def __init__(self, conninfo: str, profile: Profile) -> None:
        self.conninfo = conninfo
        self.profile = profile
        self.raw_wake_ms: list[float] = []  # the raw LISTEN/NOTIFY round trip (wake scenario)
        self.quiesced = 0.0  # seconds spent in quiesce(), in all

    def app_conninfo(self, name: str) -> str:
        return psycopg.conninfo.make_conninfo(self.conninfo, application_name=name)

    @asynccontextmanager
    async def schema(self, tag: str) -> AsyncIterator[str]:
        """A freshly migrated runrow schema, dropped afterwards."""
        name = f"b_{tag}_{uuid.uuid4().hex[:6]}"
        await runrow.migrate(self.conninfo, schema=name)
        try:
            yield name
        finally:
            async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
                await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))

    async def enqueue_many(
        self, schema: str, n: int, *, connections: int = 8, prefix: str = "c", content: Any = "hi"
    ) -> list[Any]:
        """Enqueues ``n`` runs, one conversation each, through runrow's public API."""
        ids: list[Any] = []
        conns = [
            await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) for _ in range(connections)
        ]
        try:

            async def worker(k: int) -> None:
                for i in range(k, n, connections):
                    r = await runrow.enqueue(
                        conns[k], conversation_id=f"{prefix}{i}", user_id="u", content=content, schema=schema
                    )
                    ids.append(r.id)

            async with anyio.create_task_group() as tg:
                for k in range(connections):
                    tg.start_soon(worker, k)
        finally:
            for c in conns:
                await c.close()
        return ids

    async def active_count(self, conn: psycopg.AsyncConnection, schema: str) -> int:
        cur = await conn.execute(
            sql.SQL("SELECT count(*) FROM {}.agent_run WHERE status IN ('queued', 'running')").format(
                sql.Identifier(schema)
            )
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def quiesce(self, timeout: float = 20.0) -> float:
        """Waits, untimed and bounded, until no autovacuum worker runs on the server, and
        returns the seconds waited: one measurement's clean-up (a peer's deleted jobs, a
        dropped schema) must not be billed to the next system measured."""
        t0 = time.monotonic()
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            with anyio.move_on_after(timeout):
                while True:
                    cur = await conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
                    )
                    row = await cur.fetchone()
                    if not row or not row[0]:
                        break
                    await anyio.sleep(0.05)
        waited = time.monotonic() - t0
        self.quiesced += waited
        return waited

    async def wait_drained(self, schema: str, timeout: float, step: float = 0.01) -> float:
        """Polls every ``step`` seconds until no run is queued or running; returns the
        monotonic time it saw that. (Each poll counts the live runs: a cost to the server
        the measured workers share, so a caller whose clock comes from elsewhere polls
        seldom.)"""
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            with anyio.fail_after(timeout):
                while await self.active_count(conn, schema):
                    await anyio.sleep(step)
        return time.monotonic()


def statement(name: str, schema: str) -> bytes:
    """A runrow SQL statement (sql/*.sql) rendered for ``schema``: the bare baselines run these."""
    return statement_text(name, schema)


def positional(name: str, schema: str) -> Any:
    """The statement with ``$n`` placeholders, as runrow sends the claim and finalize (on a
    ``psycopg.AsyncRawCursor``: ``cur.execute(p.query, p.bind(params))``). The bare loops
    send them so too, so that a baseline pays the same driver cost per statement."""
    return statement_positional(name, schema)


_COMPLETED = '{"status": "completed"}'


def finalize_params(
    ch: Channels, ends: list[tuple[Any, Any, int]], *, partial: str | None = None
) -> dict[str, Any]:
    """The finalize statement's parameters (built by runrow's gateway) for runs completed
    with no error: ``ends`` is (run id, claim token, seq of the terminal event) per run."""
    return endings.finalize_params(
        [
            endings.Ending(
                run_id=r,
                claim_token=t,
                status="completed",
                error=None,
                partial=partial,
                events=[(seq, "complete", _COMPLETED)],
            )
            for r, t, seq in ends
        ],
        ch,
    )


def append_params(ch: Channels, rows: list[tuple[Any, Any, int, str, str]]) -> dict[str, Any]:
    """The append_events statement's parameters (built by runrow's gateway): (run id,
    token, seq, type, payload JSON) per event, one run's events in a row."""
    batch = [journal.Appended(r, t, [(seq, etype, payload)]) for r, t, seq, etype, payload in rows]
    return journal.append_params(batch, ch)


def channels(schema: str) -> Channels:
    return Channels.for_schema(schema)


async def poll_until(cond: Callable[[], bool], timeout: float, step: float = 0.002) -> None:
    """Waits for ``cond()`` with a bound (a benchmark helper, not a test)."""
    with anyio.fail_after(timeout):
        while not cond():
            await anyio.sleep(step)


# -- child processes --------------------------------------------------------------------


class Child:
    """A benchmark child process (bench/child.py) spoken to by lines on stdin/stdout."""

    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self._buf = b""
        assert proc.stdout is not None and proc.stdin is not None

    async def line(self, timeout: float = 60.0) -> str:
        assert self.proc.stdout is not None
        with anyio.fail_after(timeout):
            while b"\n" not in self._buf:
                chunk = await self.proc.stdout.receive()
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    async def expect(self, prefix: str, timeout: float = 60.0) -> str:
        """The next line starting with ``prefix`` (its remainder); other lines are skipped."""
        while True:
            line = await self.line(timeout)
            if line.startswith(prefix):
                return line[len(prefix) :].strip()

    async def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send((text + "\n").encode())

    async def result(self, timeout: float = 120.0) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(await self.expect("RESULT", timeout))
        return data


@asynccontextmanager
async def child(mode: str, **args: Any) -> AsyncIterator[Child]:
    """Starts ``bench/child.py mode`` and stops it on exit."""
    cmd = [sys.executable, str(CHILD), mode, json.dumps(args)]
    errlog = open(BENCH_DIR / "results" / f"child-{mode}.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        async with await anyio.open_process(cmd, stderr=errlog) as proc:
            c = Child(proc)
            try:
                yield c
            finally:
                if proc.returncode is None:
                    with anyio.move_on_after(15, shield=True):
                        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                            await c.send("stop")
                        await proc.wait()
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()
    finally:
        errlog.close()


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


async def journal_partitions_from(conn: psycopg.AsyncConnection, schema: str, ago: Any) -> None:
    """Remakes a fresh schema's journal partitions (schema 20 on) to start ``ago`` (a
    timedelta) before now and run contiguously past it: a load of runs made in the past
    needs them. Only for a schema with no run yet."""
    s = sql.Identifier(schema)
    for part in await runrow.journal_partitions(conn, schema=schema):
        if part.starts is not None:
            name = sql.Identifier(schema, part.name)
            await conn.execute(sql.SQL("ALTER TABLE {}.run_event DETACH PARTITION {}").format(s, name))
            await conn.execute(sql.SQL("DROP TABLE {}").format(name))
    await conn.execute(sql.SQL("SELECT {}.journal_ensure_partitions(now() - %s)").format(s), (ago,))
    await runrow.ensure_journal_partitions(conn, schema=schema)
