"""enqueue, throughput_core and throughput_full: runrow against bare psycopg loops of the same SQL."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

import anyio
import psycopg
from lib import (
    Bench,
    Row,
    append_params,
    channels,
    child,
    finalize_params,
    poll_until,
    positional,
    ratio,
    statement,
    summary,
)

import runrow
from runrow._gateway.claims import ClaimedRun

LAST_SEQ = ClaimedRun._fields.index("last_seq")  # the claim's RETURNING column (it grew past it)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

# -- enqueue ----------------------------------------------------------------------------


async def _connections(conninfo: str, n: int) -> list[psycopg.AsyncConnection]:
    return [await psycopg.AsyncConnection.connect(conninfo, autocommit=True) for _ in range(n)]


async def enqueue_runrow(b: Bench, schema: str, n: int, conns: int) -> float:
    cs = await _connections(b.conninfo, conns)
    try:

        async def worker(k: int) -> None:
            for i in range(k, n, conns):
                await runrow.enqueue(cs[k], conversation_id=f"e{i}", user_id="u", content="hi", schema=schema)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for k in range(conns):
                tg.start_soon(worker, k)
        return n / (time.perf_counter() - t0)
    finally:
        for c in cs:
            await c.close()


def _enqueue_defaults() -> dict[str, Any]:
    """The enqueue statement's parameters for a plain turn (no priority, delay, deadline or
    admission limits), as the gateway builds them for runrow.enqueue's defaults, less the
    turn's own fields: a new option of the statement reaches the bench without an edit."""
    from runrow._enqueue_options import EnqueueOptions
    from runrow._gateway.submit import enqueue_params

    plain = EnqueueOptions.checked(
        conversation_id="c", user_id="u", content="hi", tenant_id=None, idempotency_key=None,
        request=None, priority=0, not_before=None, deadline=None, on_busy="enqueue",
        max_queued_per_tenant=None, max_queued_per_conversation=None, schema="runrow",
        max_content_bytes=1 << 20,
    )  # fmt: skip
    params = enqueue_params(plain, wake_channel="", conversation_lock="")
    own = ("conversation_id", "user_id", "tenant_id", "idempotency_key", "content", "request")
    return {k: v for k, v in params.items() if k not in (*own, "wake_channel", "conversation_lock")}


ENQUEUE_DEFAULTS = _enqueue_defaults()


async def enqueue_bare(b: Bench, schema: str, n: int, conns: int) -> float:
    """The same enqueue statement (message + run + seq 1-2 + pg_notify), one autocommit round trip."""
    q = statement("enqueue", schema)
    wake = channels(schema).wake
    cs = await _connections(b.conninfo, conns)
    try:

        async def worker(k: int) -> None:
            for i in range(k, n, conns):
                await cs[k].execute(
                    q,
                    {
                        "conversation_id": f"e{i}",
                        "user_id": "u",
                        "tenant_id": None,
                        "idempotency_key": None,
                        "content": '"hi"',
                        "request": None,
                        "wake_channel": wake,
                        # the conversation's advisory lock key, as runrow.enqueue makes it
                        "conversation_lock": f"runrow.enqueue:{schema}:conversation:e{i}",
                        **ENQUEUE_DEFAULTS,
                    },
                )

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for k in range(conns):
                tg.start_soon(worker, k)
        return n / (time.perf_counter() - t0)
    finally:
        for c in cs:
            await c.close()


async def enqueue(b: Bench) -> list[Row]:
    p = b.profile
    rows = []
    for conns in (1, 8):
        rr: list[float] = []
        bare: list[float] = []
        for rep in range(p.reps + 1):
            order: list[tuple[list[float], Any]] = [(rr, enqueue_runrow), (bare, enqueue_bare)]
            if rep % 2:
                order.reverse()
            for sink, fn in order:
                async with b.schema("enq") as s:
                    sink.append(await fn(b, s, p.enqueue_runs, conns))
        rr, bare = rr[1:], bare[1:]  # the first round warms the server up
        med, lo, hi = summary(rr)
        base = summary(bare)[0]
        rows.append(
            Row(
                "enqueue",
                f"{conns} conn",
                med,
                "runs/s",
                lo,
                hi,
                base,
                "bare INSERT+pg_notify",
                ratio(med, base),
                samples=rr,
            )
        )
    return rows


# -- draining: runrow ---------------------------------------------------------------------


