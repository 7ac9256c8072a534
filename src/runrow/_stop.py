"""Stop means stop: a durable, cooperative request, and stopping a conversation is one transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _json, _sql
from ._db import Database, atomic, execute, schema_guard
from ._errors import RunNotFound
from ._json import parse_run_id
from ._models import Draft, StopResult
from ._names import DEFAULT_SCHEMA, Channels, check_schema

if TYPE_CHECKING:
    import uuid

__all__ = ["cancel_run", "stop_conversation"]


async def stop_conversation(
    db: Database, conversation_id: str, *, schema: str = DEFAULT_SCHEMA
) -> StopResult:
    """Stops every active turn of a conversation, in one transaction.

    All of the conversation's queued and running runs are locked together. Queued
    turns are cancelled at once (their user messages become drafts, returned for the
    composer, and each gets its terminal event); the running turn gets its durable
    ``cancel_requested`` flag and a NOTIFY on the cancel channel, and its worker ends
    it ``cancelled``. Because the sweep and the flag commit together, a turn that
    finishes meanwhile finds nothing left to start. Nothing active: ``noop`` is True.
    """
    check_schema(schema)
    _json.check_id(conversation_id, "conversation_id")
    async with schema_guard(db, schema), atomic(db) as conn:
        return await stop_locked(conn, schema, conversation_id)


async def stop_locked(conn: object, schema: str, conversation_id: str) -> StopResult:
    """The stop sweep on a connection already inside a transaction (stop, interrupt)."""
    from psycopg import AsyncConnection

    assert isinstance(conn, AsyncConnection)
    cur = await execute(
        conn, _sql.statement("lock_conversation_runs", schema), {"conversation_id": conversation_id}
    )
    runs = await cur.fetchall()
    return await _stop(conn, schema, [(r[0], r[1]) for r in runs])


async def cancel_run(db: Database, run_id: uuid.UUID | str, *, schema: str = DEFAULT_SCHEMA) -> StopResult:
    """Stops one run: a queued run is cancelled at once (its message returned as a draft),
    a running one is asked to stop (flag + NOTIFY). A finished run is left as it is
    (``noop`` is True). Raises :class:`RunNotFound` for an unknown id."""
    check_schema(schema)
    rid = parse_run_id(run_id)
    async with schema_guard(db, schema), atomic(db) as conn:
        cur = await execute(conn, _sql.statement("lock_run", schema), {"run_id": rid})
        row = await cur.fetchone()
        if row is None:
            raise RunNotFound(rid)
        return await _stop(conn, schema, [(row[0], row[1])])


async def _stop(conn: object, schema: str, runs: list[tuple[uuid.UUID, str]]) -> StopResult:
    from psycopg import AsyncConnection

    assert isinstance(conn, AsyncConnection)
    channels = Channels.for_schema(schema)
    queued = [rid for rid, status in runs if status == "queued"]
    running = [rid for rid, status in runs if status == "running"]
    drafts: list[Draft] = []
    flagged: list[uuid.UUID] = []
    if queued:
        cur = await execute(
            conn,
            _sql.statement("cancel_queued", schema),
            {"ids": queued, "events_prefix": channels.events_prefix},
        )
        drafts = [Draft(r[0], r[1], r[2]) for r in await cur.fetchall()]
    if running:
        cur = await execute(
            conn,
            _sql.statement("request_cancel", schema),
            {"ids": running, "cancel_channel": channels.cancel},
        )
        flagged = [r[0] for r in await cur.fetchall()]
    order = {rid: i for i, (rid, _) in enumerate(runs)}
    drafts.sort(key=lambda d: order[d.run_id])
    return StopResult(cancelled=[d.run_id for d in drafts], cancel_requested=flagged, drafts=drafts)
