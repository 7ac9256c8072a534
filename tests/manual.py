"""A hand-driven worker: the same SQL statements the dispatcher uses, one step at a time.

Tests use it to put runs into exact states (claimed, expired, half-streamed) and to
replay races deterministically, with an injectable clock where the SQL takes one.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import psycopg

from runrow import _sql
from runrow._names import Channels


async def claim(
    conn: psycopg.AsyncConnection,
    schema: str,
    *,
    limit: int = 1,
    lease: float = 30.0,
    now: datetime | None = None,
    worker_id: str = "manual",
) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    await cur.execute(
        _sql.statement("claim", schema),
        {"limit": limit, "lease_seconds": lease, "worker_id": worker_id, "now": now},
    )
    return await cur.fetchall()


async def heartbeat(
    conn: psycopg.AsyncConnection,
    schema: str,
    runs: list[tuple[uuid.UUID, uuid.UUID]],
    *,
    lease: float = 30.0,
    now: datetime | None = None,
) -> dict[uuid.UUID, bool]:
    cur = await conn.execute(
        _sql.statement("heartbeat", schema),
        {"ids": [r for r, _ in runs], "tokens": [t for _, t in runs], "lease_seconds": lease, "now": now},
    )
    return {r[0]: r[1] for r in await cur.fetchall()}


async def append(
    conn: psycopg.AsyncConnection,
    schema: str,
    run_id: uuid.UUID,
    token: uuid.UUID,
    events: list[tuple[int, str, dict[str, Any]]],
    *,
    notify: bool = True,
) -> bool:
    cur = await conn.execute(
        _sql.statement("append_events", schema),
        {
            "events": json.dumps(
                [
                    {
                        "run_id": str(run_id),
                        "token": str(token),
                        "seq": e[0],
                        "type": e[1],
                        "payload": json.dumps(e[2]),
                    }
                    for e in events
                ]
            ),
            "events_prefix": Channels.for_schema(schema).events_prefix,
            "notify": notify,
        },
    )
    return bool(await cur.fetchall())


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
) -> bool:
    ch = Channels.for_schema(schema)
    cur = await conn.execute(
        _sql.statement("finalize", schema),
        {
            "runs": json.dumps(
                [
                    {
                        "id": str(run_id),
                        "token": str(token),
                        "status": status,
                        "error": None if error is None else json.dumps(error),
                        "partial": partial,
                    }
                ]
            ),
            "events": json.dumps(
                [
                    {
                        "run_id": str(run_id),
                        "seq": seq,
                        "type": "complete",
                        "payload": json.dumps({"status": status}),
                    }
                ]
            ),
            "events_prefix": ch.events_prefix,
            "wake_channel": ch.wake,
        },
    )
    return bool(await cur.fetchall())


async def reap_candidates(
    conn: psycopg.AsyncConnection, schema: str, *, grace: float, now: datetime | None = None
) -> list[uuid.UUID]:
    cur = await conn.execute(
        _sql.statement("reap_candidates", schema), {"now": now, "grace_seconds": grace, "limit": 100}
    )
    return [r[0] for r in await cur.fetchall()]


async def reap(
    conn: psycopg.AsyncConnection,
    schema: str,
    ids: list[uuid.UUID],
    *,
    grace: float,
    now: datetime | None = None,
) -> list[uuid.UUID]:
    ch = Channels.for_schema(schema)
    cur = await conn.execute(
        _sql.statement("reap", schema),
        {
            "ids": ids,
            "now": now,
            "grace_seconds": grace,
            "events_prefix": ch.events_prefix,
            "wake_channel": ch.wake,
        },
    )
    return [r[0] for r in await cur.fetchall()]


async def db_now(conn: psycopg.AsyncConnection) -> datetime:
    cur = await conn.execute("SELECT now()")
    row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]
