"""Reads the API composes: a finished turn's tool calls and inputs, the wait estimate, and
the JSON shapes of runs and stops."""

from __future__ import annotations

import math
import statistics
import uuid
from collections.abc import AsyncGenerator
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse

import runrow

from .._status import COMPLETED

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from psycopg_pool import AsyncConnectionPool

__all__ = [
    "MIN_SAMPLES",
    "SAMPLES",
    "accepted",
    "close",
    "estimate_wait",
    "jsonable",
    "recent_durations",
    "run_json",
    "stop_json",
    "turn_journal",
]

SAMPLES = 20
MIN_SAMPLES = 3


def jsonable(value: Any) -> Any:
    """``value`` with ids and times as strings, ready for ``json.dumps``."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


_RUN_FIELDS = (
    *("id", "conversation_id", "status", "cancel_requested", "error", "retry_of", "user_message_id"),
    *("created_at", "started_at", "finished_at", "worker_id", "version", "absorbed_into"),
)


def run_json(info: runrow.RunInfo, base: str) -> dict[str, Any]:
    """A run as the API shows it (never its user, tenant or request)."""
    data = asdict(info)
    out = {k: jsonable(data[k]) for k in _RUN_FIELDS}
    out["events_url"] = f"{base}/v1/runs/{info.id}/events"
    return out


def accepted(run: runrow.Run, base: str) -> JSONResponse:
    """202 for a run a post or a retry queued (or found again: ``created`` is false)."""
    return JSONResponse(
        {
            "run_id": str(run.id),
            "status": run.status,
            "conversation_id": run.conversation_id,
            "created": run.created,
            "events_url": f"{base}/v1/runs/{run.id}/events",
        },
        status_code=202,
        headers={"Location": f"{base}/v1/runs/{run.id}"},
    )


def stop_json(result: runrow.StopResult) -> dict[str, Any]:
    """What a cancel or a stop did, with the drafts for the composer."""
    return {
        "noop": result.noop,
        "cancelled": [str(r) for r in result.cancelled],
        "cancel_requested": [str(r) for r in result.cancel_requested],
        "drafts": [
            {"run_id": str(d.run_id), "message_id": str(d.message_id), "content": d.content}
            for d in result.drafts
        ],
    }


def estimate_wait(durations: Sequence[float], position: int | None, slots: int) -> float | None:
    """Seconds until a queued run at ``position`` starts, or None when unknown.

    runrow's ``queue_position`` divides by the last five minutes' throughput, which is
    absurd when idle (three runs of 8 s in five minutes: 100 s a place). This takes the
    median duration of the last :data:`SAMPLES` completed runs (None with fewer than
    :data:`MIN_SAMPLES`) times the rounds of runs ahead: ``ceil(position / slots)``.
    """
    if position is None or len(durations) < MIN_SAMPLES:
        return None
    return statistics.median(durations) * math.ceil(position / max(slots, 1))


async def recent_durations(pool: AsyncConnectionPool[Any], *, schema: str) -> list[float]:
    """How long the last :data:`SAMPLES` completed runs took, in seconds."""
    runs = await runrow.list_runs(pool, status=COMPLETED, limit=SAMPLES, schema=schema)
    return [
        (r.finished_at - r.started_at).total_seconds()
        for r in runs
        if r.started_at is not None and r.finished_at is not None
    ]


async def close(events: AsyncIterator[Any]) -> None:
    """Closes a tail left before its end (its connection goes back to the pool now)."""
    if isinstance(events, AsyncGenerator):
        await events.aclose()


async def turn_journal(
    pool: AsyncConnectionPool[Any], run_id: uuid.UUID, *, schema: str
) -> dict[str, list[dict[str, Any]]]:
    """A finished run's tool calls and input requests, read from its journal.

    ``{"tool_calls": [...], "inputs": [...]}``; a call is ``{"tool_call_id", "name",
    "arguments", "result", "uncertain"}``, an input ``{"key", "request", "expires_at",
    "provided", "value"}``. Agents call tools and ask for input before they answer, so
    the read stops at the first text (or at the terminal event, which names the calls a
    lost worker left uncertain) and never reads the answer's deltas.
    """
    calls: dict[str, dict[str, Any]] = {}
    inputs: dict[str, dict[str, Any]] = {}
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
            elif ev.type == "input_requested":
                key = str(data.get("key"))
                inputs[key] = {
                    "key": key,
                    "request": data.get("request"),
                    "expires_at": data.get("expires_at"),
                    "provided": False,
                    "value": None,
                }
            elif ev.type == "input_provided" and (asked := inputs.get(str(data.get("key")))) is not None:
                asked["provided"] = True
                asked["value"] = data.get("value")
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
    return {"tool_calls": list(calls.values()), "inputs": list(inputs.values())}
