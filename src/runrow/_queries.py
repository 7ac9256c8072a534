"""Reading runs and transcripts (any process, no claim needed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import _json
from ._db import Database, perform, schema_guard, statement_conn
from ._errors import InvalidInput, RunNotFound
from ._gateway import reads
from ._gateway._exec import run
from ._json import parse_run_id
from ._names import DEFAULT_SCHEMA, check_schema
from ._ops import self_contained
from ._status import QUEUED, RUNNING, STATUSES

if TYPE_CHECKING:
    import uuid

    from ._models import Message, RunInfo
    from ._ops import Operation

__all__ = ["QueueStats", "get_run", "get_run_op", "list_runs", "queue_stats", "transcript"]


async def get_run(db: Database, run_id: uuid.UUID | str, *, schema: str = DEFAULT_SCHEMA) -> RunInfo:
    """The run's current row; :class:`RunNotFound` if there is none."""
    return await perform(db, schema, get_run_op(run_id, schema=schema))


def get_run_op(run_id: uuid.UUID | str, *, schema: str) -> Operation[RunInfo]:
    """:func:`get_run` as an operation (see ``_ops.py``)."""
    check_schema(schema)
    rid = parse_run_id(run_id)
    run: RunInfo | None = yield self_contained(reads.get_run(schema, run_id=rid))
    if run is None:
        raise RunNotFound(rid)
    return run


async def list_runs(
    db: Database,
    *,
    conversation_id: str | None = None,
    status: str | None = None,
    limit: int = 50,
    parent_run_id: uuid.UUID | str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[RunInfo]:
    """Runs, newest first, optionally of one conversation, one status and/or one parent.

    ``parent_run_id`` lists the child runs that run spawned (its sub-agents; their own
    children have them as parent in turn).
    """
    check_schema(schema)
    _json.check_id(conversation_id, "conversation_id", optional=True)
    parent = None
    if parent_run_id is not None:
        try:
            parent = parse_run_id(parent_run_id)
        except RunNotFound:
            raise InvalidInput("parent_run_id", "not a run id (a UUID)") from None
    if status is not None and status not in STATUSES:
        raise InvalidInput("status", f"unknown status {status!r}")
    if not 1 <= limit <= 10_000:
        raise InvalidInput("limit", "must be between 1 and 10000")
    async with schema_guard(db, schema), statement_conn(db) as conn:
        return await run(
            conn,
            reads.list_runs(
                schema, conversation_id=conversation_id, status=status, limit=limit, parent_run_id=parent
            ),
        )


async def transcript(db: Database, conversation_id: str, *, schema: str = DEFAULT_SCHEMA) -> list[Message]:
    """The conversation's durable transcript in turn order (drafts excluded).

    Each turn's user message comes first, then that turn's answers, whenever they were
    written; turns go in their queue order (for one conversation, the order their
    enqueues committed).
    """
    check_schema(schema)
    _json.check_id(conversation_id, "conversation_id")
    async with schema_guard(db, schema), statement_conn(db) as conn:
        return await run(conn, reads.transcript(schema, conversation_id=conversation_id))


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Queue depth and recent outcomes (finished runs: the last hour)."""

    by_status: dict[str, int]
    oldest_queued_seconds: float | None

    @property
    def queued(self) -> int:
        return self.by_status.get(QUEUED, 0)

    @property
    def running(self) -> int:
        return self.by_status.get(RUNNING, 0)


async def queue_stats(db: Database, *, schema: str = DEFAULT_SCHEMA) -> QueueStats:
    """Queued and running counts, the oldest queued run's age, last hour's outcomes."""
    check_schema(schema)
    async with schema_guard(db, schema), statement_conn(db) as conn:
        rows = await run(conn, reads.stats(schema))
    oldest = next(
        (r.oldest_queued_seconds for r in rows if r.status == QUEUED and r.oldest_queued_seconds is not None),
        None,
    )
    return QueueStats({r.status: r.runs for r in rows}, oldest)