async def drain_runrow(
    b: Bench, schema: str, n: int, concurrency: int, op: str, profiler: Any = None
) -> float:
    """Enqueues ``n`` runs, then times one Dispatcher draining them (first start -> last ending)."""
    await _enqueue_ops(b, schema, n, op)
    if profiler is not None:
        profiler.start()
    t_first: list[float] = []

    async def agent(run: runrow.RunContext) -> None:
        if not t_first:
            t_first.append(time.monotonic())
        if op == "full":
            await run.text("x")
            await run.emit({"type": "tool_call", "name": "noop"})

    async with runrow.Dispatcher(b.conninfo, agent, schema=schema, concurrency=concurrency, poll=1.0) as d:
        await poll_until(lambda: d.get_stats()["completed"] + d.get_stats()["failed"] >= n, timeout=300)
        t_end = time.monotonic()
        if profiler is not None:
            profiler.stop()
        if d.get_stats()["failed"]:
            raise RuntimeError(f"{d.get_stats()['failed']} runs failed in the throughput benchmark")
    return n / (t_end - t_first[0])


async def drain_runrow_procs(b: Bench, schema: str, n: int, concurrency: int, procs: int, op: str) -> float:
    await _enqueue_ops(b, schema, n, op)
    per = concurrency // procs
    async with contextlib.AsyncExitStack() as stack:
        kids = [
            await stack.enter_async_context(
                child("worker", conninfo=b.conninfo, schema=schema, concurrency=per, poll=1.0, wait_go=True)
            )
            for _ in range(procs)
        ]
        for k in kids:
            await k.expect("READY")
        for k in kids:
            await k.send("go")
        # The clock is the children's (first start, last ending): this poll only notices
        # the end, so it polls seldom (each poll counts the live runs on the server the
        # children share; the single-process drain has no such poll).
        await b.wait_drained(schema, timeout=300, step=0.2)
        results = []
        for k in kids:
            await k.send("stop")
            results.append(await k.result())
    first = min(r["t_first"] for r in results if r["t_first"])
    last = max(r["t_last"] for r in results if r["t_last"])
    return n / (last - first)


async def _enqueue_ops(b: Bench, schema: str, n: int, op: str) -> None:
    conns = await _connections(b.conninfo, 8)
    try:

        async def worker(k: int) -> None:
            for i in range(k, n, 8):
                await runrow.enqueue(
                    conns[k], conversation_id=f"t{i}", user_id="u", content={"op": op}, schema=schema
                )

        async with anyio.create_task_group() as tg:
            for k in range(8):
                tg.start_soon(worker, k)
    finally:
        for c in conns:
            await c.close()


# -- draining: the bare-SQL loops ---------------------------------------------------------


def bare_claim_params(claim: Any, limit: int) -> tuple[Any, ...]:
    """The positional claim's parameters as the bare loops send them (no retry policy)."""
    return claim.bind(
        {
            "limit": limit,
            "lease_seconds": 30.0,
            "worker_id": "bare",
            "now": None,
            "retry_policy": None,
            "version": None,
            "same_version": False,
            "agent_keys": [],
            "serves_default": True,
            "tree_cap": None,
        }
    )


async def timed_lanes(
    conns: list[psycopg.AsyncConnection], lane: Callable[[psycopg.AsyncConnection], Awaitable[None]]
) -> float:
    """Runs ``lane(conn)`` on every connection at once; closes them; returns the seconds taken."""
    try:
        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            for c in conns:
                tg.start_soon(lane, c)
        return time.monotonic() - t0
    finally:
        for c in conns:
            await c.close()


async def drain_bare(b: Bench, schema: str, n: int, workers: int, batch: int, op: str) -> float:
    """``workers`` connections, each: claim up to ``batch``, (append 2 events each,) finalize them.

    The statements are runrow's own (sql/claims.sql claim, sql/endings.sql finalize, sql/journal.sql
    append_events), sent with plain psycopg on autocommit connections: one round trip each.
    """
    await _enqueue_ops(b, schema, n, op)
    claim = positional("claim", schema)
    finalize = positional("finalize", schema)
    append = statement("append_events", schema)
    ch = channels(schema)
    conns = await _connections(b.conninfo, workers)
    done = 0

    async def worker(conn: psycopg.AsyncConnection) -> None:
        nonlocal done
        while True:
            cur = psycopg.AsyncRawCursor(conn)
            await cur.execute(claim.query, bare_claim_params(claim, batch))
            got = await cur.fetchall()
            if not got:
                return
            ids = [r[0] for r in got]
            tokens = [r[1] for r in got]
            seq = [int(r[LAST_SEQ]) + 1 for r in got]
            if op == "full":
                await conn.execute(
                    append,
                    append_params(
                        ch,
                        [
                            (i, t, s + k, etype, payload)
                            for i, t, s in zip(ids, tokens, seq, strict=True)
                            for k, (etype, payload) in enumerate(
                                (("content_delta", '{"delta": "x"}'), ("tool_call", '{"name": "noop"}'))
                            )
                        ],
                    ),
                )
                seq = [s + 2 for s in seq]
            cur = psycopg.AsyncRawCursor(conn)
            await cur.execute(
                finalize.query,
                finalize.bind(
                    finalize_params(
                        ch, list(zip(ids, tokens, seq, strict=True)), partial="x" if op == "full" else None
                    )
                ),
            )
            done += len(await cur.fetchall())

    elapsed = await timed_lanes(conns, worker)
    if done != n:
        raise RuntimeError(f"bare loop finished {done} of {n} runs")
    return n / elapsed


