"""Recording a turn: the user's message, its run, its first events and the wake, at once."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from . import _json
from ._db import Database, perform
from ._errors import (
    ConversationBusy,
    IdempotencyConflict,
    InvalidInput,
    Overloaded,
    RunrowError,
)
from ._gateway import reads, submit
from ._models import Run, StopResult
from ._names import DEFAULT_SCHEMA, Channels, check_schema
from ._ops import in_transaction, self_contained
from ._stop import stop_locked

if TYPE_CHECKING:
    from ._gateway._exec import Plan
    from ._ops import Operation

__all__ = ["DEFAULT_MAX_CONTENT_BYTES", "OnBusy", "enqueue", "enqueue_op"]

DEFAULT_MAX_CONTENT_BYTES = 256 * 1024
"""Default size limit of a message's content, as serialised JSON."""


OnBusy = Literal["enqueue", "reject", "interrupt"]
"""What :func:`enqueue` does when the conversation already has a queued or running turn."""

THROUGHPUT_WINDOW_SECONDS = 300.0
"""Recent throughput is measured over the last five minutes of finished runs."""


async def enqueue(
    db: Database,
    *,
    conversation_id: str,
    user_id: str,
    content: Any,
    tenant_id: str | None = None,
    idempotency_key: str | None = None,
    request: Any = None,
    priority: int = 0,
    not_before: datetime | timedelta | None = None,
    deadline: datetime | timedelta | None = None,
    on_busy: OnBusy = "enqueue",
    max_queued_per_tenant: int | None = None,
    max_queued_per_conversation: int | None = None,
    schema: str = DEFAULT_SCHEMA,
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
) -> Run:
    """Records a user's turn and returns its run (``queued``).

    The user message, the ``agent_run`` row, journal events 1 and 2 and the queue wake
    commit together or not at all. Given a connection that is inside a transaction,
    the enqueue joins it, so the host's own writes and the run commit or roll back as
    one. With ``idempotency_key``, a repeat by the same user returns the first run
    (``created=False``) and writes nothing, also under concurrent repeats. A repeat is
    the same turn when its ``conversation_id``, ``tenant_id``, ``content`` and
    ``request`` equal the first's (JSON by value); reusing the key for another turn
    raises :class:`IdempotencyConflict` and writes nothing.

    Scheduling: ``tenant_id`` is the fairness unit of the claim (None: the
    default tenant). ``priority`` orders runs within their tenant's fair share (higher
    first). ``not_before`` delays the run: a ``timedelta`` counts from the database's
    clock at enqueue, a ``datetime`` (timezone-aware) is absolute. ``deadline`` (same
    forms) is the time by which the run must have ended: one still running then is
    cancelled and ends ``failed`` with error type ``deadline_exceeded``; one claimed
    after it ends so without the agent being called.

    Double-texting: with an active (queued or running) turn in the conversation,
    ``on_busy="enqueue"`` (default) queues the new turn after it, ``"reject"`` raises
    :class:`ConversationBusy` and writes nothing, ``"interrupt"`` stops the conversation
    (queued turns cancelled, their messages handed back as drafts in
    ``Run.interrupted``, the running turn asked to stop) and queues the new turn, in
    one transaction; the new turn starts once the running one has ended.

    Turn order: a conversation's turns start in the order their enqueues
    committed, and the transcript follows that order (each turn's answers before the
    next turn's question). Every enqueue takes a transaction-scoped advisory lock on
    the conversation before its place in the queue is drawn, so an enqueue inside a
    caller's transaction delays the next enqueue of the same conversation (never
    another conversation's) until the caller commits or rolls back. A transaction that
    enqueues into several conversations can deadlock with one that does so in another
    order (PostgreSQL then aborts one of them); keep such transactions short and ordered.

    Load shedding: ``max_queued_per_tenant`` / ``max_queued_per_conversation`` refuse
    the enqueue with :class:`Overloaded` (nothing written, ``retry_after`` hint) when the
    tenant / conversation already has that many queued runs. A repeat of an accepted
    idempotency key returns its run instead. Gated enqueues (a limit, ``"reject"`` or
    ``"interrupt"``) take transaction-scoped advisory locks on the tenant (with a tenant
    limit) and on the conversation, in that order, before a statement that counts and
    inserts: among enqueues that pass the same limit, the limit holds exactly under READ
    COMMITTED, also when they race. Inside a caller's transaction the locks are held
    until it ends. An enqueue that passes no limit is not counted against one.

    Raises :class:`InvalidInput` (nothing written) for empty or non-text ids, content
    or request that is not JSON, contains NUL characters, or exceeds the size limit.
    """
    return await perform(
        db,
        schema,
        enqueue_op(
            conversation_id=conversation_id,
            user_id=user_id,
            content=content,
            tenant_id=tenant_id,
            idempotency_key=idempotency_key,
            request=request,
            priority=priority,
            not_before=not_before,
            deadline=deadline,
            on_busy=on_busy,
            max_queued_per_tenant=max_queued_per_tenant,
            max_queued_per_conversation=max_queued_per_conversation,
            schema=schema,
            max_content_bytes=max_content_bytes,
        ),
    )


