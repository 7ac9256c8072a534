"""runrow.sync agrees with the async API: the same checks, results and typed errors (each
case runs through both and compares them), and a sync enqueue joins the caller's
transaction: rolled back it leaves nothing, committed a real Dispatcher runs it."""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import runrow
from runrow import sync
from runrow._names import Channels

from . import manual
from .helpers import count, counts, table, wait_for
from .test_enqueue import BAD_INPUTS

pytestmark = pytest.mark.anyio

SCHEDULE_APIS = (
    "add_schedule",
    "list_schedules",
    "next_fires",
    "pause_schedule",
    "remove_schedule",
    "resume_schedule",
)
USAGE_APIS = ("get_usage_budget", "remove_usage_budget", "run_usage", "set_usage_budget", "usage_totals")
APIS = (
    "cancel_run",
    "enqueue",
    "get_run",
    "provide_input",
    "queue_position",
    "retry_run",
    "stop_conversation",
    "waiting_inputs",
    *SCHEDULE_APIS,
    *USAGE_APIS,
    "list_rate_limits",
    "remove_rate_limit",
    "set_rate_limit",
    # webhooks (#42; tests/test_webhooks_outbox.py runs the sync ones)
    "add_webhook",
    "list_webhooks",
    "redeliver",
    "remove_webhook",
    "send_test_webhook",
    "webhook_deliveries",
)


