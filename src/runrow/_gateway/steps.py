"""Durable steps' statements (``step_load``, ``step_start``, ``step_record``, ``step_wait``
in ``sql/steps.sql``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from psycopg.rows import class_row

from .. import _sql
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

StepStatus = Literal["started", "recorded", "failed", "waiting"]


class StepRecord(NamedTuple):
    """One step of a lineage as an earlier attempt left it."""

    key: str
    occurrence: int
    position: int
    status: StepStatus
    idempotent: bool
    result: Any
    error: dict[str, Any] | None
    run_id: uuid.UUID
    """The attempt that last started or recorded it (an input: the run that waited)."""
    input: bool
    """An input a person records (``wait_for_input``), not a call the agent made."""


class Recorded(NamedTuple):
    """A recorded step: its result as the database keeps it (None for an error)."""

    result: Any


def load(schema: str, *, run_id: uuid.UUID) -> Plan[list[StepRecord]]:
    """The steps of the run's lineage, in call order."""
    rows = yield Query(_sql.statement("step_load", schema), {"run_id": run_id}, class_row(StepRecord))
    return rows


def start(
    schema: str,
    *,
    run_id: uuid.UUID,
    claim_token: uuid.UUID,
    key: str,
    occurrence: int,
    position: int,
) -> Plan[bool]:
    """Marks the step begun; False if the fence matched nothing (the claim is gone)."""
    rows = yield Query(
        _sql.statement("step_start", schema),
        {
            "run_id": run_id,
            "claim_token": claim_token,
            "key": key,
            "occurrence": occurrence,
            "position": position,
        },
    )
    return bool(rows)


def record(
    schema: str,
    *,
    run_id: uuid.UUID,
    claim_token: uuid.UUID,
    key: str,
    occurrence: int,
    position: int,
    idempotent: bool,
    result: str | None,
    error: str | None,
    request: str | None = None,
) -> Plan[Recorded | None]:
    """Records the step's outcome (``result`` or ``error``, JSON text); None if the
    fence matched nothing. ``request`` (JSON text) marks a row it inserts an input: a
    wait for children answered before it parked."""
    rows = yield Query(
        _sql.statement("step_record", schema),
        {
            "run_id": run_id,
            "claim_token": claim_token,
            "key": key,
            "occurrence": occurrence,
            "position": position,
            "status": "recorded" if error is None else "failed",
            "idempotent": idempotent,
            "result": result,
            "error": error,
            "request": request,
        },
    )
    return Recorded(rows[0][0]) if rows else None


def wait(
    schema: str,
    *,
    run_id: uuid.UUID,
    claim_token: uuid.UUID,
    key: str,
    occurrence: int,
    position: int,
    request: str,
) -> Plan[bool]:
    """Marks an input step ``waiting`` with its request (JSON text); False if the fence
    matched nothing."""
    rows = yield Query(
        _sql.statement("step_wait", schema),
        {
            "run_id": run_id,
            "claim_token": claim_token,
            "key": key,
            "occurrence": occurrence,
            "position": position,
            "request": request,
        },
    )
    return bool(rows)


class CheckRun(NamedTuple):
    """A run ``runrow check`` replays: what its agent's context shows."""

    id: uuid.UUID
    conversation_id: str
    user_id: str
    tenant_id: str | None
    status: str
    request: Any
    content: Any
    user_message_id: uuid.UUID
    created_at: datetime
    started_at: datetime | None
    attempt: int
    lineage_id: uuid.UUID | None
    resumes: int
    version: str | None


def check_runs(schema: str, *, failed_since: float | None) -> Plan[list[CheckRun]]:
    """The runs ``runrow check`` replays: waiting ones, and those failed in the last
    ``failed_since`` seconds (None: none), oldest first."""
    rows = yield Query(
        _sql.statement("check_runs", schema), {"failed_since": failed_since}, class_row(CheckRun)
    )
    return rows
