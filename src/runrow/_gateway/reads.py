"""Reads of runs and transcripts for the API (get_run, list_runs, queue_stats, transcript)
and the recent throughput that enqueue's retry-after hint and queue_position use."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from psycopg.rows import args_row, class_row

from .. import _sql
from .._models import Message, RunInfo
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

    from .._status import RunStatus


class StatusCount(NamedTuple):
    """Runs of one status (live, or finished in the last hour); the oldest queued one's age."""

    status: RunStatus
    runs: int
    oldest_queued_seconds: float | None


class Throughput(NamedTuple):
    """Runs finished in the window, those of one tenant, and their average duration."""

    finished: int
    tenant_finished: int
    avg_run_seconds: float | None


def get_run(schema: str, *, run_id: uuid.UUID) -> Plan[RunInfo | None]:
    """The run's row, or None if there is none (a plan, see :mod:`._exec`)."""
    rows = yield Query(_sql.statement("get_run", schema), {"run_id": run_id}, class_row(RunInfo))
    return rows[0] if rows else None


def conversation_owner(schema: str, *, conversation_id: str) -> Plan[str | None]:
    """The user of any run of the conversation, or None if it has none."""
    rows = yield Query(_sql.statement("conversation_owner", schema), {"conversation_id": conversation_id})
    return None if not rows else str(rows[0][0])


def list_runs(
    schema: str,
    *,
    conversation_id: str | None,
    status: str | None,
    limit: int,
    parent_run_id: uuid.UUID | None = None,
) -> Plan[list[RunInfo]]:
    """Runs, newest first, optionally of one conversation, one status and/or one parent.

    A parent's children have a statement of their own, so that its index is used (a
    parameter that may be NULL would hide it from a generic plan)."""
    params: dict[str, object] = {"conversation_id": conversation_id, "status": status, "limit": limit}
    statement = _sql.statement("list_runs", schema)
    if parent_run_id is not None:
        statement, params["parent_run_id"] = _sql.statement("list_children", schema), parent_run_id
    rows = yield Query(statement, params, class_row(RunInfo))
    return rows


def transcript(schema: str, *, conversation_id: str, run_id: uuid.UUID | None = None) -> Plan[list[Message]]:
    """The conversation's messages in turn order, drafts excluded (up to ``run_id``'s turn if given)."""
    rows = yield Query(
        _sql.statement("transcript", schema),
        {"conversation_id": conversation_id, "run_id": run_id},
        args_row(Message),
    )
    return rows


def stats(schema: str) -> Plan[list[StatusCount]]:
    """Run counts per status (live, or finished in the last hour) and the oldest queued age."""
    rows = yield Query(_sql.statement("stats", schema))
    return [
        StatusCount(status, int(runs), None if oldest is None else float(oldest))
        for status, runs, oldest in rows
    ]


def throughput(
    schema: str, *, tenant_id: str | None, window_seconds: float, now: datetime | None
) -> Plan[Throughput]:
    """Runs finished in the last ``window_seconds`` (before ``now``, default the database's);
    a plan (see :mod:`._exec`)."""
    (row,) = yield Query(  # an aggregate always yields one row
        _sql.statement("throughput", schema),
        {"tenant_id": tenant_id, "window_seconds": window_seconds, "now": now},
    )
    return Throughput(int(row[0]), int(row[1]), row[2])
