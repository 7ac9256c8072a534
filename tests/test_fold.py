"""With ``claim_with_endings=True``, a run's ending and the claim for the slot it frees
share one transaction (#24); by default they do not (the claim loop claims at once).

Proven on the database's own record: a trigger logs the transaction id of every status
change, so "one transaction" is read off the server, not inferred from timing. Then the
faults the fold must survive: the claim refused (the ending still lands), the
connection cut between the ending and the claim, an ending whose fence matches nothing,
and a drain while runs end with work queued.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import assert_journal_sound, enqueue_turn, status_of, table, wait_for

pytestmark = pytest.mark.anyio

FAST: dict[str, Any] = {
    "poll": 0.5,
    "heartbeat": 0.2,
    "lease": 2.0,
    "grace": 1.0,
    "reap_interval": 0.2,
    "claim_with_endings": True,
}


async def noop(run: runrow.RunContext) -> None:
    return None


async def log_status_changes(conn: psycopg.AsyncConnection, schema: str) -> None:
    """status_log(run_id, status, tx): one row per status change of a run, with the
    transaction that made it."""
    await conn.execute(
        sql.SQL(
            """
            CREATE TABLE {log} (run_id uuid, status text, tx bigint, at timestamptz DEFAULT clock_timestamp());
            CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO {log} (run_id, status, tx) VALUES (NEW.id, NEW.status, txid_current());
                RETURN NEW;
            END $$;
            CREATE TRIGGER log_status AFTER UPDATE OF status ON {runs}
                FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION {fn}();
            """
        ).format(
            log=table(schema, "status_log"), fn=table(schema, "log_status"), runs=table(schema, "agent_run")
        )
    )


async def status_txs(conn: psycopg.AsyncConnection, schema: str, run_id: Any) -> dict[str, int]:
    cur = await conn.execute(
        sql.SQL("SELECT status, tx FROM {} WHERE run_id = %s").format(table(schema, "status_log")), (run_id,)
    )
    return {status: tx for status, tx in await cur.fetchall()}


async def test_a_turns_ending_and_the_next_turns_claim_commit_together(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Five turns of one conversation, queued before the worker starts: each turn after
    the first is claimed in the very transaction that ends the turn before it."""
    await log_status_changes(conn, schema)
    turns = [await enqueue_turn(dsn, schema, "c") for _ in range(5)]
    async with runrow.Dispatcher(dsn, noop, schema=schema, concurrency=1, **FAST):
        await wait_for(lambda: _all_done(conn, schema, turns), what="five turns done")
    txs = [await status_txs(conn, schema, t.id) for t in turns]
    for before, after in itertools.pairwise(txs):
        assert before["completed"] == after["running"], (before, after)
    for t in turns:
        await assert_journal_sound(conn, schema, t.id)


