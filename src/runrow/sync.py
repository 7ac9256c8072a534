"""runrow's API for synchronous hosts (Django, Flask, any WSGI app, scripts).

``from runrow import sync`` then ``sync.enqueue(conn, ...)``: the same functions as the
asynchronous API, with the same arguments, checks, SQL, results and typed errors, on a
synchronous ``psycopg.Connection``, a ``psycopg_pool.ConnectionPool`` or a conninfo
string. Given a connection inside a transaction, a call joins it, as the async API does:
``sync.enqueue`` in the host's open transaction commits (and sends its wake NOTIFY) with
the host's own writes, or rolls back with them and leaves nothing.

Each function runs the very operation its async twin runs (see ``runrow/_ops.py``):
the rules exist once, and only the executor differs. ``sync.tail`` polls (a synchronous
host has no notification hub); it resumes from a cursor, as :func:`runrow.tail` does.
Workers (:class:`runrow.Dispatcher`) stay asynchronous.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from . import (
    _enqueue,
    _inputs,
    _limits,
    _queries,
    _retry_run,
    _schedules,
    _stop,
    _syncdb,
    _tenants,
    _usage,
    _webhooks,
)
from ._enqueue_options import DEFAULT_MAX_CONTENT_BYTES, EnqueueOptions, OnBusy
from ._errors import InvalidInput
from ._names import DEFAULT_SCHEMA
from ._tail import check_tail
from ._tailsync import tail_sync
from ._tailtree import tail_tree_sync

if TYPE_CHECKING:
    import uuid
    from collections.abc import Collection, Iterator
    from datetime import datetime, timedelta

    from ._events import Event
    from ._gateway.inputs import PendingInput
    from ._models import (
        QueuePosition,
        RateLimit,
        Run,
        RunInfo,
        RunUsage,
        Schedule,
        StopResult,
        UsageBudget,
        UsageTotal,
    )
    from ._schedule_time import CatchUp, Overlap
    from ._syncdb import SyncDatabase
    from ._webhook_models import Webhook, WebhookDelivery

__all__ = [
    "add_schedule",
    "add_webhook",
    "cancel_run",
    "enqueue",
    "get_run",
    "get_usage_budget",
    "list_rate_limits",
    "list_schedules",
    "list_webhooks",
    "next_fires",
    "pause_schedule",
    "provide_input",
    "queue_position",
    "redeliver",
    "remove_rate_limit",
    "remove_schedule",
    "remove_usage_budget",
    "remove_webhook",
    "resume_schedule",
    "retry_run",
    "run_usage",
    "send_test_webhook",
    "set_rate_limit",
    "set_usage_budget",
    "stop_conversation",
    "tail",
    "usage_totals",
    "waiting_inputs",
    "webhook_deliveries",
]


def enqueue(
    db: SyncDatabase,
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
    """:func:`runrow.enqueue` on a synchronous connection, pool or conninfo.

    Given a ``Connection`` inside a transaction, the message, the run, its first events
    and the wake commit with the caller's writes or roll back with them.
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
    return _syncdb.perform(db, schema, _enqueue.enqueue_op(options))


def retry_run(
    db: SyncDatabase,
    run_id: uuid.UUID | str,
    *,
    deadline: _retry_run.RetryDeadline = _retry_run.KEEP,
    schema: str = DEFAULT_SCHEMA,
) -> Run:
    """:func:`runrow.retry_run` on a synchronous connection, pool or conninfo: the retry
    keeps the turn's deadline unless ``deadline`` sets a new one or ``None`` clears it."""
    try:
        return _syncdb.perform(db, schema, _retry_run.retry_run_op(run_id, deadline=deadline, schema=schema))
    except psycopg.errors.CheckViolation as e:
        raise _retry_run.retired_refusal(e, run_id) from e


def cancel_run(db: SyncDatabase, run_id: uuid.UUID | str, *, schema: str = DEFAULT_SCHEMA) -> StopResult:
    """:func:`runrow.cancel_run` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _stop.cancel_run_op(run_id, schema=schema))


def stop_conversation(db: SyncDatabase, conversation_id: str, *, schema: str = DEFAULT_SCHEMA) -> StopResult:
    """:func:`runrow.stop_conversation` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _stop.stop_conversation_op(conversation_id, schema=schema))


def provide_input(
    db: SyncDatabase, run_id: uuid.UUID | str, key: str, value: Any, *, schema: str = DEFAULT_SCHEMA
) -> bool:
    """:func:`runrow.provide_input` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _inputs.provide_input_op(run_id, key, value, schema=schema))


def waiting_inputs(
    db: SyncDatabase,
    *,
    run_id: uuid.UUID | str | None = None,
    conversation_id: str | None = None,
    limit: int = 100,
    schema: str = DEFAULT_SCHEMA,
) -> list[PendingInput]:
    """:func:`runrow.waiting_inputs` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(
        db,
        schema,
        _inputs.waiting_inputs_op(run_id=run_id, conversation_id=conversation_id, limit=limit, schema=schema),
    )