async def drain_bare_pipelined(
    b: Bench,
    schema: str,
    n: int,
    concurrency: int,
    *,
    durable_endings: bool = True,
    claim_seconds: list[float] | None = None,
) -> float:
    """runrow's own loop with nothing of runrow's Python: one connection claims up to
    ``concurrency`` runs while a second writes the previous batch's endings, so a claim
    and an ending are in flight together, as in the Dispatcher with no-op agents.
    The ceiling for the Dispatcher's design at this concurrency, on this server.

    ``durable_endings=False`` commits the endings asynchronously (a diagnostic for
    bench/commit_cost.py, never what runrow does); ``claim_seconds`` collects each
    claim's latency."""
    await _enqueue_ops(b, schema, n, "noop")
    claim = positional("claim", schema)
    finalize = positional("finalize", schema)
    ch = channels(schema)
    claimer, writer = await _connections(b.conninfo, 2)
    if not durable_endings:
        await writer.execute("SET synchronous_commit = off")
    done = 0

    async def end(batch: list[Any]) -> None:
        nonlocal done
        cur = psycopg.AsyncRawCursor(writer)
        await cur.execute(
            finalize.query,
            finalize.bind(finalize_params(ch, [(r[0], r[1], int(r[LAST_SEQ]) + 1) for r in batch])),
        )
        done += len(await cur.fetchall())

    try:
        t0 = time.monotonic()
        previous: list[Any] = []
        while True:
            async with anyio.create_task_group() as tg:
                if previous:
                    tg.start_soon(end, previous)
                t1 = time.perf_counter()
                cur = psycopg.AsyncRawCursor(claimer)
                await cur.execute(claim.query, bare_claim_params(claim, concurrency))
                previous = await cur.fetchall()
                if claim_seconds is not None:
                    claim_seconds.append(time.perf_counter() - t1)
            if not previous:
                break
        elapsed = time.monotonic() - t0
    finally:
        await claimer.close()
        await writer.close()
    if done != n:
        raise RuntimeError(f"pipelined bare loop finished {done} of {n} runs")
    return n / elapsed


async def drain_bare_folded(b: Bench, schema: str, n: int, concurrency: int, lanes: int = 1) -> float:
    """runrow's loop since #24 with nothing of runrow's Python: one connection sends the
    previous batch's endings and the claim for the slots they free, pipelined, in one
    implicit transaction (one round trip, one commit), as the Dispatcher's ending writer
    does with no-op agents. The ceiling of the Dispatcher's design at this concurrency.
    ``lanes`` > 1 splits the ``concurrency`` runs in flight over that many connections
    whose folds overlap (``bench/fold_lanes.py``)."""
    await _enqueue_ops(b, schema, n, "noop")
    claim = positional("claim", schema)
    finalize = positional("finalize", schema)
    ch = channels(schema)
    conns = await _connections(b.conninfo, lanes)
    limit = concurrency // lanes
    done = 0

    async def lane(conn: psycopg.AsyncConnection) -> None:
        nonlocal done
        previous: list[Any] = []
        while True:
            ended = psycopg.AsyncRawCursor(conn)
            claimed = psycopg.AsyncRawCursor(conn)
            async with conn.pipeline():
                if previous:
                    ends = [(r[0], r[1], int(r[LAST_SEQ]) + 1) for r in previous]
                    await ended.execute(finalize.query, finalize.bind(finalize_params(ch, ends)))
                await claimed.execute(claim.query, bare_claim_params(claim, limit))
            if previous:
                done += len(await ended.fetchall())
            previous = await claimed.fetchall()
            if not previous:
                return

    elapsed = await timed_lanes(conns, lane)
    if done != n:
        raise RuntimeError(f"folded bare loop finished {done} of {n} runs")
    return n / elapsed


# -- the scenarios ------------------------------------------------------------------------


def _cases(concurrencies: tuple[int, ...]) -> list[tuple[str, int, int]]:
    """(label, concurrency, processes)."""
    return [(f"c={c}", c, 1) for c in concurrencies] + [("c=16 (2 procs x 8)", 16, 2)]


