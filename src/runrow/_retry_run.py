"""A person's retry of a run (:func:`retry_run`): a new attempt of the same turn, with
the turn's deadline unless told otherwise."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

import psycopg

from . import _json
from ._db import Database, perform
from ._enqueue import _conversation_lock
from ._enqueue_options import when
from ._errors import DeadlinePassed, InvalidInput, RunNotFound, RunrowError, RunTrimmed
from ._gateway import submit
from ._models import Run
from ._names import DEFAULT_SCHEMA, Channels, check_schema
from ._ops import in_transaction
from ._status import RETRYABLE

if TYPE_CHECKING:
    import uuid

    from ._gateway._exec import Plan
    from ._ops import Operation

__all__ = ["KEEP", "RetryDeadline", "retry_run", "retry_run_op"]

KEEP: Literal["keep"] = "keep"
"""``retry_run(deadline=KEEP)``, the default: the retry keeps the turn's deadline."""

RetryDeadline = datetime | timedelta | Literal["keep"] | None
"""A retry's deadline: ``"keep"`` the turn's, a new one (a ``timedelta`` from the
database's clock, or a timezone-aware ``datetime``), or ``None`` for none."""


async def retry_run(
    db: Database,
    run_id: uuid.UUID | str,
    *,
    deadline: RetryDeadline = KEEP,
    schema: str = DEFAULT_SCHEMA,
) -> Run:
    """Creates a new run for the same user message as a failed, cancelled or expired run.

    runrow never re-runs anything by itself (at-most-once); this is the button a person
    presses. A run is retried at most once: repeating the call returns the same retry
    (``created=False``, whatever ``deadline`` says). The retry queues behind the
    conversation's queued turns (like an enqueue, in commit order), but its answer joins
    the turn it retries in the transcript, and its agent reads the conversation up to
    that turn.

    The retry is the same turn, so by default (``deadline="keep"``) it keeps the turn's
    deadline, as automatic retries do. ``deadline=`` a ``timedelta`` (from the
    database's clock) or a timezone-aware ``datetime`` sets a new one; ``deadline=None``
    clears it. A kept deadline that has already passed is refused with
    :class:`DeadlinePassed`: such a retry would end at once without calling its agent.

    Raises :class:`RunNotFound`, :class:`InvalidInput` when the run is not failed,
    cancelled or expired or ``deadline`` is not one of the above, :class:`RunTrimmed`
    (an ``InvalidInput``) when :func:`~runrow.trim` has trimmed it (a retry never
    runs without its step records), or :class:`DeadlinePassed` (an ``InvalidInput``).
    Nothing is written when it raises.
    """
    try:
        return await perform(db, schema, retry_run_op(run_id, deadline=deadline, schema=schema))
    except psycopg.errors.CheckViolation as e:
        raise retired_refusal(e, run_id) from e


def retired_refusal(error: psycopg.errors.CheckViolation, run_id: uuid.UUID | str) -> Exception:
    """What a retry refused by the schema raises: :class:`RunTrimmed` if trim retired its
    lineage while the retry was being written (migration 28's trigger), else the error."""
    if error.diag.constraint_name == "agent_run_retry_unretired":
        return RunTrimmed(_json.parse_run_id(run_id))
    return error


def retry_run_op(run_id: uuid.UUID | str, *, deadline: RetryDeadline = KEEP, schema: str) -> Operation[Run]:
    """:func:`retry_run` as an operation (see ``_ops.py``)."""
    check_schema(schema)
    rid = _json.parse_run_id(run_id)
    if isinstance(deadline, str):
        if deadline != KEEP:
            raise InvalidInput("deadline", 'must be "keep", a datetime, a timedelta or None')
        keep, deadline_at, deadline_in = True, None, None
    else:
        keep = False
        deadline_at, deadline_in = when(deadline, "deadline")
    retried: tuple[submit.RunRef | None, submit.RunRef | None, submit.RetrySource | None]
    retried = yield in_transaction(_retry(schema, rid, keep, deadline_at, deadline_in))
    new, found, original = retried
    if new is not None:
        return Run(*new, created=True)
    if found is not None:
        return Run(*found, created=False)
    if original is None:
        raise RunNotFound(rid)
    if original.status not in RETRYABLE:
        raise InvalidInput(
            "run_id", f"{rid} is {original.status}; only failed, cancelled or expired runs can be retried"
        )
    if original.trimmed:
        raise RunTrimmed(rid)
    if keep and original.deadline_passed:
        raise DeadlinePassed(rid, original.deadline_at)
    raise RunrowError(f"run {rid} was not retried")  # pragma: no cover - retry matched it


def _retry(
    schema: str, rid: uuid.UUID, keep: bool, deadline_at: datetime | None, deadline_in: float | None
) -> Plan[tuple[submit.RunRef | None, submit.RunRef | None, submit.RetrySource | None]]:
    """The retry, else the run's earlier retry, else why it was not retried."""
    new = yield from submit.retry(
        schema,
        run_id=rid,
        wake_channel=Channels.for_schema(schema).wake,
        conversation_lock_prefix=_conversation_lock(schema, ""),
        keep_deadline=keep,
        deadline_at=deadline_at,
        deadline_in=deadline_in,
    )
    if new is not None:
        return new, None, None
    found = yield from submit.find_retry(schema, run_id=rid)
    if found is not None:
        return None, found, None
    return None, None, (yield from submit.retry_source(schema, run_id=rid))
