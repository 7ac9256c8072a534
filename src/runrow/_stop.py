"""Stop means stop: a durable, cooperative request, and stopping a conversation is one transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _json
from ._db import Database, atomic, schema_guard
from ._errors import RunNotFound
from ._gateway import stop as _gw
from ._json import parse_run_id
from ._models import StopResult
from ._names import DEFAULT_SCHEMA, Channels, check_schema

if TYPE_CHECKING:
    import uuid

    from psycopg import AsyncConnection

    from ._gateway.stop import LockedRun
    from ._models import Draft

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


async def stop_locked(conn: AsyncConnection, schema: str, conversation_id: str) -> StopResult:
    """The stop sweep on a connection already inside a transaction (stop, interrupt)."""
    runs = await _gw.lock_conversation_runs(conn, schema, conversation_id=conversation_id)
    return await _stop(conn, schema, runs)


async def cancel_run(db: Database, run_id: uuid.UUID | str, *, schema: str = DEFAULT_SCHEMA) -> StopResult:
    """Stops one run: a queued run is cancelled at once (its message returned as a draft),
    a running one is asked to stop (flag + NOTIFY). A finished run is left as it is
    (``noop`` is True). Raises :class:`RunNotFound` for an unknown id."""
    check_schema(schema)
    rid = parse_run_id(run_id)
    async with schema_guard(db, schema), atomic(db) as conn:
        run = await _gw.lock_run(conn, schema, run_id=rid)
        if run is None:
            raise RunNotFound(rid)
        return await _stop(conn, schema, [run])


async def _stop(conn: AsyncConnection, schema: str, runs: list[LockedRun]) -> StopResult:
    """Cancels the queued runs among ``runs`` and flags the running ones (all locked)."""
    channels = Channels.for_schema(schema)
    queued = [rid for rid, status in runs if status == "queued"]
    running = [rid for rid, status in runs if status == "running"]
    drafts: list[Draft] = []
    flagged: list[uuid.UUID] = []
    if queued:
        drafts = await _gw.cancel_queued(conn, schema, ids=queued, events_prefix=channels.events_prefix)
    if running:
        flagged = await _gw.request_cancel(conn, schema, ids=running, cancel_channel=channels.cancel)
    order = {rid: i for i, (rid, _) in enumerate(runs)}
    drafts.sort(key=lambda d: order[d.run_id])
    return StopResult(cancelled=[d.run_id for d in drafts], cancel_requested=flagged, drafts=drafts)
