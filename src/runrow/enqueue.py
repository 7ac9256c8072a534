"""Recording a turn: the user's message, its run, its first events and the wake, at once."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from . import _json, _sql
from ._db import MISSING_SCHEMA, Database, atomic, require_schema, statement_conn
from ._models import Run
from ._names import DEFAULT_SCHEMA, Channels, check_schema
from .errors import InvalidInput, RunNotFound, RunrowError

__all__ = ["DEFAULT_MAX_CONTENT_BYTES", "enqueue", "retry_run"]

DEFAULT_MAX_CONTENT_BYTES = 256 * 1024
"""Default size limit of a message's content, as serialised JSON."""


async def enqueue(
    db: Database,
    *,
    conversation_id: str,
    user_id: str,
    content: Any,
    tenant_id: str | None = None,
    idempotency_key: str | None = None,
    request: Any = None,
    schema: str = DEFAULT_SCHEMA,
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
) -> Run:
    """Records a user's turn and returns its run (``queued``).

    The user message, the ``agent_run`` row, journal events 1 and 2 and the queue wake
    commit together or not at all. Given a connection that is inside a transaction,
    the enqueue joins it, so the host's own writes and the run commit or roll back as
    one. With ``idempotency_key``, a repeat by the same user returns the first run
    (``created=False``) and writes nothing, also under concurrent repeats.

    Raises :class:`InvalidInput` (nothing written) for empty or non-text ids, content
    or request that is not JSON, contains NUL characters, or exceeds the size limit.
    """
    check_schema(schema)
    _json.check_id(conversation_id, "conversation_id")
    _json.check_id(user_id, "user_id")
    _json.check_id(tenant_id, "tenant_id", optional=True)
    _json.check_id(idempotency_key, "idempotency_key", optional=True)
    params = {
        "conversation_id": conversation_id,
        "user_id": user_id,
        "tenant_id": tenant_id,
        "idempotency_key": idempotency_key,
        "content": _json.dumps(content, "content", max_content_bytes),
        "request": None if request is None else _json.dumps(request, "request", max_content_bytes),
        "wake_channel": Channels.for_schema(schema).wake,
    }
    query = _sql.statement("enqueue", schema)
    try:
        # One self-contained statement: on an autocommit connection it is one round
        # trip; inside the caller's transaction it joins it; otherwise it gets its own.
        async with statement_conn(db) as conn:
            cur = await conn.execute(query, params)
            row = await cur.fetchone()
    except MISSING_SCHEMA:
        await _explain_missing_schema(db, schema)
        raise
    if row is not None:
        return Run(row[0], row[1], row[2], row[3], row[4], created=True)
    # The key exists: the first run won. Read it (this statement sees its commit).
    async with statement_conn(db) as conn:
        cur = await conn.execute(
            _sql.statement("find_idempotent", schema),
            {"user_id": user_id, "idempotency_key": idempotency_key},
        )
        found = await cur.fetchone()
    if found is None:  # pragma: no cover - the conflict guarantees a committed row
        raise RunrowError("idempotent enqueue conflicted but the first run is not visible")
    return Run(found[0], found[1], found[2], found[3], found[4], created=False)


async def retry_run(db: Database, run_id: uuid.UUID | str, *, schema: str = DEFAULT_SCHEMA) -> Run:
    """Creates a new run for the same user message as a failed or cancelled run.

    runrow never re-runs anything by itself (at-most-once); this is the button a person
    presses. A run is retried at most once: repeating the call returns the same retry
    (``created=False``). Raises :class:`RunNotFound`, or :class:`InvalidInput` when the
    run is not failed or cancelled.
    """
    check_schema(schema)
    rid = parse_run_id(run_id)
    params = {"run_id": rid, "wake_channel": Channels.for_schema(schema).wake}
    async with atomic(db) as conn:
        cur = await conn.execute(_sql.statement("retry", schema), params)
        row = await cur.fetchone()
        if row is not None:
            return Run(row[0], row[1], row[2], row[3], row[4], created=True)
        cur = await conn.execute(_sql.statement("find_retry", schema), {"run_id": rid})
        found = await cur.fetchone()
        if found is not None:
            return Run(found[0], found[1], found[2], found[3], found[4], created=False)
        cur = await conn.execute(_sql.statement("get_run", schema), {"run_id": rid})
        original = await cur.fetchone()
    if original is None:
        raise RunNotFound(rid)
    raise InvalidInput("run_id", f"run {rid} is {original[4]}; only failed or cancelled runs retry")


def parse_run_id(run_id: uuid.UUID | str) -> uuid.UUID:
    """A run id as a UUID, or :class:`RunNotFound` (a malformed id names no run)."""
    if isinstance(run_id, uuid.UUID):
        return run_id
    try:
        return uuid.UUID(str(run_id))
    except ValueError:
        raise RunNotFound(run_id) from None


async def _explain_missing_schema(db: Database, schema: str) -> None:
    """Turns "relation does not exist" into an error that names the fix, if that is the cause."""
    try:
        async with statement_conn(db) as conn:
            await require_schema(conn, schema)
    except psycopg.Error:
        return
