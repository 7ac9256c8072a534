"""peers: pgqueuer and procrastinate draining no-op jobs on the same server, in the same run.

Each peer gets its own database on the server (both install into ``public``), the jobs
are enqueued first (untimed, in bulk), and the clock runs from the first job's start to
the moment the peer's worker reports the queue drained, as for runrow.
"""

from __future__ import annotations

import functools
import logging
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import psycopg
from lib import Bench, Row, ratio, summary

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

log = logging.getLogger("bench.peers")


def _url(conninfo: str) -> str:
    d = psycopg.conninfo.conninfo_to_dict(conninfo)
    return f"postgresql://{d.get('user', 'postgres')}@{d.get('host', '127.0.0.1')}:{d.get('port', 5432)}/{d['dbname']}"


async def pgqueuer_drain(
    conninfo: str, n: int, concurrency: int, batch: int, max_tasks: int | None = None
) -> float:
    """``concurrency`` pgqueuer QueueManagers (workers), each on its own connection, each
    dequeuing ``batch`` jobs at a time (at most ``max_tasks`` picked at once per worker,
    pgqueuer's own cap, enforced in its dequeue query), on pgqueuer's asyncpg driver (its
    PsycopgDriver stalled here: see bench/README.md)."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conns = [await asyncpg.connect(_url(conninfo)) for _ in range(concurrency)]
    first: list[float] = []
    done = 0
    try:
        setup = Queries(AsyncpgDriver(conns[0]))
        if not await setup.schema_is_installed():
            await setup.install()
        await setup.clear_queue()
        await setup.clear_queue_log()
        for i in range(0, n, 1000):
            k = min(1000, n - i)
            await setup.enqueue(["noop"] * k, [None] * k, [0] * k)
        managers = []
        for conn in conns:
            qm = QueueManager(Queries(AsyncpgDriver(conn)))

            @qm.entrypoint("noop")
            async def noop(job: Any) -> None:
                nonlocal done
                if not first:
                    first.append(time.monotonic())
                done += 1

            managers.append(qm)
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for qm in managers:
                    tg.start_soon(
                        functools.partial(
                            qm.run,
                            mode=QueueExecutionMode.drain,
                            batch_size=batch,
                            max_concurrent_tasks=max_tasks,
                            dequeue_timeout=timedelta(seconds=1),
                            log_aggregation_interval=timedelta(0),
                        )
                    )
        end = time.monotonic()
    finally:
        for conn in conns:
            await conn.close()
    if done != n:
        raise RuntimeError(f"pgqueuer ran {done} of {n} jobs")
    return n / (end - first[0])


async def procrastinate_drain(conninfo: str, n: int, concurrency: int) -> float:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    first: list[float] = []
    done = 0

    @app.task(name="noop")
    async def noop() -> None:
        nonlocal done
        if not first:
            first.append(time.monotonic())
        done += 1

    async with app.open_async():
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            cur = await conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL")
            row = await cur.fetchone()
            installed = bool(row and row[0])
        if not installed:
            await app.schema_manager.apply_schema_async()
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            await conn.execute("TRUNCATE procrastinate_jobs CASCADE")
        for i in range(0, n, 500):
            await noop.batch_defer_async(*[{} for _ in range(min(500, n - i))])
        with anyio.fail_after(120):
            await app.run_worker_async(
                concurrency=concurrency,
                wait=False,
                install_signal_handlers=False,
                listen_notify=True,
                delete_jobs="never",
            )
        end = time.monotonic()
    if done != n:
        raise RuntimeError(f"procrastinate ran {done} of {n} jobs")
    return n / (end - first[0])


def _available(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


async def peers(b: Bench, earlier: list[Row]) -> tuple[list[Row], dict[str, Any]]:
    """Each peer's drain rate; ratio = runrow's rate at the same number of jobs in flight / the peer.

    "Concurrency c" means at most c jobs picked (claimed and executing) at once, for every
    system: runrow's ``Dispatcher(concurrency=c)`` claims only into free slots. The peer
    configurations with c in flight are the contest (``best peer c=4``). pgqueuer with
    c workers of batch 10 picks up to 10c jobs at once; it is reported beside runrow
    measured here at ``concurrency=10c``, not against runrow at c.

    runrow is drained here too, at every in-flight count a peer reaches, in the same
    loop as the peers (order alternating per repetition): on a machine whose speed drifts
    over minutes, a ratio against runrow's throughput_core figure from earlier in the run
    would compare different moments. That figure is the fallback if a drain here fails.
    """
    p = b.profile
    dsn: dict[str, str] = b.peer_conninfo  # type: ignore[attr-defined]
    core = {r.case: r.value for r in earlier if r.scenario == "throughput_core"}

    def jobs(in_flight: int) -> int:
        # Every system at one in-flight count drains the same number of jobs.
        return p.drain_size(p.peer_jobs, in_flight)

    # (name, case, in flight, drain)
    configs: list[tuple[str, str, int, Callable[[], Awaitable[float]]]] = []
    for c in p.peer_concurrencies:
        configs.append(
            ("pgqueuer b1", f"c={c}", c, lambda c=c: pgqueuer_drain(dsn["pgqueuer"], jobs(c), c, 1))
        )
        if c % 2 == 0:
            # One worker holding c jobs: pgqueuer requires max_concurrent_tasks >= 2 x batch.
            configs.append(
                (
                    f"pgqueuer b{c // 2} max{c}",
                    f"c={c}",
                    c,
                    lambda c=c: pgqueuer_drain(dsn["pgqueuer"], jobs(c), 1, c // 2, max_tasks=c),
                )
            )
        configs.append(
            (
                "procrastinate",
                f"c={c}",
                c,
                lambda c=c: procrastinate_drain(dsn["procrastinate"], jobs(c), c),
            )
        )
        configs.append(
            (
                "pgqueuer b10",
                f"c={c}",
                10 * c,
                lambda c=c: pgqueuer_drain(dsn["pgqueuer"], jobs(10 * c), c, 10),
            )
        )
    rows: list[Row] = []
    plot: dict[str, Any] = {}
    runnable: list[tuple[str, str, int, Callable[[], Awaitable[float]]]] = []
    for name, case, inflight, fn in configs:
        module = name.split()[0]
        if not _available(module) or (module == "pgqueuer" and not _available("asyncpg")):
            rows.append(
                Row(
                    "peers",
                    f"{name} {case}",
                    None,
                    "jobs/s",
                    note=f"{module} not installed: pip install -e '.[bench]'",
                )
            )
            continue
        runnable.append((name, case, inflight, fn))
    # runrow itself at every in-flight count a peer reaches, interleaved with the peers.
    own = sorted({f for _, _, f, _ in runnable})
    runrow_fns = {f: (lambda f=f: _runrow_drain(b, jobs(f), f)) for f in own}
    results: dict[tuple[str, str], list[float]] = {(n, c): [] for n, c, _, _ in runnable}
    own_results: dict[int, list[float]] = {f: [] for f in own}
    # Interleaved per in-flight count: each group is the peers at that count and runrow,
    # the group's order reversed every other repetition, and the server left to finish
    # its autovacuum work (untimed) before each drain.
    groups: dict[int, list[tuple[str, str, int, Callable[[], Awaitable[float]]]]] = {}
    for cfg in runnable:
        groups.setdefault(cfg[2], []).append(cfg)
    for f, fn in runrow_fns.items():
        groups.setdefault(f, []).append(("runrow", f"c={f}", f, fn))
    waited = 0.0
    for rep in range(p.peer_reps or p.reps):
        order: list[tuple[str, str, int, Callable[[], Awaitable[float]]]] = []
        for f in sorted(groups):
            order += reversed(groups[f]) if rep % 2 else groups[f]
        for name, case, inflight, fn in order:
            waited += await b.quiesce()
            try:
                value = await fn()
            except Exception as exc:
                log.exception("%s %s failed", name, case)
                value = float("nan")
                rows.append(
                    Row("peers", f"{name} {case} rep {rep}", None, "jobs/s", note=f"failed: {exc}"[:160])
                )
            if name == "runrow":
                own_results[inflight].append(value)
            else:
                results[(name, case)].append(value)
    rows.append(
        Row(
            "peers",
            "untimed waits for autovacuum between drains",
            waited,
            "s",
            note="in all, over every drain of this scenario",
        )
    )
    runrow_at = {int(k.split("=")[1]): v for k, v in core.items() if k.startswith("c=") and k[2:].isdigit()}
    for f, vals in own_results.items():
        vals = [v for v in vals if v == v]
        if vals:
            runrow_at[f] = summary(vals)[0]
            rows.append(
                Row(
                    "peers",
                    f"runrow c={f}",
                    runrow_at[f],
                    "runs/s",
                    *summary(vals)[1:],
                    note="runrow's Dispatcher at this concurrency, measured here with the peers",
                    samples=vals,
                )
            )
    best: dict[str, float] = {}
    for name, case, inflight, _ in runnable:
        vals = [v for v in results[(name, case)] if v == v]
        if not vals:
            continue
        med, lo, hi = summary(vals)
        runrow_rate = runrow_at.get(inflight)
        c = int(case.split("=")[1])
        same = inflight == c
        # (The one-worker pgqueuer configurations differ in name per c: one series.)
        series = "pgqueuer 1 worker" if " max" in name else name
        plot.setdefault(series, {})[inflight] = med
        if same:
            best[case] = max(best.get(case, 0.0), med)
        label = f"{name} {case}" if same else f"{name} {case} ({inflight} in flight)"
        r = ratio(runrow_rate, med)
        # (#24: at the in-flight counts only pgqueuer's batches of 10 reach, runrow at least level.)
        goal, met = ("", None) if same else (">= 1.0 x peer", None if r is None else r >= 1.0)
        rows.append(
            Row(
                "peers",
                label,
                med,
                "jobs/s",
                lo,
                hi,
                runrow_rate,
                f"runrow c={inflight}",
                r,
                goal,
                met,
                samples=vals,
            )
        )
    for case, peak in best.items():
        runrow_rate = runrow_at.get(int(case.split("=")[1]))
        r = ratio(runrow_rate, peak)
        rows.append(
            Row(
                "peers",
                f"best peer {case} (same jobs in flight)",
                peak,
                "jobs/s",
                None,
                None,
                runrow_rate,
                f"runrow {case}",
                r,
                ">= 1.5 x best peer",
                None if r is None else r >= 1.5,
            )
        )
    if own_results:
        plot["runrow_extra"] = {f: runrow_at[f] for f in own_results if f in runrow_at}
    return rows, {"peers": plot, **plot}


async def _runrow_drain(b: Bench, n: int, concurrency: int) -> float:
    from scenarios.throughput import drain_runrow

    async with b.schema("peer_rr") as s:
        return await drain_runrow(b, s, n, concurrency, "noop")
