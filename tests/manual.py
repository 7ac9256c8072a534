"""A hand-driven worker: the dispatcher's own gateway calls, one step at a time.

Tests use it to put runs into exact states (claimed, expired, half-streamed) and to
replay races deterministically, with an injectable clock where the SQL takes one.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import psycopg

from runrow._gateway import _exec, claims, endings, journal, reaper
from runrow._gateway import lease as _lease
from runrow._names import Channels


async def claim(
    conn: psycopg.AsyncConnection,
    schema: str,
    *,
    limit: int = 1,
    lease: float = 30.0,
    now: datetime | None = None,
    worker_id: str = "manual",
    retry_policy: str | None = None,
    version: str | None = None,
    agent_keys: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    rows = await claims.claim(
        conn,
        schema,
        order="fair",
        limit=limit,
        lease_seconds=lease,
        worker_id=worker_id,
        now=now,
        retry_policy=retry_policy,
        version=version,
        agent_keys=agent_keys,
    )
    return [r._asdict() for r in rows]


async def heartbeat(
    conn: psycopg.AsyncConnection,
    schema: str,
    runs: list[tuple[uuid.UUID, uuid.UUID]],
    *,
    lease: float = 30.0,
    now: datetime | None = None,
) -> dict[uuid.UUID, bool]:
    return await _exec.run(conn, _lease.heartbeat(schema, runs, lease_seconds=lease, now=now))


async def append(
    conn: psycopg.AsyncConnection,
    schema: str,
    run_id: uuid.UUID,
    token: uuid.UUID,
    events: list[tuple[int, str, dict[str, Any]]],
    *,
    notify: bool = True,
) -> bool:
    rows = [(seq, etype, json.dumps(payload)) for seq, etype, payload in events]
    landed = await _exec.run(
        conn,
        journal.append(
            schema,
            [journal.Appended(run_id, token, rows)],
            channels=Channels.for_schema(schema),
            notify=notify,
        ),
    )
    return run_id in landed


async def finalize(
    conn: psycopg.AsyncConnection,
    schema: str,
    run_id: uuid.UUID,
    token: uuid.UUID,
    status: str,
    seq: int,
    *,
    error: dict[str, Any] | None = None,
    partial: str | None = None,
    retry: bool = False,
) -> bool:
    ending = endings.Ending(
        run_id=run_id,
        claim_token=token,
        status=status,
        error=None if error is None else json.dumps(error),
        partial=partial,
        events=[(seq, "complete", json.dumps({"status": status}))],
        retry=retry,
    )
    return run_id in await endings.finalize(conn, schema, [ending], channels=Channels.for_schema(schema))


async def reap_candidates(
    conn: psycopg.AsyncConnection, schema: str, *, grace: float, now: datetime | None = None
) -> list[uuid.UUID]:
    return await _exec.run(conn, reaper.candidates(schema, grace_seconds=grace, limit=100, now=now))


async def reap(
    conn: psycopg.AsyncConnection,
    schema: str,
    ids: list[uuid.UUID],
    *,
    grace: float,
    now: datetime | None = None,
) -> list[uuid.UUID]:
    ended = await _exec.run(
        conn, reaper.reap(schema, ids, grace_seconds=grace, channels=Channels.for_schema(schema), now=now)
    )
    return [r.run_id for r in ended]


async def db_now(conn: psycopg.AsyncConnection) -> datetime:
    cur = await conn.execute("SELECT now()")
    row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


async def park(
    conn: psycopg.AsyncConnection,
    schema: str,
    run_id: uuid.UUID,
    token: uuid.UUID,
    seq: int,
    *,
    key: str,
    position: int = 0,
    timeout: float | None = None,
) -> bool:
    """What a worker does when its agent waits for input: marks the input step waiting,
    then parks the run (finalize with status waiting and an input_requested event)."""
    from runrow._gateway import steps

    if not await _exec.run(
        conn,
        steps.wait(
            schema, run_id=run_id, claim_token=token, key=key, occurrence=0, position=position, request="null"
        ),
    ):
        return False
    ending = endings.Ending(
        run_id=run_id,
        claim_token=token,
        status="waiting",
        error=None,
        partial=None,
        events=[(seq, "input_requested", json.dumps({"key": key, "request": None}))],
        input_timeout=timeout,
    )
    return run_id in await endings.finalize(conn, schema, [ending], channels=Channels.for_schema(schema))


async def steer(
    conn: psycopg.AsyncConnection,
    schema: str,
    run_id: uuid.UUID,
    token: uuid.UUID,
    *,
    occurrence: int,
    position: int,
    limit: int = 100,
) -> list[dict[str, Any]] | None:
    """One steering delivery by the claim holder (``RunContext.steering``'s statement):
    the messages delivered, or None if the fence matched nothing."""
    from runrow._engine.steering import STEERING
    from runrow._gateway import steering

    return await _exec.run(
        conn,
        steering.deliver(
            schema,
            run_id=run_id,
            claim_token=token,
            key=STEERING,
            occurrence=occurrence,
            position=position,
            limit=limit,
            channels=Channels.for_schema(schema),
        ),
    )
