"""Turn order (#17): the transcript follows turns, not insert order, and a conversation's
turns start in the order their enqueues committed."""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest

import runrow

from . import manual
from .helpers import is_terminal, run_row, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}


def _shape(msgs: list[runrow.Message]) -> list[tuple[str, Any, str]]:
    return [(m.role, m.content, m.status) for m in msgs]


async def _enqueue(db: Any, schema: str, conversation: str, content: str, **kw: Any) -> runrow.Run:
    return await runrow.enqueue(
        db, schema=schema, conversation_id=conversation, user_id="u", content=content, **kw
    )


@pytest.mark.parametrize("answer", ["streamed", "written"])
async def test_an_answer_stays_before_the_next_turn_sent_while_it_streamed(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, answer: str
) -> None:
    streaming, release = anyio.Event(), anyio.Event()
    seen: dict[str, list[tuple[str, Any, str]]] = {}

    async def agent(run: runrow.RunContext) -> None:
        seen[run.content] = _shape(await run.transcript())
        if run.content == "q1":
            await run.text("a1")
            await run.flush()
            streaming.set()
            await release.wait()
            if answer == "written":
                await run.write_message("a1")
            return
        await run.write_message("a2")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        first = await _enqueue(dsn, schema, "c", "q1")
        with anyio.fail_after(10):
            await streaming.wait()
        second = await _enqueue(dsn, schema, "c", "q2")  # double-texting, on_busy="enqueue"
        release.set()
        for run in (first, second):
            await wait_for(lambda run=run: is_terminal(conn, schema, run.id), what="both turns to end")
    turn1 = [("user", "q1", "sent"), ("assistant", "a1", "complete")]
    turn2 = [("user", "q2", "sent"), ("assistant", "a2", "complete")]
    # The second turn's model reads the first turn's answer before its own question.
    assert seen["q2"] == [*turn1, turn2[0]]
    assert _shape(await runrow.transcript(dsn, "c", schema=schema)) == [*turn1, *turn2]


