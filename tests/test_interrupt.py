"""Double-texting with on_busy="interrupt": stop and enqueue in one transaction, and its race
with the running turn finishing."""

from __future__ import annotations

import uuid

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from . import manual
from .helpers import assert_journal_sound, events, run_row, status_of, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}


async def _enqueue(db: object, schema: str, conversation: str, content: str, **kw: object) -> runrow.Run:
    return await runrow.enqueue(
        db,  # type: ignore[arg-type]
        schema=schema,
        conversation_id=conversation,
        user_id="u",
        content=content,
        **kw,  # type: ignore[arg-type]
    )


async def test_interrupt_cancels_queued_turns_flags_the_running_one_and_queues_the_new(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    first = await _enqueue(dsn, schema, "c", "first")
    second = await _enqueue(dsn, schema, "c", "second")
    (claimed,) = await manual.claim(conn, schema)
    new = await _enqueue(dsn, schema, "c", "third", on_busy="interrupt")
    assert new.created and new.interrupted is not None
    assert new.interrupted.cancelled == [second.id]
    assert new.interrupted.cancel_requested == [first.id]
    assert [d.content for d in new.interrupted.drafts] == ["second"]
    assert (await run_row(conn, schema, first.id))["cancel_requested"]
    assert await status_of(conn, schema, second.id) == "cancelled"
    # The new turn waits for the running one to end, then is next.
    assert await manual.claim(conn, schema) == []
    assert await manual.finalize(conn, schema, first.id, claimed["claim_token"], "cancelled", 3)
    assert [r["id"] for r in await manual.claim(conn, schema)] == [new.id]


async def test_interrupt_on_an_idle_conversation_is_a_plain_enqueue(dsn: str, schema: str) -> None:
    run = await _enqueue(dsn, schema, "c", "hi", on_busy="interrupt")
    assert run.created and run.interrupted is not None and run.interrupted.noop


async def _wait_blocked(conn: psycopg.AsyncConnection, pid: int) -> bool:
    cur = await conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
    row = await cur.fetchone()
    return row is not None and row[0] == "Lock"


async def test_a_finalize_that_waits_on_the_interrupt_still_ends_the_run_once(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    old = await _enqueue(dsn, schema, "c", "old")
    (claimed,) = await manual.claim(conn, schema)
    landed: list[bool] = []
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as worker,
        await psycopg.AsyncConnection.connect(dsn) as host,
    ):
        # The host's own transaction (begun by its first statement): the interrupt joins
        # it and holds the old turn's row lock until the host commits.
        await host.execute("SELECT 1")
        new = await _enqueue(host, schema, "c", "new", on_busy="interrupt")

        async def finish() -> None:
            landed.append(
                await manual.finalize(worker, schema, old.id, claimed["claim_token"], "completed", 3)
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(finish)
            await wait_for(lambda: _wait_blocked(conn, worker.info.backend_pid), what="finalize to block")
            assert landed == []
            await host.commit()
    # The worker's ending was first to the row once the interrupt committed: it stands.
    assert landed == [True]
    assert await status_of(conn, schema, old.id) == "completed"
    await assert_journal_sound(conn, schema, old.id)
    assert [r["id"] for r in await manual.claim(conn, schema)] == [new.id]


async def test_an_interrupt_after_the_turn_ended_asks_nothing_to_stop(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    old = await _enqueue(dsn, schema, "c", "old")
    (claimed,) = await manual.claim(conn, schema)
    assert await manual.finalize(conn, schema, old.id, claimed["claim_token"], "completed", 3)
    new = await _enqueue(dsn, schema, "c", "new", on_busy="interrupt")
    assert new.interrupted is not None and new.interrupted.noop
    assert not (await run_row(conn, schema, old.id))["cancel_requested"]


@pytest.mark.slow
async def test_interrupt_racing_the_running_turn_finishing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    calls: list[uuid.UUID] = []
    # Keyed by the turn's content, known before the enqueue (the claim may start it at once).
    started: dict[str, anyio.Event] = {}
    release: dict[str, anyio.Event] = {}
    olds: list[uuid.UUID] = []

    async def agent(run: runrow.RunContext) -> None:
        calls.append(run.run_id)
        if run.content.startswith("old"):
            started[run.content].set()
            await release[run.content].wait()
            await run.text("old answer")
            return
        await run.write_message("new answer")

    rounds = 40
    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=4, **FAST):
        for i in range(rounds):
            conv, key = f"race-{i}", f"old-{i}"
            started[key], release[key] = anyio.Event(), anyio.Event()
            old = await _enqueue(dsn, schema, conv, key)
            olds.append(old.id)
            with anyio.fail_after(10):
                await started[key].wait()
            new: list[runrow.Run] = []

            async def interrupt(conv: str = conv, i: int = i, sink: list[runrow.Run] = new) -> None:
                sink.append(await _enqueue(dsn, schema, conv, f"new-{i}", on_busy="interrupt"))

            async with anyio.create_task_group() as tg:
                # Vary who goes first: the agent returning, the interrupt, or both at once.
                if i % 3 == 0:
                    release[key].set()
                    tg.start_soon(interrupt)
                elif i % 3 == 1:
                    tg.start_soon(interrupt)
                    await anyio.sleep(0)
                    release[key].set()
                else:
                    tg.start_soon(interrupt)
                    tg.start_soon(_set_later, release[key], 0.002 * (i % 5))
            (fresh,) = new
            await wait_for(lambda fresh=fresh: _ended(conn, schema, fresh.id), timeout=10, what=f"round {i}")
            old_row = await run_row(conn, schema, old.id)
            new_row = await run_row(conn, schema, fresh.id)
            assert old_row["status"] in ("completed", "cancelled"), old_row
            assert new_row["status"] == "completed", new_row
            assert new_row["started_at"] >= old_row["finished_at"]  # the new turn ran after
            for rid in (old.id, fresh.id):
                await assert_journal_sound(conn, schema, rid)  # exactly one terminal each
    assert len(calls) == len(set(calls)) == 2 * rounds  # nothing ran twice
    cur = await conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE type = 'complete'").format(table(schema, "run_event"))
    )
    assert (await cur.fetchone())[0] == 2 * rounds  # type: ignore[index]
    outcomes = {(await run_row(conn, schema, rid))["status"] for rid in olds}
    assert outcomes <= {"completed", "cancelled"}


async def _set_later(event: anyio.Event, delay: float) -> None:
    await anyio.sleep(delay)
    event.set()


async def _ended(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID) -> bool:
    return any(t == "complete" for _, t, _ in await events(conn, schema, run_id))
