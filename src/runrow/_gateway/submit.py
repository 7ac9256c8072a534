"""Submitting turns: enqueue (its gate and admission lock), idempotent repeats, retries.

Every function here is a plan (see :mod:`._exec`), run on an async or a sync connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from .. import _sql
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

    from .._enqueue_options import EnqueueOptions
    from .._status import RunStatus


class RunRef(NamedTuple):
    """What an enqueue or a retry reports of its run."""

    id: uuid.UUID
    status: RunStatus
    conversation_id: str
    user_message_id: uuid.UUID
    created_at: datetime


class Admission(NamedTuple):
    """enqueue's answer: the new run (None when nothing was written) and what the gate saw."""

    run: RunRef | None
    admitted: bool
    busy: bool | None
    tenant_queued: int | None
    conversation_queued: int | None
    budget_spent_until: datetime | None = None
    budget_resets_in: float | None = None


class IdempotentRun(NamedTuple):
    """The run an idempotency key names, and which of the turn's inputs differ from a repeat's."""

    run: RunRef
    other_conversation: bool
    other_tenant: bool
    other_content: bool
    other_request: bool


class RetrySource(NamedTuple):
    """Why a run was not retried: its status, whether trim deleted its request, and its
    deadline and whether that has passed."""

    status: RunStatus
    trimmed: bool
    deadline_at: datetime | None
    deadline_passed: bool


def admission_lock(schema: str, *, tenant_lock: str | None, conversation_lock: str | None) -> Plan[None]:
    """Takes the gated enqueue's advisory locks (tenant, then conversation; None takes none)."""
    yield Query(
        _sql.statement("admission_lock", schema),
        {"tenant_lock": tenant_lock, "conversation_lock": conversation_lock},
    )


def enqueue(options: EnqueueOptions, *, wake_channel: str, conversation_lock: str) -> Plan[Admission]:
    """Writes the message, the run, journal events 1-2 and the wake in one statement, if admitted."""
    (row,) = yield Query(
        _sql.statement("enqueue", options.schema),
        enqueue_params(options, wake_channel=wake_channel, conversation_lock=conversation_lock),
    )
    # (the gate always yields one row)
    rid, status, conv, message_id, created_at, _woke, admitted, busy, tenant_queued, conv_queued = row[:10]
    run = None if rid is None else RunRef(rid, status, conv, message_id, created_at)
    return Admission(run, admitted, busy, tenant_queued, conv_queued, row[10], row[11])


def enqueue_params(options: EnqueueOptions, *, wake_channel: str, conversation_lock: str) -> dict[str, Any]:
    """The enqueue statement's parameters for ``options`` (the benchmarks send it bare too)."""
    return {
        "conversation_id": options.conversation_id,
        "user_id": options.user_id,
        "tenant_id": options.tenant_id,
        "idempotency_key": options.idempotency_key,
        "content": options.content,
        "request": options.request,
        "priority": options.priority,
        "not_before_at": options.not_before_at,
        "not_before_in": options.not_before_in,
        "deadline_at": options.deadline_at,
        "deadline_in": options.deadline_in,
        "agent_key": options.agent_key,
        "limit_key": options.limit_key,
        "parent_run_id": options.parent_run_id,
        "root_run_id": options.root_run_id,
        "max_queued_tenant": options.max_queued_tenant,
        "max_queued_conversation": options.max_queued_conversation,
        "reject_if_busy": options.on_busy == "reject",
        "steerable": options.on_busy == "steer",
        "wake_channel": wake_channel,
        "conversation_lock": conversation_lock,
    }


def find_idempotent(
    schema: str,
    *,
    user_id: str,
    idempotency_key: str | None,
    conversation_id: str,
    tenant_id: str | None,
    content: str,
    request: str | None,
) -> Plan[IdempotentRun | None]:
    """The run the user's key already names, compared with this turn; None if there is none."""
    rows = yield Query(
        _sql.statement("find_idempotent", schema),
        {
            "user_id": user_id,
            "idempotency_key": idempotency_key,
            "conversation_id": conversation_id,
            "tenant_id": tenant_id,
            "content": content,
            "request": request,
        },
    )
    if not rows:
        return None
    rid, status, conv, message_id, created_at, other_conv, other_tenant, other_content, other_request = rows[
        0
    ]
    return IdempotentRun(
        RunRef(rid, status, conv, message_id, created_at),
        other_conv,
        other_tenant,
        other_content,
        other_request,
    )


def retry(
    schema: str,
    *,
    run_id: uuid.UUID,
    wake_channel: str,
    conversation_lock_prefix: str,
    keep_deadline: bool,
    deadline_at: datetime | None,
    deadline_in: float | None,
) -> Plan[RunRef | None]:
    """Queues a retry of a failed, cancelled or expired run; None if it was not retried
    (now). It keeps the run's deadline (``keep_deadline``: not retried if that has passed,
    which ``retry_source`` then says) or takes ``deadline_at``, else ``deadline_in`` seconds
    from the database's clock, else none."""
    rows = yield Query(
        _sql.statement("retry", schema),
        {
            "run_id": run_id,
            "wake_channel": wake_channel,
            "conversation_lock_prefix": conversation_lock_prefix,
            "keep_deadline": keep_deadline,
            "deadline_at": deadline_at,
            "deadline_in": deadline_in,
        },
    )
    return RunRef(*rows[0][:5]) if rows else None


def find_retry(schema: str, *, run_id: uuid.UUID) -> Plan[RunRef | None]:
    """The retry of ``run_id``, if it has one."""
    rows = yield Query(_sql.statement("find_retry", schema), {"run_id": run_id})
    return RunRef(*rows[0]) if rows else None


def retry_source(schema: str, *, run_id: uuid.UUID) -> Plan[RetrySource | None]:
    """The run's status and whether it was trimmed; None if there is no such run."""
    rows = yield Query(_sql.statement("retry_source", schema), {"run_id": run_id})
    return RetrySource(*rows[0]) if rows else None