def get_run(db: SyncDatabase, run_id: uuid.UUID | str, *, schema: str = DEFAULT_SCHEMA) -> RunInfo:
    """:func:`runrow.get_run` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _queries.get_run_op(run_id, schema=schema))


def queue_position(
    db: SyncDatabase,
    run_id: uuid.UUID | str,
    *,
    now: datetime | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> QueuePosition:
    """:func:`runrow.queue_position` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _tenants.queue_position_op(run_id, now=now, schema=schema))


def tail(
    db: SyncDatabase,
    run_id: uuid.UUID | str,
    *,
    from_seq: int = 0,
    keepalive: float = 15.0,
    poll: float = 0.5,
    schema: str = DEFAULT_SCHEMA,
    batch: int = 500,
    prepared_statements: bool = True,
    tree: bool = False,
    read_from: SyncDatabase | None = None,
) -> Iterator[Event]:
    """Yields the run's events after ``from_seq`` until its terminal event, polling.

    :func:`runrow.tail` for a synchronous host (an SSE response of a WSGI app): the same
    reads, cursor and endings, without a notification hub. It reads every ``poll``
    seconds while there is nothing new, yields a keepalive after ``keepalive`` idle
    seconds, and waits out a database that cannot be reached. Pass the last ``seq``
    seen back as ``from_seq`` (an SSE ``Last-Event-ID``) to resume with no gap and no
    duplicate. Its arguments are checked at the call (before a response starts), not at
    the first event. Given a conninfo string it keeps one connection of its own
    (``prepared_statements=False`` for a transaction-pooling pgbouncer); with a pool it
    takes a connection per read and holds none while it waits. ``tree=True``: the
    stream of the tree a root turn spawned, as :func:`runrow.tail` gives it.
    ``read_from`` (a hot standby of ``db``) serves the reads: a polling tail waits for
    no notification, so a standby that lags only makes events late (a standby behind the
    tail's cursor reads as "nothing yet"); while it cannot be reached the reads go to
    ``db``, trying the standby again after a second. Not with ``tree=True``.
    """
    rid = check_tail(run_id, from_seq=from_seq, keepalive=keepalive, poll=poll, schema=schema)
    if read_from is not None and tree:
        raise InvalidInput("read_from", "a tree's tail writes its order down: it reads the primary only")
    if tree:
        return tail_tree_sync(
            db,
            rid,
            from_seq=from_seq,
            keepalive=keepalive,
            poll=poll,
            schema=schema,
            batch=batch,
            prepared_statements=prepared_statements,
        )
    return tail_sync(db, rid, from_seq, keepalive, poll, schema, batch, prepared_statements, read_from)


def add_schedule(
    db: SyncDatabase,
    name: str,
    *,
    conversation_id: str,
    user_id: str,
    content: Any,
    cron: str | None = None,
    every: float | timedelta | None = None,
    timezone: str = "UTC",
    tenant_id: str | None = None,
    request: Any = None,
    overlap: Overlap = "skip",
    catch_up: CatchUp = "last",
    catch_up_limit: int = 100,
    paused: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> Schedule:
    """:func:`runrow.add_schedule` on a synchronous connection, pool or conninfo."""
    op = _schedules.add_schedule_op(
        name,
        conversation_id=conversation_id,
        user_id=user_id,
        content=content,
        cron=cron,
        every=every,
        timezone=timezone,
        tenant_id=tenant_id,
        request=request,
        overlap=overlap,
        catch_up=catch_up,
        catch_up_limit=catch_up_limit,
        paused=paused,
        schema=schema,
    )
    return _syncdb.perform(db, schema, op)


def list_schedules(db: SyncDatabase, *, schema: str = DEFAULT_SCHEMA) -> list[Schedule]:
    """:func:`runrow.list_schedules` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _schedules.list_schedules_op(schema=schema))


def pause_schedule(db: SyncDatabase, name: str, *, schema: str = DEFAULT_SCHEMA) -> Schedule | None:
    """:func:`runrow.pause_schedule` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _schedules.set_paused_op(name, paused=True, schema=schema))


def resume_schedule(db: SyncDatabase, name: str, *, schema: str = DEFAULT_SCHEMA) -> Schedule | None:
    """:func:`runrow.resume_schedule` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _schedules.set_paused_op(name, paused=False, schema=schema))


def remove_schedule(db: SyncDatabase, name: str, *, schema: str = DEFAULT_SCHEMA) -> bool:
    """:func:`runrow.remove_schedule` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _schedules.remove_schedule_op(name, schema=schema))