async def call(api: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """``runrow.<name>`` awaited, or ``runrow.sync.<name>`` in a worker thread."""
    if api == "async":
        return await getattr(runrow, name)(*args, **kwargs)
    return await anyio.to_thread.run_sync(functools.partial(getattr(sync, name), *args, **kwargs))


async def outcome(api: str, name: str, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """What a call gave: its result, or its error's type, message and attributes."""
    try:
        return "ok", await call(api, name, *args, **kwargs)
    except runrow.RunrowError as exc:
        return type(exc).__name__, (str(exc), vars(exc))


# -- cases: each sets up its state and names one call ---------------------------------

Case = Callable[[str, str, psycopg.AsyncConnection], Awaitable[tuple[str, tuple[Any, ...], dict[str, Any]]]]
CASES: list[tuple[str, str, Case]] = []


def case(expected: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES.append((fn.__name__, expected, fn))
        return fn

    return register


def turn(**kw: Any) -> dict[str, Any]:
    return {"conversation_id": "c", "user_id": "u", "content": "hi", **kw}


async def failed_run(dsn: str, schema: str, conn: psycopg.AsyncConnection, conversation: str) -> runrow.Run:
    run = await runrow.enqueue(dsn, schema=schema, **turn(conversation_id=conversation, request={"m": 1}))
    (claimed,) = await manual.claim(conn, schema)
    assert await manual.finalize(conn, schema, run.id, claimed["claim_token"], "failed", 3)
    return run


# Every bad input of enqueue (test_enqueue.py's list), and the other functions' bad ids.
for _i, (_override, _field) in enumerate(BAD_INPUTS):

    async def _bad(dsn: str, schema: str, conn: Any, _o: dict[str, Any] = _override) -> Any:
        return "enqueue", (dsn,), turn(schema=schema, **_o)

    _bad.__name__ = f"enqueue_bad_{_field}_{_i}"
    case("InvalidInput")(_bad)

for _name in APIS:
    for _label, _schema in (("bad_schema", "a\x00b"), ("missing_schema", "never_migrated")):

        async def _schema_case(dsn: str, schema: str, conn: Any, _n: str = _name, _s: str = _schema) -> Any:
            args: tuple[Any, ...] = (dsn, "c" if _n == "stop_conversation" else uuid.uuid4())
            if _n in (
                "enqueue", "waiting_inputs", "list_schedules", "list_rate_limits", "list_webhooks",
                "webhook_deliveries",
            ):  # fmt: skip
                args = (dsn,)
            elif _n in (
                *SCHEDULE_APIS,
                "set_rate_limit",
                "remove_rate_limit",
                "remove_webhook",
                "send_test_webhook",
            ):
                args = (dsn, "s")
            elif _n == "add_webhook":
                args = (dsn, "s", "https://example.com/hook")
            elif _n == "provide_input":
                args = (dsn, uuid.uuid4(), "k", True)
            elif _n in USAGE_APIS:
                args = (
                    (dsn, uuid.uuid4())
                    if _n == "run_usage"
                    else (dsn,)
                    if _n == "usage_totals"
                    else (dsn, "t")
                )
            extra = turn() if _n == "enqueue" else turn(every=60) if _n == "add_schedule" else {}
            extra = {"tokens": 1} if _n == "set_usage_budget" else extra
            if _n == "set_rate_limit":
                extra = {"runs": 1, "per": 1}
            return _n, args, {"schema": _s, **extra}

        _schema_case.__name__ = f"{_name}_{_label}"
        case("InvalidInput" if _label == "bad_schema" else "SchemaOutOfDate")(_schema_case)

for _name in ("cancel_run", "get_run", "queue_position", "retry_run"):
    for _label, _rid in (("unknown_run", uuid.UUID(int=7)), ("not_a_uuid", "not-a-uuid")):

        async def _unknown(dsn: str, schema: str, conn: Any, _n: str = _name, _r: object = _rid) -> Any:
            return _n, (dsn, _r), {"schema": schema}

        _unknown.__name__ = f"{_name}_{_label}"
        case("RunNotFound")(_unknown)


for _label, _rid in (("unknown_run", uuid.UUID(int=7)), ("not_a_uuid", "not-a-uuid")):

    async def _unknown_input(dsn: str, schema: str, conn: Any, _r: object = _rid) -> Any:
        return "provide_input", (dsn, _r, "k", True), {"schema": schema}

    _unknown_input.__name__ = f"provide_input_{_label}"
    case("RunNotFound")(_unknown_input)


@case("InvalidInput")
async def usage_budget_with_a_period_that_is_not_whole_hours(dsn: str, schema: str, conn: Any) -> Any:
    return "set_usage_budget", (dsn, "t"), {"tokens": 1, "per": 1800, "schema": schema}


@case("ok")
async def usage_budget_set(dsn: str, schema: str, conn: Any) -> Any:
    return "set_usage_budget", (dsn, "t"), {"tokens": 5, "cost": 1.5, "per": "hour", "schema": schema}


@case("ok")
async def usage_totals_of_a_tenant_with_none(dsn: str, schema: str, conn: Any) -> Any:
    return "usage_totals", (dsn,), {"tenant": "t", "schema": schema}


@case("NotWaitingForInput")
async def provide_input_to_a_queued_run(dsn: str, schema: str, conn: Any) -> Any:
    run = await runrow.enqueue(dsn, schema=schema, **turn())
    return "provide_input", (dsn, run.id, "k", {"approved": True}), {"schema": schema}


@case("InvalidInput")
async def waiting_inputs_with_a_bad_limit(dsn: str, schema: str, conn: Any) -> Any:
    return "waiting_inputs", (dsn,), {"schema": schema, "limit": 0}


@case("ok")
async def waiting_inputs_of_a_parked_run(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> Any:
    run = await runrow.enqueue(dsn, schema=schema, **turn(conversation_id="parked"))
    (claimed,) = await manual.claim(conn, schema)
    assert await manual.park(conn, schema, run.id, claimed["claim_token"], 3, key="approve")
    return "waiting_inputs", (dsn,), {"schema": schema, "conversation_id": "parked"}


@case("InvalidInput")
async def stop_conversation_empty_id(dsn: str, schema: str, conn: Any) -> Any:
    return "stop_conversation", (dsn, ""), {"schema": schema}


@case("InvalidInput")
async def retry_run_of_a_queued_run(dsn: str, schema: str, conn: Any) -> Any:
    run = await runrow.enqueue(dsn, schema=schema, **turn())
    return "retry_run", (dsn, run.id), {"schema": schema}


@case("RunTrimmed")
async def retry_run_of_a_trimmed_run(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> Any:
    run = await failed_run(dsn, schema, conn, "c")
    now = await manual.db_now(conn)
    assert (
        await runrow.trim(dsn, schema=schema, now=now + timedelta(hours=25), erase_requests=True)
    ).runs == 1
    return "retry_run", (dsn, str(run.id)), {"schema": schema}


@case("DeadlinePassed")
async def retry_run_keeping_a_deadline_that_has_passed(dsn: str, schema: str, conn: Any) -> Any:
    run = await runrow.enqueue(dsn, schema=schema, **turn(deadline=timedelta(seconds=-1)))
    await runrow.cancel_run(dsn, run.id, schema=schema)
    return "retry_run", (dsn, run.id), {"schema": schema}


@case("InvalidInput")
async def retry_run_with_a_naive_deadline(dsn: str, schema: str, conn: Any) -> Any:
    run = await runrow.enqueue(dsn, schema=schema, **turn())
    await runrow.cancel_run(dsn, run.id, schema=schema)
    return "retry_run", (dsn, run.id), {"schema": schema, "deadline": datetime(2030, 1, 1)}


@case("ConversationBusy")
async def enqueue_reject_a_queued_conversation(dsn: str, schema: str, conn: Any) -> Any:
    await runrow.enqueue(dsn, schema=schema, **turn())
    return "enqueue", (dsn,), turn(schema=schema, on_busy="reject")


@case("ConversationBusy")
async def enqueue_reject_a_running_conversation(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> Any:
    await runrow.enqueue(dsn, schema=schema, **turn())
    await manual.claim(conn, schema)
    return "enqueue", (dsn,), turn(schema=schema, on_busy="reject")


@case("Overloaded")
async def enqueue_past_the_conversation_limit(dsn: str, schema: str, conn: Any) -> Any:
    await runrow.enqueue(dsn, schema=schema, **turn())
    return "enqueue", (dsn,), turn(schema=schema, max_queued_per_conversation=1)


@case("Overloaded")
async def enqueue_past_the_tenant_limit(dsn: str, schema: str, conn: Any) -> Any:
    await runrow.enqueue(dsn, schema=schema, **turn(conversation_id="other", tenant_id="t"))
    return "enqueue", (dsn,), turn(schema=schema, tenant_id="t", max_queued_per_tenant=1)


@case("IdempotencyConflict")
async def enqueue_a_key_reused_for_other_content(dsn: str, schema: str, conn: Any) -> Any:
    await runrow.enqueue(dsn, schema=schema, **turn(idempotency_key="k"))
    return "enqueue", (dsn,), turn(schema=schema, idempotency_key="k", content="other")


@case("IdempotencyConflict")
async def enqueue_a_key_whose_run_is_of_another_conversation(dsn: str, schema: str, conn: Any) -> Any:
    await runrow.enqueue(dsn, schema=schema, **turn(idempotency_key="k", conversation_id="first"))
    return "enqueue", (dsn,), turn(schema=schema, idempotency_key="k")


@case("IdempotencyConflict")
async def enqueue_interrupt_with_a_reused_key(dsn: str, schema: str, conn: Any) -> Any:
    await runrow.enqueue(dsn, schema=schema, **turn(idempotency_key="k"))
    return "enqueue", (dsn,), turn(schema=schema, idempotency_key="k", content="x", on_busy="interrupt")


@case("ok")
async def enqueue_an_idempotent_repeat(dsn: str, schema: str, conn: Any) -> Any:
    await runrow.enqueue(dsn, schema=schema, **turn(idempotency_key="k", request={"r": [1]}))
    return "enqueue", (dsn,), turn(schema=schema, idempotency_key="k", request={"r": [1]})


@case("ok")
async def get_run_of_a_queued_run(dsn: str, schema: str, conn: Any) -> Any:
    run = await runrow.enqueue(dsn, schema=schema, **turn(tenant_id="t"))
    return "get_run", (dsn, str(run.id)), {"schema": schema}


@case("ok")
async def queue_position_of_the_second_run(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> Any:
    await runrow.enqueue(dsn, schema=schema, **turn(conversation_id="a"))
    run = await runrow.enqueue(dsn, schema=schema, **turn(conversation_id="b"))
    return "queue_position", (dsn, run.id), {"schema": schema, "now": await manual.db_now(conn)}


@case("ok")
async def cancel_run_of_a_finished_run(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> Any:
    run = await failed_run(dsn, schema, conn, "c")
    return "cancel_run", (dsn, run.id), {"schema": schema}


@case("ok")
async def stop_conversation_with_nothing_active(dsn: str, schema: str, conn: Any) -> Any:
    return "stop_conversation", (dsn, "never-seen"), {"schema": schema}


# Schedules: their checks, a taken name, and the answers about a schedule that is not there.
for _label, _kw in (
    ("bad_cron", {"cron": "61 * * * *"}),
    ("unknown_zone", {"every": 60, "timezone": "Mars/Olympus"}),
    ("cron_and_every", {"cron": "* * * * *", "every": 60}),
    ("bad_overlap", {"every": 60, "overlap": "maybe"}),
):

    async def _bad_schedule(dsn: str, schema: str, conn: Any, _k: dict[str, Any] = _kw) -> Any:
        return "add_schedule", (dsn, "s"), {"schema": schema, **turn(**_k)}

    _bad_schedule.__name__ = f"add_schedule_{_label}"
    case("InvalidInput")(_bad_schedule)

for _name in ("pause_schedule", "resume_schedule", "remove_schedule", "next_fires"):

    async def _no_schedule(dsn: str, schema: str, conn: Any, _n: str = _name) -> Any:
        return _n, (dsn, "never-added"), {"schema": schema}

    _no_schedule.__name__ = f"{_name}_of_no_schedule"
    case("ok")(_no_schedule)


@case("InvalidInput")
async def add_schedule_with_a_taken_name(dsn: str, schema: str, conn: Any) -> Any:
    await runrow.add_schedule(dsn, "taken", schema=schema, **turn(every=60))
    return "add_schedule", (dsn, "taken"), {"schema": schema, **turn(every=30)}


@case("InvalidInput")
async def next_fires_with_a_bad_count(dsn: str, schema: str, conn: Any) -> Any:
    await runrow.add_schedule(dsn, "n", schema=schema, **turn(every=60))
    return "next_fires", (dsn, "n", 0), {"schema": schema}


async def test_a_schedule_written_through_one_api_is_what_the_other_reads(dsn: str, schema: str) -> None:
    added = await call("sync", "add_schedule", dsn, "both", schema=schema, **turn(every=60))
    assert await call("async", "list_schedules", dsn, schema=schema) == [added]
    assert await call("async", "next_fires", dsn, "both", 2, schema=schema) == await call(
        "sync", "next_fires", dsn, "both", 2, schema=schema
    )
    paused = await call("async", "pause_schedule", dsn, "both", schema=schema)
    assert paused is not None and paused.paused
    resumed = await call("sync", "resume_schedule", dsn, "both", schema=schema)
    assert resumed is not None and not resumed.paused
    assert await call("sync", "remove_schedule", dsn, "both", schema=schema)
    assert await call("async", "list_schedules", dsn, schema=schema) == []


@pytest.mark.parametrize(("expected", "setup"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_sync_and_async_agree(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, expected: str, setup: Case
) -> None:
    name, args, kwargs = await setup(dsn, schema, conn)
    before = await counts(conn, schema)
    got_async = await outcome("async", name, *args, **kwargs)
    got_sync = await outcome("sync", name, *args, **kwargs)
    assert got_async[0] == expected, got_async
    assert got_sync == got_async
    assert await counts(conn, schema) == before  # neither wrote anything


# -- the same writes ---------------------------------------------------------------------


@pytest.mark.parametrize("first", ["async", "sync"])
async def test_the_same_writes_and_what_each_finds_of_the_other(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, first: str
) -> None:
    """A write through one API is what the other finds: the idempotent repeat, the retry,
    the stop; and the rows match the async API's (message, run, two journal events)."""
    other = "sync" if first == "async" else "async"
    run = await call(first, "enqueue", dsn, **turn(schema=schema, idempotency_key="k", tenant_id="t"))
    assert run.created and run.status == "queued"
    assert await counts(conn, schema) == {"message": 1, "agent_run": 1, "run_event": 2}
    again = await call(other, "enqueue", dsn, **turn(schema=schema, idempotency_key="k", tenant_id="t"))
    assert again.id == run.id and not again.created
    stopped = await call(first, "cancel_run", dsn, run.id, schema=schema)
    assert stopped.cancelled == [run.id] and stopped.drafts[0].content == "hi"
    retried = await call(other, "retry_run", dsn, run.id, schema=schema)
    assert retried.created and retried.user_message_id == run.user_message_id
    twice = await call(first, "retry_run", dsn, run.id, schema=schema)
    assert twice.id == retried.id and not twice.created
    # interrupt: the queued retry is cancelled, its message handed back, the new turn queued
    interrupting = await call(
        other, "enqueue", dsn, **turn(schema=schema, content="now", on_busy="interrupt")
    )
    assert interrupting.interrupted is not None and interrupting.interrupted.cancelled == [retried.id]
    assert (await call(first, "get_run", dsn, retried.id, schema=schema)).status == "cancelled"
    stop = await call(other, "stop_conversation", dsn, "c", schema=schema)
    assert stop.cancelled == [interrupting.id]


async def test_the_signatures_mirror_the_async_api() -> None:
    for name in (*APIS, "tail"):
        mine, theirs = inspect.signature(getattr(sync, name)), inspect.signature(getattr(runrow, name))
        assert [(p.name, p.kind, p.default) for p in mine.parameters.values()] == [
            (p.name, p.kind, p.default)
            for p in theirs.parameters.values()
            # (No hub in a sync host, so no wait for a standby to replay a notified commit.)
            if p.name not in ("hub", "replica_lag_budget")
        ], name
        assert (getattr(sync, name).__doc__ or "").strip(), name
    assert sorted(sync.__all__) == sorted((*APIS, "tail"))


async def test_a_db_of_the_wrong_kind_is_invalid_input(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as aconn:
        with pytest.raises(
            runrow.InvalidInput, match="a ConnectionPool or a Connection, got AsyncConnection"
        ):
            sync.enqueue(aconn, schema=schema, **turn())  # type: ignore[arg-type]
    with (
        psycopg.Connection.connect(dsn) as sconn,
        pytest.raises(runrow.InvalidInput, match="AsyncConnection"),
    ):
        await runrow.get_run(sconn, uuid.uuid4(), schema=schema)  # type: ignore[arg-type]


# -- the caller's transaction --------------------------------------------------------------


async def test_sync_enqueue_joins_the_callers_transaction(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Rolled back with the host's write: no message, run or journal row, no wake, nothing
    claimed. Committed: exactly one run, its wake sent at the commit, and a real
    Dispatcher completes it."""
    await conn.execute(sql.SQL("CREATE TABLE {} (note text)").format(table(schema, "host_note")))
    note = sql.SQL("INSERT INTO {} VALUES ('mine')").format(table(schema, "host_note"))
    wake = Channels.for_schema(schema).wake
    ran: list[uuid.UUID] = []

    async def agent(run: runrow.RunContext) -> None:
        ran.append(run.run_id)
        await run.write_message("done")

    def host(commit: bool) -> runrow.Run:
        with psycopg.Connection.connect(dsn) as hconn:
            try:
                with hconn.transaction():
                    hconn.execute(note)
                    run = sync.enqueue(hconn, schema=schema, **turn(conversation_id=f"c-{commit}"))
                    # inside the caller's transaction: nobody else sees the run yet
                    with psycopg.Connection.connect(dsn, autocommit=True) as other:
                        query = sql.SQL("SELECT count(*) FROM {}").format(table(schema, "agent_run"))
                        assert other.execute(query).fetchone() == (0,)
                    if not commit:
                        raise LookupError("the host changed its mind")
            except LookupError:
                pass
            return run

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(wake)))
        async with runrow.Dispatcher(dsn, agent, schema=schema, poll=0.2):
            lost = await anyio.to_thread.run_sync(host, False)
            assert await counts(conn, schema) == {"message": 0, "agent_run": 0, "run_event": 0}
            assert await count(conn, schema, "host_note") == 0
            assert [n async for n in listener.notifies(timeout=0.5)] == []  # no wake either
            kept = await anyio.to_thread.run_sync(host, True)
            got = [n.channel async for n in listener.notifies(timeout=10, stop_after=1)]
            assert got == [wake]  # sent when the host committed

            async def completed() -> bool:
                return (await runrow.get_run(dsn, kept.id, schema=schema)).status == "completed"

            await wait_for(completed, timeout=20, what="the committed run to complete")
    assert ran == [kept.id] and lost.id != kept.id
    assert (await counts(conn, schema))["agent_run"] == 1
    assert await count(conn, schema, "host_note") == 1
    with pytest.raises(runrow.RunNotFound):
        await runrow.get_run(dsn, lost.id, schema=schema)


async def test_sync_calls_on_a_pool_and_a_conninfo(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    def work() -> list[runrow.Run]:
        with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
            on_pool = [sync.enqueue(pool, **turn(schema=schema, content=i)) for i in range(2)]
            assert sync.get_run(pool, on_pool[0].id, schema=schema).status == "queued"
            assert sync.queue_position(pool, on_pool[1].id, schema=schema).status == "queued"
        with ConnectionPool(dsn, min_size=1, max_size=1, kwargs={"autocommit": True}) as auto:
            on_pool.append(sync.enqueue(auto, **turn(schema=schema, content="auto")))
        on_dsn = sync.enqueue(dsn, **turn(schema=schema, conversation_id="d"))
        assert sync.stop_conversation(dsn, "d", schema=schema).cancelled == [on_dsn.id]
        return [*on_pool, on_dsn]

    runs = await anyio.to_thread.run_sync(work)
    assert len({r.id for r in runs}) == 4
    assert await counts(conn, schema) == {"message": 4, "agent_run": 4, "run_event": 9}
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1) as apool:
        assert (await runrow.get_run(apool, runs[3].id, schema=schema)).status == "cancelled"


async def test_an_idle_connection_gets_a_transaction_of_its_own(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """As the async API: a connection with no transaction begun (autocommit off, nothing
    run yet, e.g. Django's inside atomic() before its first query) is not joined: the
    enqueue commits on its own, so a later rollback of the host does not take it back."""

    def host() -> runrow.Run:
        with psycopg.Connection.connect(dsn) as hconn:
            run = sync.enqueue(hconn, **turn(schema=schema))
            hconn.rollback()
            return run

    run = await anyio.to_thread.run_sync(host)
    assert (await runrow.get_run(dsn, run.id, schema=schema)).status == "queued"


async def test_sync_tail_keeps_alive_resumes_and_refuses_a_cursor_past_the_end(dsn: str, schema: str) -> None:
    run = await runrow.enqueue(dsn, schema=schema, **turn())

    def first(n: int, **kw: Any) -> list[runrow.Event]:
        events = sync.tail(dsn, run.id, schema=schema, poll=0.05, **kw)
        try:
            return [next(events) for _ in range(n)]
        finally:
            events.close()  # (closes the tail's own connection)

    got = await anyio.to_thread.run_sync(lambda: first(3, keepalive=0.2))
    assert [(e.seq, e.type) for e in got] == [
        (1, "user_message_created"),
        (2, "run_queued"),
        (2, "keepalive"),
    ]
    resumed = await anyio.to_thread.run_sync(lambda: first(1, from_seq=1, keepalive=0.2))
    assert resumed == got[1:2]
    with pytest.raises(runrow.InvalidInput, match="past the end"):
        await anyio.to_thread.run_sync(lambda: first(1, from_seq=5))
    with pytest.raises(runrow.InvalidInput, match="from_seq"):
        sync.tail(dsn, run.id, schema=schema, from_seq=-1)  # checked at the call, before any read
