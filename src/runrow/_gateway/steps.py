"""Durable steps' statements (``step_load``, ``step_start``, ``step_record``, ``step_wait``
in ``sql/steps.sql``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from psycopg.rows import class_row

from .. import _sql
from ._exec import execute

if TYPE_CHECKING:
    import uuid

    from psycopg import AsyncConnection

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


async def load(conn: AsyncConnection, schema: str, *, run_id: uuid.UUID) -> list[StepRecord]:
    """The steps of the run's lineage, in call order."""
    cur = conn.cursor(row_factory=class_row(StepRecord))
    await execute(conn, _sql.statement("step_load", schema), {"run_id": run_id}, cursor=cur)
    return await cur.fetchall()


async def start(
    conn: AsyncConnection,
    schema: str,
    *,
    run_id: uuid.UUID,
    claim_token: uuid.UUID,
    key: str,
    occurrence: int,
    position: int,
) -> bool:
    """Marks the step begun; False if the fence matched nothing (the claim is gone)."""
    cur = await execute(
        conn,
        _sql.statement("step_start", schema),
        {
            "run_id": run_id,
            "claim_token": claim_token,
            "key": key,
            "occurrence": occurrence,
            "position": position,
        },
    )
    return await cur.fetchone() is not None


async def record(
    conn: AsyncConnection,
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
) -> Recorded | None:
    """Records the step's outcome (``result`` or ``error``, JSON text); None if the
    fence matched nothing."""
    cur = await execute(
        conn,
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
        },
    )
    row = await cur.fetchone()
    return None if row is None else Recorded(row[0])


async def wait(
    conn: AsyncConnection,
    schema: str,
    *,
    run_id: uuid.UUID,
    claim_token: uuid.UUID,
    key: str,
    occurrence: int,
    position: int,
    request: str,
) -> bool:
    """Marks an input step ``waiting`` with its request (JSON text); False if the fence
    matched nothing."""
    cur = await execute(
        conn,
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
    return await cur.fetchone() is not None
