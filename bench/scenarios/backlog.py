"""backlog: does runrow stay as fast with 100,000 runs queued as with 2,000? (issue #17)

A backlog is seeded in bulk SQL (untimed; the rows runrow.enqueue writes: message, run,
journal seq 1-2), on top of a small finished history, in one of these shapes:

- (a) 100,000 queued over 500 conversations, one tenant;
- (b) 100,000 queued over 10,000 conversations and 100 tenants;
- (c) 10,000 queued in one conversation (the oldest: its later turns head the queue and
  are all blocked behind its first) plus 100 other busy conversations with 2,000 queued;
- (d) gated enqueue (max_queued_per_tenant / max_queued_per_conversation) and
  ``queue_position``, in shape (b).

Each is measured against the same shape with 2,000 queued, in the same run. A drain is
a real ``runrow.Dispatcher`` at concurrency 16 running no-op agents; the clock covers a
window of runs (after a short warm-up), not the whole backlog, so the queue stays at
depth while measured. The statistics are measured both ways a burst leaves them: stale
(ANALYZE ran on the history, before the burst; autovacuum is kept off these tables so
the state cannot change under the measurement) and fresh (VACUUM ANALYZE after the
burst). The four queues of a case (2,000 and deep, stale and fresh) live in their own
schemas and their drain windows are taken in interleaved rounds, each from full depth.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import psycopg
from lib import Bench, Row, latency_rows, poll_until, ratio
from psycopg import sql

import runrow

# -- seeding ------------------------------------------------------------------------------

# Queued runs g = 0 .. n-1, in queue order: conversation g % conversations, its tenant
# (conversation % tenants), or no tenant when tenants = 0.
SEED_QUEUED = """
WITH run AS (
    INSERT INTO {s}.agent_run (conversation_id, user_id, tenant_id, user_message_id, priority)
    SELECT %(prefix)s || '-' || (g %% %(conversations)s), 'u',
           CASE WHEN %(tenants)s > 0 THEN 't' || ((g %% %(conversations)s) %% %(tenants)s) END,
           gen_random_uuid(), 0
    FROM generate_series(0, %(n)s - 1) g
    ORDER BY g
    RETURNING id, user_message_id, conversation_id, queue_order
), msg AS (
    INSERT INTO {s}.message (id, conversation_id, run_id, role, content, status, user_id, turn)
    SELECT user_message_id, conversation_id, id, 'user', '"seeded"'::jsonb, 'sent', 'u', queue_order FROM run
), ev AS (
    INSERT INTO {s}.run_event (run_id, seq, type, payload)
    SELECT id, 1, 'user_message_created', '{{}}'::jsonb FROM run
    UNION ALL
    SELECT id, 2, 'run_queued', '{{}}'::jsonb FROM run
)
SELECT count(*) FROM run
"""

# The finished history a live system has (runs that ended in the last minutes).
FINISH_HISTORY = """
UPDATE {s}.agent_run SET status = 'completed', claim_token = gen_random_uuid(),
    claim_expires_at = now(), started_at = now() - interval '10 minutes' + queue_order * interval '1 ms',
    finished_at = now() - interval '10 minutes' + queue_order * interval '2 ms'
WHERE status = 'queued'
"""

HISTORY = 2_000
BASE_DEPTH = 2_000


@dataclass(frozen=True)
class Shape:
    """A backlog: (runs, conversations, tenants, prefix) groups seeded in this order."""

    key: str
    label: str
    groups: tuple[tuple[int, int, int, str], ...]

    @property
    def queued(self) -> int:
        return sum(g[0] for g in self.groups)


def shapes(depth: int, big_conversation: int) -> dict[str, tuple[Shape, Shape]]:
    """Each case's (baseline, at depth) shapes."""
    return {
        "a": (
            Shape("a", f"{BASE_DEPTH:,} over 500 conversations", ((BASE_DEPTH, 500, 0, "a"),)),
            Shape("a", f"{depth:,} over 500 conversations, 1 tenant", ((depth, 500, 0, "a"),)),
        ),
        "b": (
            Shape(
                "b", f"{BASE_DEPTH:,} over 2,000 conversations, 100 tenants", ((BASE_DEPTH, 2_000, 100, "b"),)
            ),
            Shape(
                "b",
                f"{depth:,} over 10,000 conversations, 100 tenants",
                ((depth, 10_000, 100, "b"),),
            ),
        ),
        "c": (
            Shape("c", f"{BASE_DEPTH:,} over 100 conversations", ((BASE_DEPTH, 100, 0, "c"),)),
            Shape(
                "c",
                f"{big_conversation:,} in 1 conversation + {BASE_DEPTH:,} over 100 others",
                ((big_conversation, 1, 0, "big"), (BASE_DEPTH, 100, 0, "c")),
            ),
        ),
    }