def next_fires(
    db: SyncDatabase, name: str, n: int = 5, *, schema: str = DEFAULT_SCHEMA
) -> list[datetime] | None:
    """:func:`runrow.next_fires` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _schedules.next_fires_op(name, n, schema=schema))


def usage_totals(
    db: SyncDatabase,
    *,
    tenant: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[UsageTotal]:
    """:func:`runrow.usage_totals` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(
        db, schema, _usage.usage_totals_op(tenant=tenant, since=since, until=until, schema=schema)
    )


def run_usage(db: SyncDatabase, run_id: uuid.UUID | str, *, schema: str = DEFAULT_SCHEMA) -> RunUsage:
    """:func:`runrow.run_usage` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _usage.run_usage_op(run_id, schema=schema))


def set_usage_budget(
    db: SyncDatabase,
    tenant_id: str | None,
    *,
    tokens: int | None = None,
    cost: float | None = None,
    per: str | int = "day",
    schema: str = DEFAULT_SCHEMA,
) -> UsageBudget:
    """:func:`runrow.set_usage_budget` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(
        db, schema, _usage.set_usage_budget_op(tenant_id, tokens=tokens, cost=cost, per=per, schema=schema)
    )


def get_usage_budget(
    db: SyncDatabase, tenant_id: str | None, *, schema: str = DEFAULT_SCHEMA
) -> UsageBudget | None:
    """:func:`runrow.get_usage_budget` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _usage.get_usage_budget_op(tenant_id, schema=schema))


def remove_usage_budget(db: SyncDatabase, tenant_id: str | None, *, schema: str = DEFAULT_SCHEMA) -> bool:
    """:func:`runrow.remove_usage_budget` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _usage.remove_usage_budget_op(tenant_id, schema=schema))


def set_rate_limit(
    db: SyncDatabase, key: str, *, runs: int, per: float | timedelta, schema: str = DEFAULT_SCHEMA
) -> RateLimit:
    """:func:`runrow.set_rate_limit` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _limits.set_rate_limit_op(key, runs=runs, per=per, schema=schema))


def list_rate_limits(db: SyncDatabase, *, schema: str = DEFAULT_SCHEMA) -> list[RateLimit]:
    """:func:`runrow.list_rate_limits` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _limits.list_rate_limits_op(schema=schema))


def remove_rate_limit(db: SyncDatabase, key: str, *, schema: str = DEFAULT_SCHEMA) -> bool:
    """:func:`runrow.remove_rate_limit` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _limits.remove_rate_limit_op(key, schema=schema))


def add_webhook(
    db: SyncDatabase,
    name: str,
    url: str,
    *,
    endings: str | Collection[str] = "all",
    secret: str | None = None,
    tenant_id: str | None = None,
    allow_private: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> Webhook:
    """:func:`runrow.add_webhook` on a synchronous connection, pool or conninfo."""
    op = _webhooks.add_webhook_op(
        name,
        url,
        endings=endings,
        secret=secret,
        tenant_id=tenant_id,
        allow_private=allow_private,
        schema=schema,
    )
    return _syncdb.perform(db, schema, op)


def list_webhooks(db: SyncDatabase, *, schema: str = DEFAULT_SCHEMA) -> list[Webhook]:
    """:func:`runrow.list_webhooks` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _webhooks.list_webhooks_op(schema=schema))


def remove_webhook(db: SyncDatabase, name: str, *, schema: str = DEFAULT_SCHEMA) -> bool:
    """:func:`runrow.remove_webhook` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _webhooks.remove_webhook_op(name, schema=schema))


def redeliver(
    db: SyncDatabase, delivery_id: uuid.UUID | str, *, schema: str = DEFAULT_SCHEMA
) -> WebhookDelivery | None:
    """:func:`runrow.redeliver` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _webhooks.redeliver_op(delivery_id, schema=schema))


def send_test_webhook(db: SyncDatabase, name: str, *, schema: str = DEFAULT_SCHEMA) -> WebhookDelivery | None:
    """:func:`runrow.send_test_webhook` on a synchronous connection, pool or conninfo."""
    return _syncdb.perform(db, schema, _webhooks.send_test_webhook_op(name, schema=schema))


def webhook_deliveries(
    db: SyncDatabase,
    *,
    webhook: str | None = None,
    state: str | None = None,
    run_id: uuid.UUID | None = None,
    limit: int = 50,
    schema: str = DEFAULT_SCHEMA,
) -> list[WebhookDelivery]:
    """:func:`runrow.webhook_deliveries` on a synchronous connection, pool or conninfo."""
    op = _webhooks.webhook_deliveries_op(
        webhook=webhook, state=state, run_id=run_id, limit=limit, schema=schema
    )
    return _syncdb.perform(db, schema, op)
