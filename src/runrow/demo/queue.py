"""The web process's share of the queue: a reaper, a wait estimate, a finished turn's tools.

**The reaper.** ``runrow demo`` runs its workers as separate processes, and each
dispatcher reaps, but a reaper that lives in a worker dies with it: with one worker,
nobody was left to end its runs. So the web process runs :func:`reap_periodically`, a
pass of runrow's one-pass reaper every few seconds. Not a Dispatcher with nothing to do:
that would open its own pool, claim, heartbeat and run an agent in the web process,
all to get a loop this small. The reaper is safe to run anywhere and any number of
times: each write re-checks the lease, so a live worker's heartbeat always wins.

**The wait estimate.** runrow's ``queue_position`` divides the position by the
throughput of the last five minutes, which is fine under load and absurd when idle
(three runs of 8 s in five minutes: 100 s a place). The demo instead takes the median
duration of the last :data:`SAMPLES` completed runs, and says nothing with fewer than
:data:`MIN_SAMPLES`: ``median x ceil(position / slots)``, the rounds of runs ahead.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import anyio
import psycopg

import runrow
from runrow._engine.reaper import reap_expired

if TYPE_CHECKING:
    import uuid
    from collections.abc import AsyncIterator, Sequence

    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

__all__ = [
    "MIN_SAMPLES",
    "SAMPLES",
    "close",
    "estimate_wait",
    "reap_periodically",
    "recent_durations",
    "tool_calls",
]

log = logging.getLogger("runrow.demo")

SAMPLES = 20
MIN_SAMPLES = 3


async def reap_periodically(
    pool: AsyncConnectionPool[AsyncConnection], *, schema: str, interval: float, grace: float
) -> None:
    """A reaper pass every ``interval`` seconds, until cancelled; a failed pass is logged."""
    while True:
        try:
            with anyio.fail_after(max(interval, 5.0)):
                await reap_expired(pool, schema=schema, grace=grace, reaper_id="runrow-demo-web")
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning("demo reaper pass failed: %s", exc)
        await anyio.sleep(interval)


def estimate_wait(durations: Sequence[float], position: int | None, slots: int) -> float | None:
    """Seconds until a queued run at ``position`` starts, or None when unknown (not
    queued, or fewer than :data:`MIN_SAMPLES` finished runs to go by)."""
    if position is None or len(durations) < MIN_SAMPLES:
        return None
    return statistics.median(durations) * math.ceil(position / max(slots, 1))


async def recent_durations(pool: AsyncConnectionPool[AsyncConnection], *, schema: str) -> list[float]:
    """How long the last :data:`SAMPLES` completed runs took, in seconds."""
    runs = await runrow.list_runs(pool, status="completed", limit=SAMPLES, schema=schema)
    return [
        (r.finished_at - r.started_at).total_seconds()
        for r in runs
        if r.started_at is not None and r.finished_at is not None
    ]


async def close(events: AsyncIterator[Any]) -> None:
    """Closes a tail left before its end (its connection goes back to the pool now)."""
    if isinstance(events, AsyncGenerator):
        await events.aclose()


async def tool_calls(
    pool: AsyncConnectionPool[AsyncConnection], run_id: uuid.UUID, *, schema: str
) -> list[dict[str, Any]]:
    """A finished run's tool calls, read from its journal.

    The demo's agent calls its tool before it answers, so the calls are among the
    first events: the read stops at the first text (or the terminal event, which
    names the calls a lost worker left uncertain) and never reads the answer's deltas.
    """
    calls: dict[str, dict[str, Any]] = {}
    events = runrow.tail(pool, run_id, schema=schema, batch=8)
    try:
        async for ev in events:
            data = ev.payload
            call_id = str(data.get("tool_call_id", ""))
            if ev.type == "tool_call_started":
                calls[call_id] = {
                    "tool_call_id": call_id,
                    "name": data.get("name"),
                    "arguments": data.get("arguments"),
                    "result": None,
                    "uncertain": False,
                }
            elif ev.type == "tool_call_finished" and call_id in calls:
                calls[call_id]["result"] = data.get("result")
            elif ev.terminal:
                for u in data.get("uncertain_tool_calls") or []:
                    if (c := calls.get(str(u.get("tool_call_id")))) is not None:
                        c["uncertain"] = True
                break
            elif ev.type == "content_delta":
                break
    except runrow.RunNotFound:  # trimmed or deleted meanwhile
        pass
    finally:
        await close(events)
    return list(calls.values())