async def seed(conninfo: str, schema: str, shape: Shape, *, analyze: bool) -> float:
    """History (analyzed), then the burst; ``analyze`` refreshes the statistics after it.
    Autovacuum is off on these tables, so stale statistics stay stale while measured."""
    t0 = time.monotonic()
    s = sql.Identifier(schema)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        # (A partitioned journal takes the setting on its partitions, not on itself.)
        cur = await conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = to_regclass(%s)",
            (sql.SQL("{}.run_event").format(s).as_string(conn),),
        )
        parts = [row[0] for row in await cur.fetchall()] or ["run_event"]
        for t in ("agent_run", "message", *parts):
            await conn.execute(
                sql.SQL("ALTER TABLE {}.{} SET (autovacuum_enabled = false)").format(s, sql.Identifier(t))
            )
        await conn.execute(
            sql.SQL(SEED_QUEUED).format(s=s),
            {"prefix": "hist", "conversations": HISTORY, "tenants": 0, "n": HISTORY},
        )
        await conn.execute(sql.SQL(FINISH_HISTORY).format(s=s))
        for t in ("agent_run", "message", "run_event"):
            await conn.execute(sql.SQL("VACUUM ANALYZE {}.{}").format(s, sql.Identifier(t)))
        for n, conversations, tenants, prefix in shape.groups:
            await conn.execute(
                sql.SQL(SEED_QUEUED).format(s=s),
                {"prefix": prefix, "conversations": conversations, "tenants": tenants, "n": n},
            )
        if analyze:
            for t in ("agent_run", "message", "run_event"):
                await conn.execute(sql.SQL("ANALYZE {}.{}").format(s, sql.Identifier(t)))
    return time.monotonic() - t0


async def _analyze(conninfo: str, *schemas: str) -> None:
    """What autovacuum does after a burst (insert-triggered vacuum, analyze), now."""
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        for schema in schemas:
            for t in ("agent_run", "message", "run_event"):
                await conn.execute(
                    sql.SQL("VACUUM ANALYZE {}.{}").format(sql.Identifier(schema), sql.Identifier(t))
                )


# -- the drain ----------------------------------------------------------------------------


class _ClaimTimes(runrow.Observer):
    def __init__(self) -> None:
        self.ms: list[float] = []

    def claimed(self, *, count: int, seconds: float) -> None:
        self.ms.append(seconds * 1000)


@dataclass
class Drain:
    rate: float  # runs/s over the window
    runs: int  # runs completed in the window
    seconds: float
    claim_ms: float  # median claim statement time in the window (the Dispatcher's own clock)
    per_claim: float  # runs per claim that returned runs, in the window
    capped: bool  # the window hit its time cap before N runs
    reps: list[float] = field(default_factory=list)  # runs/s of every window (drain())


async def drain_window(conninfo: str, schema: str, warmup: int, window: int, cap: float) -> Drain:
    """A Dispatcher(concurrency=16) runs no-op agents; timed: ``window`` runs after ``warmup``
    (or what finishes in ``cap`` seconds). The rest of the backlog stays queued."""

    async def agent(run: runrow.RunContext) -> None:
        return None

    claims = _ClaimTimes()
    async with runrow.Dispatcher(
        conninfo, agent, schema=schema, concurrency=16, poll=1.0, observers=[claims]
    ) as d:

        def done() -> int:
            return d.get_stats()["completed"] + d.get_stats()["failed"]

        # Bounded by cap too: on a slow plan even the warm-up may take a while.
        with anyio.move_on_after(cap):
            await poll_until(lambda: done() >= warmup, timeout=cap + 1, step=0.005)
        c0, t0, k0 = done(), time.monotonic(), len(claims.ms)
        with anyio.move_on_after(cap):
            await poll_until(lambda: done() >= c0 + window, timeout=cap + 1, step=0.005)
        c1, t1 = done(), time.monotonic()
        if d.get_stats()["failed"]:
            raise RuntimeError(f"{d.get_stats()['failed']} runs failed in the backlog drain")
    window_claims = claims.ms[k0:] or claims.ms or [float("nan")]
    per_claim = (c1 - c0) / max(1, len(claims.ms) - k0)
    return Drain(
        (c1 - c0) / (t1 - t0), c1 - c0, t1 - t0, statistics.median(window_claims), per_claim, c1 - c0 < window
    )


async def top_up(conninfo: str, schema: str, shape: Shape) -> int:
    """Refills the queue to the shape's depth (its last group's conversations), so every
    measurement starts at the same depth; returns the runs added."""
    s = sql.Identifier(schema)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT count(*) FROM {}.agent_run WHERE status = 'queued'").format(s)
        )
        row = await cur.fetchone()
        missing = shape.queued - int(row[0] if row else 0)
        if missing > 0:
            _, conversations, tenants, prefix = shape.groups[-1]
            await conn.execute(
                sql.SQL(SEED_QUEUED).format(s=s),
                {"prefix": prefix, "conversations": conversations, "tenants": tenants, "n": missing},
            )
    return max(0, missing)