async def _interleaved(b: Bench, tag: str, fns: list[Callable[[str], Awaitable[float]]]) -> list[list[float]]:
    """Runs each measurement ``reps`` times, alternating their order, each on a fresh schema."""
    out: list[list[float]] = [[] for _ in fns]
    for rep in range(b.profile.reps):
        order = list(range(len(fns)))
        if rep % 2:
            order.reverse()
        for i in order:
            async with b.schema(tag) as s:
                # Untimed: the previous drain's clean-up (autovacuum) must not be billed here.
                await b.quiesce()
                out[i].append(await fns[i](s))
    return out


async def throughput(b: Bench, op: str, concurrencies: tuple[int, ...]) -> tuple[list[Row], dict[str, Any]]:
    """Rows for throughput_core (op 'noop') or throughput_full (op 'full'), and the plot's data."""
    p = b.profile
    scenario = "throughput_core" if op == "noop" else "throughput_full"
    rows: list[Row] = []
    plot: dict[str, Any] = {"runrow": {}, "bare": {}, "bare_batched": {}, "bare_folded": {}}
    quiesced = b.quiesced
    # A short warm-up so the first measured case does not pay for cold caches.
    async with b.schema("warm") as s:
        await drain_runrow(b, s, min(200, p.runs), 4, op)
    for label, c, procs in _cases(concurrencies):
        batched_wanted = op == "noop" and procs == 1
        # Every measurement of one case drains the same n, sized for its most in flight.
        n = p.drain_size(p.runs, 10 * c if batched_wanted else c)

        def rr(s: str, c: int = c, procs: int = procs, n: int = n) -> Awaitable[float]:
            if procs == 1:
                return drain_runrow(b, s, n, c, op)
            return drain_runrow_procs(b, s, n, c, procs, op)

        def bare(s: str, c: int = c, n: int = n) -> Awaitable[float]:
            return drain_bare(b, s, n, c, 1, op)

        fns: list[Callable[[str], Awaitable[float]]] = [rr, bare]
        if batched_wanted:

            def batched(s: str, c: int = c, n: int = n) -> Awaitable[float]:
                return drain_bare(b, s, n, c, 10, op)

            def folded(s: str, c: int = c, n: int = n) -> Awaitable[float]:
                return drain_bare_folded(b, s, n, c)

            fns += [batched, folded]
        res = await _interleaved(b, "tp", fns)
        med, lo, hi = summary(res[0])
        base = summary(res[1])[0]
        goal, met = "", None
        if op == "full" and c == 4 and procs == 1:
            goal, met = ">= 0.6 x bare", (med / base) >= 0.6
        elif op == "full" and c == 1:
            goal, met = ">= 1.0 x bare (#24)", (med / base) >= 1.0
        rows.append(
            Row(
                scenario,
                label,
                med,
                "runs/s",
                lo,
                hi,
                base,
                "bare claim-1 + finalize loop",
                ratio(med, base),
                goal,
                met,
                samples=res[0],
            )
        )
        if procs == 1:
            plot["runrow"][c] = med
            plot["bare"][c] = base
        if batched_wanted:
            bmed, blo, bhi = summary(res[2])
            plot["bare_batched"][c] = bmed
            goal, met = "", None
            if c == 4:
                goal, met = ">= 0.5 x batched ceiling", (med / bmed) >= 0.5
            rows.append(
                Row(
                    scenario,
                    f"{label} vs bare batched",
                    med,
                    "runs/s",
                    lo,
                    hi,
                    bmed,
                    f"bare claim-10 + finalize-10 ({blo:.0f}-{bhi:.0f})",
                    ratio(med, bmed),
                    goal,
                    met,
                    samples=res[0],
                )
            )
            pmed, plo, phi = summary(res[3])
            plot["bare_folded"][c] = pmed
            rows.append(
                Row(
                    scenario,
                    f"{label} vs bare folded",
                    med,
                    "runs/s",
                    lo,
                    hi,
                    pmed,
                    f"bare finalize + claim-{c}, one transaction ({plo:.0f}-{phi:.0f})",
                    ratio(med, pmed),
                    samples=res[0],
                )
            )
    one = next((r for r in rows if r.case == "c=16"), None)
    two = next((r for r in rows if r.case == "c=16 (2 procs x 8)"), None)
    if one is not None and two is not None and one.value and two.value:
        r = ratio(two.value, one.value)
        rows.append(
            Row(
                scenario,
                "c=16: 2 procs x 8 vs 1 proc x 16",
                two.value,
                "runs/s",
                two.min,
                two.max,
                one.value,
                "runrow c=16 in one process",
                r,
                ">= 0.9 (#24)",
                None if r is None else r >= 0.9,
            )
        )
    rows.append(
        Row(
            scenario,
            "untimed waits for autovacuum before drains",
            b.quiesced - quiesced,
            "s",
            note="in all, over every drain of this scenario",
        )
    )
    return rows, plot