def enqueue_op(
    *,
    conversation_id: str,
    user_id: str,
    content: Any,
    tenant_id: str | None,
    idempotency_key: str | None,
    request: Any,
    priority: int,
    not_before: datetime | timedelta | None,
    deadline: datetime | timedelta | None,
    on_busy: OnBusy,
    max_queued_per_tenant: int | None,
    max_queued_per_conversation: int | None,
    schema: str,
    max_content_bytes: int,
) -> Operation[Run]:
    """:func:`enqueue` as an operation (see ``_ops.py``), for the async and the sync API."""
    check_schema(schema)
    _json.check_id(conversation_id, "conversation_id")
    _json.check_id(user_id, "user_id")
    _json.check_id(tenant_id, "tenant_id", optional=True)
    _json.check_id(idempotency_key, "idempotency_key", optional=True)
    if isinstance(priority, bool) or not isinstance(priority, int) or not -(2**31) <= priority < 2**31:
        raise InvalidInput("priority", "must be an integer that fits in 32 bits")
    if on_busy not in ("enqueue", "reject", "interrupt"):
        raise InvalidInput("on_busy", "must be 'enqueue', 'reject' or 'interrupt'")
    for name, limit in (
        ("max_queued_per_tenant", max_queued_per_tenant),
        ("max_queued_per_conversation", max_queued_per_conversation),
    ):
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit < 2**31
        ):  # (the gate counts in a 32-bit integer)
            raise InvalidInput(name, "must be a non-negative integer below 2**31, or None")
    not_before_at, not_before_in = _when(not_before, "not_before")
    deadline_at, deadline_in = _when(deadline, "deadline")
    # The turn, as the refusal, the interrupt and the idempotent read-back need it.
    params: dict[str, Any] = {
        "conversation_id": conversation_id,
        "user_id": user_id,
        "tenant_id": tenant_id,
        "idempotency_key": idempotency_key,
        "content": _json.dumps(content, "content", max_content_bytes),
        "request": None if request is None else _json.dumps(request, "request", max_content_bytes),
        "max_queued_tenant": max_queued_per_tenant,
        "max_queued_conversation": max_queued_per_conversation,
    }
    gated = (
        on_busy != "enqueue" or max_queued_per_tenant is not None or max_queued_per_conversation is not None
    )
    submission = _submit(
        schema,
        params,
        on_busy=on_busy,
        gated=gated,
        priority=priority,
        not_before_at=not_before_at,
        not_before_in=not_before_in,
        deadline_at=deadline_at,
        deadline_in=deadline_in,
    )
    # Ungated, the enqueue is one self-contained statement: one round trip on an autocommit
    # connection, joined to the caller's transaction if there is one. Gated enqueues take
    # their admission lock first, in the same transaction as the statement.
    submitted: tuple[submit.Admission, StopResult | None]
    submitted = yield (in_transaction if gated else self_contained)(submission)
    gate, interrupted = submitted
    if gate.run is not None:
        return Run(*gate.run, created=True, interrupted=interrupted)
    # The key exists: the first run won (the INSERT waited for it to commit). Read it, in
    # a statement whose snapshot sees that commit, and compare it with this turn.
    found: submit.IdempotentRun | None = yield self_contained(_read_back(schema, gate, params))
    if found is None:  # pragma: no cover - the conflict guarantees a committed row
        raise RunrowError("idempotent enqueue conflicted but the first run is not visible")
    _same_turn(found, params)
    return Run(*found.run, created=False)


def _submit(
    schema: str, params: dict[str, Any], *, on_busy: OnBusy, gated: bool, **when: Any
) -> Plan[tuple[submit.Admission, StopResult | None]]:
    """The enqueue's first step: its locks, the interrupt, the statement, or the refusal."""
    # Taken by every enqueue of the conversation: its turns queue in commit order.
    conversation_lock = _conversation_lock(schema, params["conversation_id"])
    if gated:
        yield from submit.admission_lock(
            schema,
            tenant_lock=None
            if params["max_queued_tenant"] is None
            else f"runrow.enqueue:{schema}:tenant:{params['tenant_id'] or ''}",
            conversation_lock=conversation_lock,
        )
    interrupted = (yield from _interrupt(schema, params)) if on_busy == "interrupt" else None
    gate = yield from submit.enqueue(
        schema,
        conversation_id=params["conversation_id"],
        user_id=params["user_id"],
        tenant_id=params["tenant_id"],
        idempotency_key=params["idempotency_key"],
        content=params["content"],
        request=params["request"],
        max_queued_tenant=params["max_queued_tenant"],
        max_queued_conversation=params["max_queued_conversation"],
        reject_if_busy=on_busy == "reject",
        wake_channel=Channels.for_schema(schema).wake,
        conversation_lock=conversation_lock,
        **when,
    )
    if gate.run is None and not gate.admitted and params["idempotency_key"] is None:
        yield from _refuse(schema, gate, params)
    return gate, interrupted