# -- (d) gated enqueue and queue_position ---------------------------------------------------

# Load shedding set, not reached: the gate counts the tenant's queue (up to the limit) and
# the conversation's, then admits the run.
TENANT_LIMIT = 1_000_000
CONVERSATION_LIMIT = 1_000


class _Sampler:
    """Gated enqueues into the shape's own conversations and queue_position of queued runs."""

    def __init__(self, conn: psycopg.AsyncConnection, schema: str, shape: Shape) -> None:
        self.conn, self.schema, self.shape = conn, schema, shape
        self.i = 0
        self.queued: list[Any] = []

    async def load_ids(self, n: int) -> None:
        """``n`` queued runs spread evenly over the queue (front to back), for queue_position."""
        cur = await self.conn.execute(
            sql.SQL(
                "SELECT id FROM (SELECT id, row_number() OVER (ORDER BY queue_order) AS k, count(*) OVER () AS n"
                " FROM {}.agent_run WHERE status = 'queued') q WHERE k %% greatest(1, n / %s) = 0"
            ).format(sql.Identifier(self.schema)),
            (n,),
        )
        self.queued = [r[0] for r in await cur.fetchall()][:n]

    async def enqueue_ms(self) -> float:
        _, conversations, tenants, prefix = self.shape.groups[-1]
        c = self.i % conversations
        self.i += 1
        t0 = time.perf_counter()
        await runrow.enqueue(
            self.conn,
            conversation_id=f"{prefix}-{c}",
            user_id="u",
            tenant_id=f"t{c % tenants}" if tenants else None,
            content="hi",
            max_queued_per_tenant=TENANT_LIMIT,
            max_queued_per_conversation=CONVERSATION_LIMIT,
            schema=self.schema,
        )
        return (time.perf_counter() - t0) * 1000

    async def position_ms(self, k: int) -> float:
        t0 = time.perf_counter()
        await runrow.queue_position(self.conn, self.queued[k % len(self.queued)], schema=self.schema)
        return (time.perf_counter() - t0) * 1000


async def sample_d(
    b: Bench, s0: str, base: Shape, s1: str, deep: Shape, n: int, cap: float
) -> dict[str, list[float]]:
    """Interleaved rounds: enqueue and queue_position on the 2,000 and the deep queue;
    ``n`` rounds, or fewer if they take more than ``cap`` seconds (a slow plan)."""
    out: dict[str, list[float]] = {"enq0": [], "enq1": [], "pos0": [], "pos1": []}
    async with (
        await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as c0,
        await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as c1,
    ):
        small, big = _Sampler(c0, s0, base), _Sampler(c1, s1, deep)
        await small.load_ids(n)
        await big.load_ids(n)
        deadline = time.monotonic() + cap
        for i in range(-3, n):  # three warm-up rounds
            if i > 0 and time.monotonic() > deadline:
                break
            pair = ((small, "0"), (big, "1")) if i % 2 == 0 else ((big, "1"), (small, "0"))
            for smp, key in pair:
                e, q = await smp.enqueue_ms(), await smp.position_ms(i)
                if i >= 0:
                    out["enq" + key].append(e)
                    out["pos" + key].append(q)
    return out


# -- the scenario ---------------------------------------------------------------------------

DRAIN_GOAL = 0.8  # (a), (b): runs/s at depth / runs/s with 2,000 queued
D_GOAL = 2.0  # (d): p99 at depth / p99 with 2,000 queued
CASE_TITLES = {
    "a": "(a) 100k/500 conv/1 tenant",
    "b": "(b) 100k/10k conv/100 tenants",
    "c": "(c) 10k in 1 conv + 100 busy",
}


def _drain_row(case: str, what: str, got: Drain, base: Drain, base_label: str, goal: bool) -> Row:
    r = ratio(got.rate, base.rate)
    note = (
        f"median of {len(got.reps)}: {got.runs} runs in {got.seconds:.2f}s{' (time cap)' if got.capped else ''}, "
        f"claim median {got.claim_ms:.1f} ms vs {base.claim_ms:.1f} ms, "
        f"{got.per_claim:.1f} vs {base.per_claim:.1f} runs per claim"
    )
    return Row(
        "backlog",
        f"{CASE_TITLES[case]}: drain, {what}",
        got.rate,
        "runs/s",
        min=min(got.reps or [got.rate]),
        max=max(got.reps or [got.rate]),
        baseline=base.rate,
        baseline_label=base_label,
        ratio=r,
        goal=f"ratio >= {DRAIN_GOAL}" if goal else "",
        met=(r is not None and r >= DRAIN_GOAL) if goal else None,
        note=note,
        samples=got.reps or [got.rate],
    )


