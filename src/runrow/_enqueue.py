"""Recording a turn: the user's message, its run, its first events and the wake, at once."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NoReturn

from ._db import Database, perform
from ._enqueue_options import DEFAULT_MAX_CONTENT_BYTES, EnqueueOptions, OnBusy
from ._errors import (
    ConversationBusy,
    IdempotencyConflict,
    Overloaded,
    RunrowError,
)
from ._gateway import reads, submit
from ._models import Run, StopResult
from ._names import DEFAULT_SCHEMA, Channels
from ._ops import in_transaction, self_contained
from ._stop import stop_locked

if TYPE_CHECKING:
    from datetime import datetime, timedelta

    from ._gateway._exec import Plan
    from ._ops import Operation

__all__ = ["DEFAULT_MAX_CONTENT_BYTES", "OnBusy", "enqueue", "enqueue_in", "enqueue_op"]

# (DEFAULT_MAX_CONTENT_BYTES and OnBusy are defined with the options, in _enqueue_options.py.)

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
    agent_key: str | None = None,
    limit_key: str | None = None,
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

    ``agent_key`` names the agent that runs the turn: only a Dispatcher serving that key
    (``Dispatcher(agents={key: ...})``) claims it; None (default) is the default agent
    (``Dispatcher(agent)``). A queued run that no live worker serves waits, and is listed
    by ``runrow workers``.

    ``limit_key`` is a host-given key the run is rate-limited under besides its tenant's
    and agent's (e.g. the model provider it calls): see :func:`runrow.set_rate_limit`.

    Double-texting: with an active (queued or running) turn in the conversation,
    ``on_busy="enqueue"`` (default) queues the new turn after it, ``"reject"`` raises
    :class:`ConversationBusy` and writes nothing, ``"interrupt"`` stops the conversation
    (queued turns cancelled, their messages handed back as drafts in
    ``Run.interrupted``, the running turn asked to stop) and queues the new turn, in
    one transaction; the new turn starts once the running one has ended. ``"steer"``
    queues the new turn marked steerable: the conversation's running turn (or the
    queued turn before it, once it runs) may read its message with
    :meth:`RunContext.steering`, which ends it ``absorbed`` into that run; a steerable
    turn no earlier turn read runs as a turn of its own, in its place
    (docs/howto/steering.md). Without an active turn it is an ordinary turn.

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
    options = EnqueueOptions.checked(
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
        agent_key=agent_key,
        limit_key=limit_key,
    )
    return await perform(db, schema, enqueue_op(options))


def enqueue_op(options: EnqueueOptions) -> Operation[Run]:
    """:func:`enqueue` as an operation (see ``_ops.py``), for the async and the sync API,
    on options checked where the API took them (:meth:`EnqueueOptions.checked`)."""
    # Ungated, the enqueue is one self-contained statement: one round trip on an autocommit
    # connection, joined to the caller's transaction if there is one. Gated enqueues take
    # their admission lock first, in the same transaction as the statement.
    submitted: tuple[submit.Admission, StopResult | None]
    submitted = yield (in_transaction if options.gated else self_contained)(_submit(options))
    gate, interrupted = submitted
    if gate.run is not None:
        return Run(*gate.run, created=True, interrupted=interrupted)
    # The key exists: the first run won (the INSERT waited for it to commit). Read it, in
    # a statement whose snapshot sees that commit, and compare it with this turn.
    found: submit.IdempotentRun | None = yield self_contained(_read_back(gate, options))
    if found is None:  # pragma: no cover - the conflict guarantees a committed row
        raise RunrowError("idempotent enqueue conflicted but the first run is not visible")
    _same_turn(found, options)
    return Run(*found.run, created=False)


def enqueue_in(options: EnqueueOptions) -> Plan[Run]:
    """An ungated enqueue as a plan, for a caller that runs it inside its own transaction
    with writes of its own (a schedule's fire): the new run, or the run its idempotency
    key already names (``created=False``; :class:`IdempotencyConflict` if another turn)."""
    if options.gated:
        raise RunrowError("enqueue_in takes ungated options only")  # pragma: no cover
    gate, _ = yield from _submit(options)
    if gate.run is not None:
        return Run(*gate.run, created=True)
    found = yield from _read_back(gate, options)  # (refused by a spent usage budget: Overloaded)
    if found is None:  # pragma: no cover - the conflict guarantees a committed row
        raise RunrowError("idempotent enqueue conflicted but the first run is not visible")
    _same_turn(found, options)
    return Run(*found.run, created=False)


def _submit(options: EnqueueOptions) -> Plan[tuple[submit.Admission, StopResult | None]]:
    """The enqueue's first step: its locks, the interrupt, the statement, or the refusal."""
    schema = options.schema
    # Taken by every enqueue of the conversation: its turns queue in commit order.
    conversation_lock = _conversation_lock(schema, options.conversation_id)
    if options.gated:
        yield from submit.admission_lock(
            schema,
            tenant_lock=None
            if options.max_queued_tenant is None
            else f"runrow.enqueue:{schema}:tenant:{options.tenant_id or ''}",
            conversation_lock=conversation_lock,
        )
    interrupted = (yield from _interrupt(options)) if options.on_busy == "interrupt" else None
    gate = yield from submit.enqueue(
        options, wake_channel=Channels.for_schema(schema).wake, conversation_lock=conversation_lock
    )
    if gate.run is None and not gate.admitted and options.idempotency_key is None:
        yield from _refuse(gate, options)
    return gate, interrupted


def _read_back(gate: submit.Admission, options: EnqueueOptions) -> Plan[submit.IdempotentRun | None]:
    """The run this turn's key names; the refusal if it names none and the gate refused."""
    found = yield from _find_idempotent(options)
    if found is None and not gate.admitted:
        yield from _refuse(gate, options)
    return found


def _conversation_lock(schema: str, conversation_id: str) -> str:
    """The key of the conversation's advisory lock (enqueue, retry and admission_lock)."""
    return f"runrow.enqueue:{schema}:conversation:{conversation_id}"


def _find_idempotent(options: EnqueueOptions) -> Plan[submit.IdempotentRun | None]:
    """The run this turn's idempotency key already names (see :func:`submit.find_idempotent`)."""
    return submit.find_idempotent(
        options.schema,
        user_id=options.user_id,
        idempotency_key=options.idempotency_key,
        conversation_id=options.conversation_id,
        tenant_id=options.tenant_id,
        content=options.content,
        request=options.request,
    )


def _same_turn(found: submit.IdempotentRun, options: EnqueueOptions) -> None:
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
        assert options.idempotency_key is not None  # (found by it)
        raise IdempotencyConflict(options.idempotency_key, found.run.id, differ)


def _interrupt(options: EnqueueOptions) -> Plan[StopResult | None]:
    """Stops the conversation's active turns inside the enqueue's transaction."""
    if options.idempotency_key is not None:
        found = yield from _find_idempotent(options)
        if found is not None:
            _same_turn(found, options)  # a reused key stops nothing
            return None  # a repeat of an accepted interrupt: it already stopped what it stopped
    return (yield from stop_locked(options.schema, options.conversation_id))


def _refuse(gate: submit.Admission, options: EnqueueOptions) -> Plan[NoReturn]:
    """Raises the typed refusal for a gated enqueue that wrote nothing."""
    tenant_queued, conversation_queued = gate.tenant_queued, gate.conversation_queued
    if gate.busy:
        raise ConversationBusy(options.conversation_id)
    if gate.budget_spent_until is not None:
        wait = max(1, min(86400 * 366, math.ceil(gate.budget_resets_in or 1)))
        raise Overloaded(
            "tenant", options.tenant_id, 0, wait, reason="usage_budget", resets_at=gate.budget_spent_until
        )
    finished, tenant_finished, avg_run = yield from reads.throughput(
        options.schema, tenant_id=options.tenant_id, window_seconds=THROUGHPUT_WINDOW_SECONDS, now=None
    )
    tenant_limit, conversation_limit = options.max_queued_tenant, options.max_queued_conversation
    if tenant_limit is not None and tenant_queued is not None and tenant_queued >= tenant_limit:
        # One of the tenant's runs must start: about one tenant completion interval.
        done = tenant_finished or finished
        hint = THROUGHPUT_WINDOW_SECONDS / done if done else avg_run
        raise Overloaded("tenant", options.tenant_id, tenant_limit, _seconds(hint))
    assert conversation_limit is not None and conversation_queued is not None
    # The conversation's turns run one at a time: about one run's duration.
    raise Overloaded("conversation", options.conversation_id, conversation_limit, _seconds(avg_run))


def _seconds(hint: float | None) -> int:
    """A retry-after hint in whole seconds, 1..3600; 30 when there is no recent history."""
    if hint is None:
        return 30
    return max(1, min(3600, math.ceil(hint)))