async def test_by_default_the_next_claim_is_its_own_transaction_and_no_poll_is_waited(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The default: a freed slot goes to the claim loop at once, so each turn is claimed in
    a transaction of its own, never the one that ends the turn before it. The claim loop
    is woken by the ending itself, not by a NOTIFY or the poll tick: with notifications
    off and a 60 s poll, five turns of one conversation still run back to back."""
    await log_status_changes(conn, schema)
    turns = [await enqueue_turn(dsn, schema, "c") for _ in range(5)]
    slow_poll = {**FAST, "poll": 60.0, "reap_interval": 0.2}
    del slow_poll["claim_with_endings"]
    async with runrow.Dispatcher(
        dsn, noop, schema=schema, concurrency=1, notifications=False, **slow_poll
    ) as d:
        assert d.settings.claim_with_endings is False
        await wait_for(lambda: _all_done(conn, schema, turns), timeout=10.0, what="five turns done")
    txs = [await status_txs(conn, schema, t.id) for t in turns]
    for before, after in itertools.pairwise(txs):
        assert before["completed"] != after["running"], (before, after)
    for t in turns:
        await assert_journal_sound(conn, schema, t.id)


async def test_a_refused_claim_does_not_cost_the_ending(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The claim made with an ending is refused (a trigger raises while the poison run is
    claimed, until the test lets it through): the ending is written again alone and
    lands; the refused run is claimed later by the claim loop and completes too."""
    await log_status_changes(conn, schema)
    await conn.execute(
        sql.SQL(
            """
            CREATE TABLE {flag} (n int);
            CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.status = 'running' AND NEW.conversation_id = 'poison'
                   AND NOT EXISTS (SELECT 1 FROM {flag}) THEN
                    RAISE EXCEPTION 'claim refused';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_claim BEFORE UPDATE OF status ON {runs}
                FOR EACH ROW EXECUTE FUNCTION {fn}();
            """
        ).format(
            flag=table(schema, "refused"), fn=table(schema, "refuse_once"), runs=table(schema, "agent_run")
        )
    )
    gate = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        if run.conversation_id == "first":
            await gate.wait()

    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=1, **FAST) as d:
        first = await enqueue_turn(dsn, schema, "first")
        await wait_for(lambda: _status_is(conn, schema, first.id, "running"), what="the first run claimed")
        poison = await enqueue_turn(dsn, schema, "poison")
        gate.set()  # the first run ends; its ending carries the claim of the poison run
        await wait_for(lambda: _status_is(conn, schema, first.id, "completed"), what="the first ending")
        # Let the claim loop through now: the refusal happened once, which is the point.
        await conn.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(table(schema, "refused")))
        await wait_for(
            lambda: _status_is(conn, schema, poison.id, "completed"), timeout=15, what="the refused run"
        )
        await wait_for(lambda: not d.in_flight, what="the runs let go (counted)")
        stats = d.get_stats()
    assert stats["completed"] == 2 and stats["lost"] == 0, stats
    # The first ending and the poison run's claim did not commit together.
    assert (await status_txs(conn, schema, first.id))["completed"] != (
        await status_txs(conn, schema, poison.id)
    )["running"]
    await assert_journal_sound(conn, schema, first.id)
    await assert_journal_sound(conn, schema, poison.id)