async def test_an_interrupted_partial_answer_stays_in_its_turn(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    streaming = anyio.Event()
    seen: dict[str, list[tuple[str, Any, str]]] = {}

    async def agent(run: runrow.RunContext) -> None:
        seen[run.content] = _shape(await run.transcript())
        if run.content == "q1":
            await run.text("half")
            await run.flush()
            streaming.set()
            await anyio.sleep_forever()
        await run.write_message("a2")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        first = await _enqueue(dsn, schema, "c", "q1")
        with anyio.fail_after(10):
            await streaming.wait()
        second = await _enqueue(dsn, schema, "c", "q2", on_busy="interrupt")
        for run in (first, second):
            await wait_for(lambda run=run: is_terminal(conn, schema, run.id), what="both turns to end")
    turn1 = [("user", "q1", "sent"), ("assistant", "half", "partial")]
    assert seen["q2"] == [*turn1, ("user", "q2", "sent")]
    assert _shape(await runrow.transcript(dsn, "c", schema=schema)) == [
        *turn1,
        ("user", "q2", "sent"),
        ("assistant", "a2", "complete"),
    ]


async def test_a_turn_reads_no_later_turn_and_a_retry_answers_in_its_own_turn(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A running turn's model is not handed questions queued after it; a retry's answer
    joins the turn it retries, and its model reads the conversation up to that turn."""
    streaming, release = anyio.Event(), anyio.Event()
    seen: list[tuple[str, list[tuple[str, Any, str]]]] = []
    attempts: list[str] = []

    async def agent(run: runrow.RunContext) -> None:
        attempts.append(run.content)
        if run.content == "q1" and attempts.count("q1") == 1:
            await run.text("a1 cut")
            await run.flush()
            streaming.set()
            await release.wait()
            seen.append((run.content, _shape(await run.transcript())))
            raise RuntimeError("model exploded")
        seen.append((run.content, _shape(await run.transcript())))
        await run.write_message(f"a{run.content[1:]}")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        first = await _enqueue(dsn, schema, "c", "q1")
        with anyio.fail_after(10):
            await streaming.wait()
        second = await _enqueue(dsn, schema, "c", "q2")
        release.set()
        for run in (first, second):
            await wait_for(lambda run=run: is_terminal(conn, schema, run.id), what="both turns to end")
        retry = await runrow.retry_run(dsn, first.id, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, retry.id), what="the retry to end")
    q1, q2 = ("user", "q1", "sent"), ("user", "q2", "sent")
    cut = ("assistant", "a1 cut", "partial")
    assert seen == [
        ("q1", [q1]),  # q2 was already queued: not this turn's business
        ("q2", [q1, cut, q2]),
        ("q1", [q1, cut]),  # the retry answers q1, not q2
    ]
    assert _shape(await runrow.transcript(dsn, "c", schema=schema)) == [
        q1,
        cut,
        ("assistant", "a1", "complete"),
        q2,
        ("assistant", "a2", "complete"),
    ]


async def test_migration_puts_existing_messages_in_turn_order(
    dsn: str, schema_name: str, conn: psycopg.AsyncConnection
) -> None:
    """Rows written before the turn column existed (version 2) are backfilled into turns."""
    import uuid

    from psycopg import sql

    from .helpers import table

    def t(name: str) -> sql.Composed:
        return table(schema_name, name)

    ids = {k: uuid.uuid4() for k in ("m1", "m2", "m3", "r1", "r2", "r3", "r4")}

    async def message(mid: str | None, run: str | None, role: str, content: str, status: str) -> None:
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, conversation_id, run_id, role, content, status)"
                " VALUES (%s, 'c', %s, %s, %s, %s)"
            ).format(t("message")),
            (
                ids[mid] if mid else uuid.uuid4(),
                ids[run] if run else None,
                role,
                psycopg.types.json.Jsonb(content),
                status,
            ),
        )

    async def agent_run(rid: str, mid: str, status: str, retry_of: str | None = None) -> None:
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, conversation_id, user_id, user_message_id, status, retry_of,"
                " finished_at) VALUES (%s, 'c', 'u', %s, %s, %s,"
                " CASE WHEN %s IN ('queued', 'running') THEN NULL ELSE now() END)"
            ).format(t("agent_run")),
            (ids[rid], ids[mid], status, ids[retry_of] if retry_of else None, status),
        )

    try:
        await runrow.migrate(dsn, schema=schema_name, target=2)
        # Insert order as the old code produced it: q2 arrived while turn 1 streamed.
        await message("m1", "r1", "user", "q1", "sent")
        await agent_run("r1", "m1", "failed")
        await message("m2", "r2", "user", "q2", "sent")
        await agent_run("r2", "m2", "completed")
        await message(None, "r1", "assistant", "a1 cut", "partial")
        await message(None, "r2", "assistant", "a2", "complete")
        await message("m3", "r4", "user", "q3", "draft")  # a stopped turn's draft
        await agent_run("r4", "m3", "cancelled")
        await message(None, None, "system", "note", "complete")  # no run: after what came before
        await agent_run("r3", "m1", "completed", retry_of="r1")  # a retry answers in turn 1
        await message(None, "r3", "assistant", "a1", "complete")
        await runrow.migrate(dsn, schema=schema_name)
        assert _shape(await runrow.transcript(dsn, "c", schema=schema_name)) == [
            ("user", "q1", "sent"),
            ("assistant", "a1 cut", "partial"),
            ("assistant", "a1", "complete"),
            ("user", "q2", "sent"),
            ("assistant", "a2", "complete"),
            ("system", "note", "complete"),
        ]
        # The draft keeps its own turn, so a retry of it comes back where it was.
        cur = await conn.execute(
            sql.SQL("SELECT m.turn = r.queue_order FROM {} m JOIN {} r ON r.id = %s WHERE m.id = %s").format(
                t("message"), t("agent_run")
            ),
            (ids["r4"], ids["m3"]),
        )
        assert await cur.fetchone() == (True,)
    finally:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name)))


async def _waiting_on_lock(conn: psycopg.AsyncConnection, pid: int) -> bool:
    cur = await conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
    row = await cur.fetchone()
    return row is not None and row[0] == "Lock"


async def _last_queue_order(conn: psycopg.AsyncConnection, schema: str) -> int:
    cur = await conn.execute(
        "SELECT pg_sequence_last_value(pg_get_serial_sequence(%s, 'queue_order'))",
        (f'"{schema}".agent_run',),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _queue_order(conn: psycopg.AsyncConnection, schema: str, run_id: Any) -> int:
    return int((await run_row(conn, schema, run_id))["queue_order"])


async def test_turns_start_in_the_order_their_enqueues_committed(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A turn enqueued in a host transaction that commits late is still the earlier turn:
    a later enqueue of the same conversation waits for that commit, not the other way round,
    and enqueues of other conversations do not wait at all."""
    started: list[str] = []
    seen: dict[str, list[tuple[str, Any, str]]] = {}

    async def agent(run: runrow.RunContext) -> None:
        started.append(run.content)
        seen[run.content] = _shape(await run.transcript())
        await run.write_message(f"answer to {run.content}")

    later: list[runrow.Run] = []
    async with (
        runrow.Dispatcher(dsn, agent, schema=schema, **FAST),
        await psycopg.AsyncConnection.connect(dsn) as host,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other,
    ):

        async def send_later() -> None:
            later.append(await _enqueue(other, schema, "c", "later"))

        async with anyio.create_task_group() as tg, host.transaction():
            early = await _enqueue(host, schema, "c", "early")  # its queue_order is drawn now
            tg.start_soon(send_later)
            # Either the later turn waits for the host's commit (the fix) or it
            # commits and starts first (the defect).
            await wait_for(
                lambda: "later" in started or _waiting_on_lock(conn, other.info.backend_pid),
                what="the later enqueue to wait or its turn to start",
            )
            # The waiting enqueue has not drawn its queue_order yet: it will draw it
            # after the host's commit, so it queues after the host's turn.
            assert await _last_queue_order(conn, schema) == await _queue_order(host, schema, early.id)
            # Another conversation is not held up by this host transaction.
            with anyio.fail_after(5):
                elsewhere = await _enqueue(dsn, schema, "elsewhere", "elsewhere")
            await wait_for(lambda: is_terminal(conn, schema, elsewhere.id), what="elsewhere to run")
            waited = later == []  # still waiting while the host's transaction is open
            # The host commits here; the later enqueue then goes through.
        (late,) = later
        for run in (early, late):
            await wait_for(lambda run=run: is_terminal(conn, schema, run.id), what="both turns to end")
    assert [s for s in started if s != "elsewhere"] == ["early", "later"]
    early_turn = [("user", "early", "sent"), ("assistant", "answer to early", "complete")]
    assert seen["later"] == [*early_turn, ("user", "later", "sent")]
    assert _shape(await runrow.transcript(dsn, "c", schema=schema)) == [
        *early_turn,
        ("user", "later", "sent"),
        ("assistant", "answer to later", "complete"),
    ]
    assert waited
    assert early.id != late.id


async def test_a_retry_queues_after_an_enqueue_that_committed_before_it(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    failed = await _enqueue(dsn, schema, "c", "q1")
    (claimed,) = await manual.claim(conn, schema)
    assert await manual.finalize(conn, schema, failed.id, claimed["claim_token"], "failed", 3)
    retried: list[runrow.Run] = []
    async with (
        await psycopg.AsyncConnection.connect(dsn) as host,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other,
    ):

        async def retry() -> None:
            retried.append(await runrow.retry_run(other, failed.id, schema=schema))

        async with anyio.create_task_group() as tg, host.transaction():
            sent = await _enqueue(host, schema, "c", "q2")
            tg.start_soon(retry)
            await wait_for(lambda: _waiting_on_lock(conn, other.info.backend_pid), what="the retry to wait")
            assert await _last_queue_order(conn, schema) == await _queue_order(host, schema, sent.id)
    (again,) = retried
    assert await _queue_order(conn, schema, again.id) > await _queue_order(conn, schema, sent.id)


async def test_mixed_gated_and_plain_enqueues_race_without_deadlock(dsn: str, schema: str) -> None:
    """Plain enqueues take the conversation lock only; gated ones the tenant lock, then the
    conversation's: one order, so a crowd of both on shared tenants and conversations ends."""
    made: list[runrow.Run] = []

    async def one(i: int) -> None:
        kw: dict[str, Any] = {}
        if i % 4 == 1:
            kw["max_queued_per_tenant"] = 1000
        elif i % 4 == 2:
            kw["max_queued_per_conversation"] = 1000
        elif i % 4 == 3:
            kw["on_busy"] = "interrupt"
        async with await psycopg.AsyncConnection.connect(dsn) as c, c.transaction():
            # Host transactions that also write elsewhere, holding their locks a moment.
            made.append(await _enqueue(c, schema, f"c{i % 3}", f"m{i}", tenant_id="t", **kw))
            await c.execute("SELECT pg_sleep(0.01)")

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(one, i)
    assert len(made) == 40