def _read_back(
    schema: str, gate: submit.Admission, params: dict[str, Any]
) -> Plan[submit.IdempotentRun | None]:
    """The run this turn's key names; the refusal if it names none and the gate refused."""
    found = yield from _find_idempotent(schema, params)
    if found is None and not gate.admitted:
        yield from _refuse(schema, gate, params)
    return found


def _conversation_lock(schema: str, conversation_id: str) -> str:
    """The key of the conversation's advisory lock (enqueue, retry and admission_lock)."""
    return f"runrow.enqueue:{schema}:conversation:{conversation_id}"


def _find_idempotent(schema: str, params: dict[str, Any]) -> Plan[submit.IdempotentRun | None]:
    """The run this turn's idempotency key already names (see :func:`submit.find_idempotent`)."""
    keys = ("user_id", "idempotency_key", "conversation_id", "tenant_id", "content", "request")
    return submit.find_idempotent(schema, **{key: params[key] for key in keys})


def _same_turn(found: submit.IdempotentRun, params: dict[str, Any]) -> None:
    """Raises :class:`IdempotencyConflict` unless the key's run records this very turn.

    Scheduling options (priority, not_before, deadline, limits, on_busy) are not
    compared: they change when a turn runs, not what runs, and a relative time cannot
    match on a retry anyway.
    """
    # What makes a repeat the same turn: the inputs the agent gets.
    flags = (
        ("conversation_id", found.other_conversation),
        ("tenant_id", found.other_tenant),
        ("content", found.other_content),
        ("request", found.other_request),
    )
    differ = tuple(name for name, flag in flags if flag)
    if differ:
        raise IdempotencyConflict(params["idempotency_key"], found.run.id, differ)


_MAX_OFFSET_SECONDS = 1000 * 365 * 86400


def _when(value: datetime | timedelta | None, field: str) -> tuple[datetime | None, float | None]:
    """An absolute time, or seconds from the database's clock, as the SQL takes them."""
    if value is None:
        return None, None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        if abs(seconds) > _MAX_OFFSET_SECONDS:  # now() + it must stay a timestamp
            raise InvalidInput(field, "a timedelta must be within 1,000 years")
        return None, seconds
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidInput(field, "a datetime must be timezone-aware (or pass a timedelta)")
        return value, None
    raise InvalidInput(field, "must be a datetime, a timedelta or None")


def _interrupt(schema: str, params: dict[str, Any]) -> Plan[StopResult | None]:
    """Stops the conversation's active turns inside the enqueue's transaction."""
    if params["idempotency_key"] is not None:
        found = yield from _find_idempotent(schema, params)
        if found is not None:
            _same_turn(found, params)  # a reused key stops nothing
            return None  # a repeat of an accepted interrupt: it already stopped what it stopped
    return (yield from stop_locked(schema, params["conversation_id"]))


def _refuse(schema: str, gate: submit.Admission, params: dict[str, Any]) -> Plan[NoReturn]:
    """Raises the typed refusal for a gated enqueue that wrote nothing."""
    tenant_queued, conversation_queued = gate.tenant_queued, gate.conversation_queued
    if gate.busy:
        raise ConversationBusy(params["conversation_id"])
    finished, tenant_finished, avg_run = yield from reads.throughput(
        schema, tenant_id=params["tenant_id"], window_seconds=THROUGHPUT_WINDOW_SECONDS, now=None
    )
    tenant_limit, conversation_limit = params["max_queued_tenant"], params["max_queued_conversation"]
    if tenant_limit is not None and tenant_queued is not None and tenant_queued >= tenant_limit:
        # One of the tenant's runs must start: about one tenant completion interval.
        done = tenant_finished or finished
        hint = THROUGHPUT_WINDOW_SECONDS / done if done else avg_run
        raise Overloaded("tenant", params["tenant_id"], tenant_limit, _seconds(hint))
    assert conversation_limit is not None and conversation_queued is not None
    # The conversation's turns run one at a time: about one run's duration.
    raise Overloaded("conversation", params["conversation_id"], conversation_limit, _seconds(avg_run))


def _seconds(hint: float | None) -> int:
    """A retry-after hint in whole seconds, 1..3600; 30 when there is no recent history."""
    if hint is None:
        return 30
    return max(1, min(3600, math.ceil(hint)))