async def test_a_connection_cut_between_the_ending_and_the_claim(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The ending writer's connection is terminated while its claim (after the ending,
    in the same transaction) sleeps in a trigger: neither landed; the ending is retried
    and lands, the next run is claimed again and runs once."""
    await conn.execute(
        sql.SQL(
            """
            CREATE TABLE {gate} (closed boolean);
            INSERT INTO {gate} VALUES (true);
            CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.status = 'running' AND NEW.conversation_id = 'slow-claim'
                   AND EXISTS (SELECT 1 FROM {gate}) THEN
                    PERFORM pg_sleep(30);
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER slow_claim BEFORE UPDATE OF status ON {runs}
                FOR EACH ROW EXECUTE FUNCTION {fn}();
            """
        ).format(
            fn=table(schema, "slow_claim"), runs=table(schema, "agent_run"), gate=table(schema, "slow_gate")
        )
    )
    gate = anyio.Event()
    started: list[str] = []

    async def agent(run: runrow.RunContext) -> None:
        started.append(run.conversation_id)
        if run.conversation_id == "first":
            await gate.wait()

    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=1, **FAST) as d:
        first = await enqueue_turn(dsn, schema, "first")
        await wait_for(lambda: _status_is(conn, schema, first.id, "running"), what="the first run claimed")
        second = await enqueue_turn(dsn, schema, "slow-claim")
        gate.set()
        sleeper = await wait_for(
            lambda: _sleeping_backend(conn, schema), timeout=10, what="the claim asleep in its trigger"
        )
        assert await status_of(conn, schema, first.id) == "running"  # the ending waits with the claim
        # The retried claim must not sleep again. (A row, not DROP TRIGGER: the DDL would
        # wait for the sleeper's lock on agent_run, until a statement timeout ended it.)
        await conn.execute(sql.SQL("DELETE FROM {}").format(table(schema, "slow_gate")))
        await conn.execute("SELECT pg_terminate_backend(%s)", (sleeper,))
        await wait_for(
            lambda: _status_is(conn, schema, first.id, "completed"), timeout=15, what="the first ending"
        )
        await wait_for(
            lambda: _status_is(conn, schema, second.id, "completed"), timeout=15, what="the second run"
        )
        await wait_for(lambda: not d.in_flight, what="the runs let go (counted)")
        stats = d.get_stats()
    assert started == ["first", "slow-claim"], started
    assert stats["completed"] == 2, stats
    await assert_journal_sound(conn, schema, first.id)
    await assert_journal_sound(conn, schema, second.id)


async def test_an_ending_whose_fence_matches_nothing_still_frees_its_slot(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The first run's claim is taken from it mid-run (its token changed): its ending
    matches nothing, and the claim that went with it still starts the next run."""
    gate = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        if run.conversation_id == "first":
            await gate.wait()

    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=1, **{**FAST, "lease": 30.0}) as d:
        first = await enqueue_turn(dsn, schema, "first")
        await wait_for(lambda: _status_is(conn, schema, first.id, "running"), what="the first run claimed")
        second = await enqueue_turn(dsn, schema, "second")
        await conn.execute(
            sql.SQL("UPDATE {} SET claim_token = %s WHERE id = %s").format(table(schema, "agent_run")),
            (uuid.uuid4(), first.id),
        )
        gate.set()
        await wait_for(
            lambda: _status_is(conn, schema, second.id, "completed"), timeout=15, what="the next run"
        )
        await wait_for(lambda: not d.in_flight, what="the runs let go (counted)")
        stats = d.get_stats()
    assert await status_of(conn, schema, first.id) == "running"  # not ours to end any more
    assert stats["completed"] == 1 and stats["lost"] == 1, stats


async def test_a_drain_while_runs_end_leaves_no_run_claimed_and_unrun(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Eight slots turning over short runs with 300 queued; stop() mid-stream: every run
    claimed was run to an ending or listed, none is left running, the rest stay queued."""
    ran: set[str] = set()

    async def agent(run: runrow.RunContext) -> None:
        ran.add(str(run.run_id))
        await anyio.sleep(0.002)

    ids = [(await enqueue_turn(dsn, schema, f"c{i}")).id for i in range(300)]
    d = runrow.Dispatcher(dsn, agent, schema=schema, concurrency=8, **FAST)
    async with d:
        await wait_for(lambda: d.get_stats()["completed"] >= 40, timeout=20, what="runs turning over")
        report = await d.stop(drain_timeout=5)
    cur = await conn.execute(
        sql.SQL("SELECT id::text, status FROM {} WHERE id = ANY(%s)").format(table(schema, "agent_run")),
        (ids,),
    )
    status = dict(await cur.fetchall())
    assert "running" not in status.values(), report
    assert {i for i, s in status.items() if s != "queued"} == ran
    assert not report.left_for_reaper, report
    assert any(s == "queued" for s in status.values())  # it stopped claiming mid-queue


async def _status_is(conn: psycopg.AsyncConnection, schema: str, run_id: Any, status: str) -> bool:
    return await status_of(conn, schema, run_id) == status


async def _all_done(conn: psycopg.AsyncConnection, schema: str, turns: list[Any]) -> bool:
    return all([await _status_is(conn, schema, t.id, "completed") for t in turns])


async def _sleeping_backend(conn: psycopg.AsyncConnection, schema: str) -> int | None:
    """The backend asleep in this test's trigger: its statement names this test's schema.
    (Another test's backend may still be asleep in a trigger of its own on the same
    server: a client that goes away does not wake a backend in pg_sleep.)"""
    cur = await conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND pid <> pg_backend_pid()"
        " AND strpos(query, %s) > 0",
        (f'"{schema}".',),
    )
    row = await cur.fetchone()
    return None if row is None else int(row[0])