def _d_rows(case: str, what: str, data: dict[str, list[float]], state: str, blocks: int) -> list[Row]:
    rows = []
    for key, title in (("enq", "gated enqueue"), ("pos", "queue_position")):
        got = latency_rows(
            "backlog",
            f"(d) {title}, {CASE_TITLES[case][4:]}, {state} stats",
            data[key + "1"],
            blocks,
            baseline=data[key + "0"],
            baseline_label=f"{BASE_DEPTH:,} queued",
            goals=(None, (f"p99 ratio <= {D_GOAL:g}", lambda v: True)),
            note=f"{what}; {len(data[key + '1'])} samples",
        )
        for r in got:
            if r.goal:
                r.met = r.ratio is not None and r.ratio <= D_GOAL
        rows += got
    return rows


async def backlog(b: Bench) -> tuple[list[Row], dict[str, Any]]:
    p = b.profile
    depth = p.backlog_depth
    meta: dict[str, Any] = {"depth": depth, "window": p.backlog_window, "cap_seconds": p.backlog_cap}
    rows: list[Row] = []
    blocks = p.reps + 1
    # BACKLOG_CASES=b (say) runs only those cases: for iterating on one of them.
    only = os.environ.get("BACKLOG_CASES", "a,b,c").split(",")
    for case, (base, deep) in shapes(depth, p.backlog_big).items():
        if case not in only:
            continue
        async with contextlib.AsyncExitStack() as stack:
            # Four queues, each in its own schema: the 2,000 and the deep one, each with
            # statistics left stale by the burst and with fresh ones (what autovacuum
            # leaves once it has run: VACUUM ANALYZE). Their drain windows are taken in
            # interleaved rounds, so that a slow stretch of this shared machine falls on
            # all four alike instead of on whichever was measured then.
            queues: dict[str, tuple[str, Shape]] = {}
            seeded = []
            for key, shape, fresh in (
                ("s0", base, False),
                ("s1", deep, False),
                ("f0", base, True),
                ("f1", deep, True),
            ):
                schema = await stack.enter_async_context(b.schema(f"bl{case}{key}"))
                seeded.append(await seed(b.conninfo, schema, shape, analyze=False))
                if fresh:
                    await _analyze(b.conninfo, schema)
                queues[key] = (schema, shape)
            meta[f"seed_seconds_{case}"] = [round(x, 1) for x in seeded]
            windows: dict[str, list[Drain]] = {key: [] for key in queues}
            order = list(queues)
            for r in range(p.backlog_reps):
                for key in order[r % len(order) :] + order[: r % len(order)]:
                    schema, shape = queues[key]
                    await top_up(b.conninfo, schema, shape)
                    await b.quiesce()
                    windows[key].append(
                        await drain_window(
                            b.conninfo, schema, p.backlog_warmup, p.backlog_window, p.backlog_cap
                        )
                    )
            stale0, stale1, fresh0, fresh1 = (_median(windows[k]) for k in ("s0", "s1", "f0", "f1"))
            d_stale = d_fresh = None
            for key in queues:
                await top_up(b.conninfo, *queues[key])
            if case in ("a", "b") and p.backlog_stale_d:
                d_stale = await sample_d(
                    b, queues["s0"][0], base, queues["s1"][0], deep, p.backlog_samples, p.backlog_cap
                )
            if case in ("a", "b"):
                d_fresh = await sample_d(
                    b, queues["f0"][0], base, queues["f1"][0], deep, p.backlog_samples, p.backlog_cap
                )
        label = f"{base.label}, fresh stats"
        goal = case in ("a", "b")
        rows.append(_drain_row(case, f"{deep.label}, fresh stats", fresh1, fresh0, label, goal))
        rows.append(_drain_row(case, f"{deep.label}, stale stats", stale1, fresh0, label, goal))
        rows.append(_drain_row(case, f"{base.label}, stale stats", stale0, fresh0, label, False))
        limits = f"limits: tenant {TENANT_LIMIT:,}, conversation {CONVERSATION_LIMIT:,}"
        if d_fresh:
            rows += _d_rows(case, limits, d_fresh, "fresh", blocks)
        if d_stale:
            rows += _d_rows(case, limits, d_stale, "stale", blocks)
    return rows, meta


def _median(got: list[Drain]) -> Drain:
    """The window with the median rate, carrying every window's rate."""
    med = sorted(got, key=lambda d: d.rate)[len(got) // 2]
    med.reps = [d.rate for d in got]
    return med
