"""Tails on a hot standby (issue #44 point 3): the primary's CPU for N streaming tails read
on the primary against the same tails read on a standby.

Not a test (pytest does not collect it). Run from the checkout:

    python bench/replica_tails.py [--tails 1000] [--rounds 20] [--interval 0.2]

One primary and one streaming standby (started here, as the tests do: tests/replica.py).
N runs are claimed; one process holds N tails (one per run, all on one pool of the primary,
one hub), and a writer appends one event to every run per round (one statement, notifying
each run), ``--rounds`` rounds ``--interval`` apart, then ends them. Twice, interleaved:
``primary`` (the tails read the primary) and ``replica`` (``read_from=`` a pool on the
standby). The figure is the CPU time (utime + stime from /proc) the primary's processes
spent during the streaming, less the writer's own backend (the same work in both); the
ratio replica/primary is what moving the tails saves (the goal: <= 0.2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg_pool import AsyncConnectionPool
from tests import manual
from tests.replica import primary_and_standby, replayed

import runrow
from runrow import _replica
from runrow._gateway import journal
from runrow._gateway._exec import run
from runrow._names import Channels

TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pids: set[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def per_pid(pids: set[int]) -> dict[int, float]:
    return {pid: cpu_of({pid}) for pid in pids}


def kinds(w_rows: list[tuple[int, str, str]], writer: int) -> dict[int, str]:
    """What each server process is: the writer, the hub (its backend LISTENs), the
    walsender, the other client backends (the tails' pool), or a background process."""
    out = {}
    for pid, btype, query in w_rows:
        if pid == writer:
            out[pid] = "writer"
        elif btype == "walsender":
            out[pid] = "walsender"
        elif btype == "client backend":
            out[pid] = "hub" if query.upper().startswith(("LISTEN", "UNLISTEN")) else "tails' pool"
        else:
            out[pid] = "background"
    return out


def server_pids(postmaster: int) -> set[int]:
    pids = {postmaster}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    pids.add(int(d.name))
            except OSError:
                pass
    return pids


async def measure(
    p: str, s: str, postmaster: int, n: int, rounds: int, interval: float, on_replica: bool
) -> dict[str, Any]:
    schema = f"b_{uuid.uuid4().hex[:8]}"
    await runrow.migrate(p, schema=schema)
    while not replayed(s, p):
        await asyncio.sleep(0.05)
    async with await psycopg.AsyncConnection.connect(p, autocommit=True) as w:
        tokens = {}
        for _ in range(n):
            r = await runrow.enqueue(
                w, schema=schema, conversation_id=uuid.uuid4().hex, user_id="u", content="x"
            )
            tokens[r.id] = r.id
        claimed = await manual.claim(w, schema, limit=n)
        tokens = {c["id"]: c["claim_token"] for c in claimed}
        writer_pid = (await (await w.execute("SELECT pg_backend_pid()")).fetchone())[0]
        ch = Channels.for_schema(schema)
        pool = AsyncConnectionPool(p, min_size=4, max_size=4, open=False, kwargs={"autocommit": True})
        rpool = AsyncConnectionPool(
            s, min_size=4, max_size=4, open=False, kwargs={"autocommit": True}, timeout=5
        )
        got = {rid: 0 for rid in tokens}
        async with pool, rpool, runrow.NotifyHub(p) as hub:

            async def tail(rid: uuid.UUID) -> None:
                async for e in runrow.tail(
                    pool, rid, schema=schema, hub=hub, keepalive=30, read_from=rpool if on_replica else None
                ):
                    if not e.keepalive:
                        got[rid] += 1

            tasks = [asyncio.create_task(tail(rid)) for rid in tokens]
            while sum(got.values()) < 2 * n:  # each run's two submission events
                await asyncio.sleep(0.05)
            pids = server_pids(postmaster)
            start = per_pid(pids)
            before, wbefore, t0 = cpu_of(pids - {writer_pid}), cpu_of({writer_pid}), time.monotonic()
            for i in range(rounds):
                batch = [
                    journal.Appended(rid, tok, [(3 + i, "content_delta", json.dumps({"d": i}))])
                    for rid, tok in tokens.items()
                ]
                await run(w, journal.append(schema, batch, channels=ch))
                await asyncio.sleep(interval)
            for rid, tok in tokens.items():
                await manual.finalize(w, schema, rid, tok, "completed", 3 + rounds)
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
            elapsed = time.monotonic() - t0
            pids |= server_pids(postmaster)
            cpu, wcpu = cpu_of(pids - {writer_pid}) - before, cpu_of({writer_pid}) - wbefore
            rows = await (
                await w.execute("SELECT pid, backend_type, coalesce(query, '') FROM pg_stat_activity")
            ).fetchall()
            kind = kinds(rows, writer_pid)
            split: dict[str, float] = {}
            for pid, c in per_pid(pids).items():
                k = kind.get(pid, "postmaster/gone")
                split[k] = split.get(k, 0.0) + c - start.get(pid, 0.0)
        assert all(v == 2 + rounds + 1 for v in got.values()), "a tail missed or repeated events"
        await w.execute(f"DROP SCHEMA {schema} CASCADE")
    return {"cpu": cpu, "writer_cpu": wcpu, "elapsed": elapsed, "split": split}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tails", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    gen = primary_and_standby()
    primary, standby = next(gen)
    try:
        assert primary.proc is not None
        res: dict[str, list[float]] = {"primary": [], "replica": []}
        for _ in range(a.reps):
            for where in ("primary", "replica"):
                r = await measure(
                    primary.conninfo(),
                    standby.conninfo(),
                    primary.proc.pid,
                    a.tails,
                    a.rounds,
                    a.interval,
                    where == "replica",
                )
                res[where].append(r["cpu"])
                print(
                    f"{where:8} tails={a.tails} primary CPU {r['cpu']:.2f} s (writer {r['writer_cpu']:.2f} s) in {r['elapsed']:.1f} s; by process: "
                    + ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["split"].items())),
                    flush=True,
                )
        mp, mr = min(res["primary"]), min(res["replica"])
        print(
            f"primary CPU, best of {a.reps}: tails on the primary {mp:.2f} s, on the replica {mr:.2f} s: ratio {mr / max(mp, 1e-9):.3f}"
        )
        print(f"replica stats: {_replica.STATS}")
    finally:
        gen.close()


if __name__ == "__main__":
    asyncio.run(main())
