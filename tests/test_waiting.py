"""Human in the loop: a run parks to wait for a person's input, and resumes from it.

The run is `waiting` with no worker, lease or slot; its conversation stays busy;
provide_input records the answer and queues the same run again; the agent replays to
the wait (recorded steps return, earlier emits are dropped) and goes on; the journal
is one gap-free stream across the pause. A stop cancels a waiting run at once, and a
wait's timeout ends it `expired`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._engine.steps import MAX_STEP_BYTES
from runrow._gateway import endings
from runrow._names import Channels

from . import manual
from .helpers import assert_journal_sound, events, is_terminal, rows, run_row, status_of, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.2, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}


class Calls:
    """Counts the real calls of the steps (in process: the test's own list)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def do(self, name: str) -> str:
        self.names.append(name)
        return name


def approval_agent(calls: Calls, *, timeout: float | None = None) -> Any:
    async def agent(run: runrow.RunContext) -> None:
        await run.text("let me check. ")
        await run.emit({"type": "tool_call_started", "tool_call_id": "t1", "name": "send"})
        planned = await run.step("plan", calls.do, "plan")
        value = await run.wait_for_input("approve:t1", {"kind": "approval", "plan": planned}, timeout=timeout)
        await run.emit({"type": "tool_call_finished", "tool_call_id": "t1", "ok": value["approved"]})
        await run.step("send", calls.do, "send")
        await run.text(f"done: {value['approved']}")

    return agent


async def _is(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID, status: str) -> bool:
    return await status_of(conn, schema, run_id) == status


async def _waiting(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID) -> bool:
    return await _is(conn, schema, run_id, "waiting")


async def test_a_run_parks_and_resumes_with_the_value_without_repeating_anything(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    calls = Calls()
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="send it")
    async with runrow.Dispatcher(dsn, approval_agent(calls), schema=schema, **FAST) as d:
        await wait_for(lambda: _waiting(conn, schema, run.id), what="the run to wait")
        # Parked: no worker holds it, no slot, no lease; the journal ends with the request.
        await wait_for(lambda: d.in_flight == [], what="the parked run let go")
        assert d.get_stats()["parked"] == 1
        evs = await events(conn, schema, run.id)
        assert evs[-1][1] == "input_requested"
        assert evs[-1][2] == {
            "key": "approve:t1",
            "request": {"kind": "approval", "plan": "plan"},
            "expires_at": None,
        }
        (pending,) = await runrow.waiting_inputs(dsn, schema=schema)
        assert (pending.run_id, pending.key, pending.request) == (run.id, "approve:t1", evs[-1][2]["request"])
        assert pending.expires_at is None
        info = await runrow.get_run(dsn, run.id, schema=schema)
        assert info.status == "waiting" and not info.terminal and info.resumes == 0
        assert await runrow.provide_input(dsn, run.id, "approve:t1", {"approved": True}, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the resumed run to end")
    assert await status_of(conn, schema, run.id) == "completed"
    assert calls.names == ["plan", "send"]  # the step before the wait was replayed, not run again
    evs = await assert_journal_sound(conn, schema, run.id)
    types = [t for _, t, _ in evs]
    assert types.count("input_requested") == 1 and types.count("input_provided") == 1
    assert types.count("tool_call_started") == 1 and types.count("tool_call_finished") == 1
    text = "".join(p["delta"] for _, t, p in evs if t == "content_delta")
    assert text == "let me check. done: True"  # nothing streamed twice
    provided = next(p for _, t, p in evs if t == "input_provided")
    assert provided == {"key": "approve:t1", "value": {"approved": True}}
    assert (await runrow.get_run(dsn, run.id, schema=schema)).resumes == 1
    # What it said before the pause is one message, what it said after another.
    said = [m.content for m in await runrow.transcript(dsn, "c", schema=schema) if m.role == "assistant"]
    assert said == ["let me check. ", "done: True"]


async def test_provide_input_is_idempotent_and_typed_when_the_run_does_not_wait(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    calls = Calls()
    gate = anyio.Event()

    async def slow_then_approval(run: runrow.RunContext) -> None:
        await gate.wait()
        await approval_agent(calls)(run)

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    # Not waiting yet (queued): refused, and nothing changes.
    with pytest.raises(runrow.NotWaitingForInput) as queued:
        await runrow.provide_input(dsn, run.id, "approve:t1", {"approved": True}, schema=schema)
    assert (queued.value.status, queued.value.key, queued.value.run_id) == ("queued", "approve:t1", run.id)
    with pytest.raises(runrow.RunNotFound):
        await runrow.provide_input(dsn, uuid.uuid4(), "approve:t1", 1, schema=schema)
    with pytest.raises(runrow.InvalidInput):
        await runrow.provide_input(dsn, run.id, "", 1, schema=schema)
    with pytest.raises(runrow.InvalidInput):
        await runrow.provide_input(dsn, run.id, "approve:t1", {1, 2}, schema=schema)
    with pytest.raises(runrow.InvalidInput):
        await runrow.provide_input(dsn, run.id, "approve:t1", "x" * (MAX_STEP_BYTES + 1), schema=schema)
    async with runrow.Dispatcher(dsn, slow_then_approval, schema=schema, **FAST):
        await wait_for(lambda: status_of(conn, schema, run.id), what="a status")
        gate.set()
        await wait_for(lambda: _waiting(conn, schema, run.id), what="the run to wait")
        with pytest.raises(runrow.NotWaitingForInput) as other:
            await runrow.provide_input(dsn, run.id, "another-key", True, schema=schema)
        assert other.value.status == "waiting"
        # The answer, then the same answer again (a client's retry): recorded once.
        assert (
            await runrow.provide_input(dsn, run.id, "approve:t1", {"approved": False}, schema=schema) is True
        )
        assert (
            await runrow.provide_input(dsn, run.id, "approve:t1", {"approved": False}, schema=schema) is False
        )
        with pytest.raises(runrow.NotWaitingForInput):
            await runrow.provide_input(dsn, run.id, "approve:t1", {"approved": True}, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run to end")
    assert await status_of(conn, schema, run.id) == "completed"
    evs = await assert_journal_sound(conn, schema, run.id)
    assert [t for _, t, _ in evs].count("input_provided") == 1
    assert "done: False" in "".join(p.get("delta", "") for _, t, p in evs if t == "content_delta")
    # Finished: a late answer is refused with the run's status.
    with pytest.raises(runrow.NotWaitingForInput) as late:
        await runrow.provide_input(dsn, run.id, "approve:t1", {"approved": True}, schema=schema)
    assert late.value.status == "completed"


async def test_later_turns_of_the_conversation_wait_behind_a_waiting_run(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    calls = Calls()
    order: list[Any] = []

    async def agent(run: runrow.RunContext) -> None:
        order.append(run.content)
        if run.content == "first":
            await approval_agent(calls)(run)

    first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="first")
    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=4, **FAST) as d:
        await wait_for(lambda: _waiting(conn, schema, first.id), what="the first turn to wait")
        second = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="second")
        other = await runrow.enqueue(dsn, schema=schema, conversation_id="o", user_id="u", content="other")
        # Another conversation runs; this one's second turn does not, for as long as the first waits.
        await wait_for(lambda: is_terminal(conn, schema, other.id), what="the other conversation's turn")
        # A negative check, so fixed waits: three claim ticks after the other turn's wake.
        for _ in range(3):
            await anyio.sleep(FAST["poll"])
            assert await status_of(conn, schema, second.id) == "queued"
        assert d.get_stats()["parked"] == 1
        # The schema refuses a second active turn outright, whatever a claim would try.
        with pytest.raises(psycopg.errors.UniqueViolation):
            await conn.execute(
                sql.SQL(
                    "UPDATE {} SET status = 'running', claim_token = gen_random_uuid(), "
                    "claim_expires_at = now() + interval '1 minute', started_at = now() WHERE id = %s"
                ).format(table(schema, "agent_run")),
                (second.id,),
            )
        await runrow.provide_input(dsn, first.id, "approve:t1", {"approved": True}, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, second.id), what="the second turn")
    assert await status_of(conn, schema, first.id) == "completed"
    # The first turn ran twice (its replay), the second only after it finished.
    assert order == ["first", "other", "first", "second"]
    firsts = await run_row(conn, schema, first.id)
    seconds = await run_row(conn, schema, second.id)
    assert seconds["started_at"] >= firsts["finished_at"]


async def test_stopping_a_waiting_run_cancels_it_at_once_and_the_next_turn_runs(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    calls = Calls()

    async def agent(run: runrow.RunContext) -> None:
        if run.content == "first":
            await approval_agent(calls)(run)

    first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="first")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        await wait_for(lambda: _waiting(conn, schema, first.id), what="the first turn to wait")
        second = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="second")
        stopped = await runrow.cancel_run(dsn, first.id, schema=schema)
        assert stopped.cancelled == [first.id] and stopped.drafts == [] and not stopped.cancel_requested
        assert await status_of(conn, schema, first.id) == "cancelled"  # at once: no worker involved
        await wait_for(lambda: is_terminal(conn, schema, second.id), what="the next turn to run")
    evs = await assert_journal_sound(conn, schema, first.id)
    assert evs[-1][1] == "complete" and evs[-1][2] == {"status": "cancelled", "reason": "stopped"}
    with pytest.raises(runrow.NotWaitingForInput) as late:
        await runrow.provide_input(dsn, first.id, "approve:t1", {"approved": True}, schema=schema)
    assert late.value.status == "cancelled"
    assert await runrow.waiting_inputs(dsn, schema=schema) == []


async def test_stopping_a_conversation_cancels_its_waiting_turn_and_queued_ones_together(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    calls = Calls()
    first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="first")
    async with runrow.Dispatcher(dsn, approval_agent(calls), schema=schema, **FAST):
        await wait_for(lambda: _waiting(conn, schema, first.id), what="the first turn to wait")
        second = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="second")
        result = await runrow.stop_conversation(dsn, "c", schema=schema)
    assert result.cancelled == [first.id, second.id]
    assert [d.run_id for d in result.drafts] == [second.id]  # only a turn never started is a draft
    for rid in (first.id, second.id):
        assert await status_of(conn, schema, rid) == "cancelled"
        await assert_journal_sound(conn, schema, rid)


async def test_a_wait_that_times_out_ends_the_run_expired(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    calls = Calls()
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    nxt = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="y")
    seen: list[Any] = []

    async def agent(run: runrow.RunContext) -> None:
        seen.append(run.content)
        if run.content == "x":
            await approval_agent(calls, timeout=0.5)(run)

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        await wait_for(lambda: _waiting(conn, schema, run.id), what="the run to wait")
        (pending,) = await runrow.waiting_inputs(dsn, run_id=run.id, schema=schema)
        assert pending.expires_at is not None
        evs = await events(conn, schema, run.id)
        assert evs[-1][2]["expires_at"] is not None
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the wait to expire")
        await wait_for(lambda: is_terminal(conn, schema, nxt.id), what="the next turn")
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "expired" and row["error"]["type"] == "input_expired"
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2]["status"] == "expired" and evs[-1][2]["reason"] == "input_expired"
    # The tool call announced before the wait never ran: it is not "uncertain".
    assert evs[-1][2]["uncertain_tool_calls"] == []
    with pytest.raises(runrow.NotWaitingForInput) as late:
        await runrow.provide_input(dsn, run.id, "approve:t1", {"approved": True}, schema=schema)
    assert late.value.status == "expired"
    assert seen == ["x", "y"]


async def test_a_park_that_meets_a_stop_already_asked_for_ends_cancelled(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A stop that commits between the agent's wait and its park: the park's write finds
    the flag and ends the run cancelled, its input_requested turned into that ending."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema)
    assert (await runrow.cancel_run(dsn, run.id, schema=schema)).cancel_requested == [run.id]
    park = endings.Ending(
        run_id=run.id,
        claim_token=claimed["claim_token"],
        status="waiting",
        error=None,
        partial=None,
        events=[(3, "input_requested", '{"key":"k","request":null}')],
        input_timeout=None,
    )
    landed = await endings.finalize(conn, schema, [park], channels=Channels.for_schema(schema))
    assert landed == {run.id: "cancelled"}  # what was recorded, not what was asked
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "cancelled" and row["finished_at"] is not None
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1] == (3, "complete", {"status": "cancelled", "reason": "stopped"})


async def test_a_resumed_replay_that_calls_another_input_fails_with_step_mismatch(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    passes: list[int] = []

    async def agent(run: runrow.RunContext) -> None:
        passes.append(run.resumes)
        # Not deterministic: the key depends on which pass this is.
        await run.wait_for_input(f"q{len(passes)}", "?")

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        await wait_for(lambda: _waiting(conn, schema, run.id), what="the run to wait")
        await runrow.provide_input(dsn, run.id, "q1", "a", schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run to end")
    row = await run_row(conn, schema, run.id)
    assert passes == [0, 1]
    assert row["status"] == "failed" and row["error"]["type"] == "StepMismatch"


async def test_waiting_inputs_lists_by_run_and_conversation(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    calls = Calls()
    a = await runrow.enqueue(dsn, schema=schema, conversation_id="a", user_id="u", content="x")
    b = await runrow.enqueue(dsn, schema=schema, conversation_id="b", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, approval_agent(calls), schema=schema, **FAST):
        for r in (a, b):
            await wait_for(lambda r=r: _waiting(conn, schema, r.id), what="both runs to wait")
        assert {p.run_id for p in await runrow.waiting_inputs(dsn, schema=schema)} == {a.id, b.id}
        assert [p.run_id for p in await runrow.waiting_inputs(dsn, conversation_id="b", schema=schema)] == [
            b.id
        ]
        assert [p.run_id for p in await runrow.waiting_inputs(dsn, run_id=a.id, schema=schema)] == [a.id]
        assert len(await runrow.waiting_inputs(dsn, limit=1, schema=schema)) == 1
        with pytest.raises(runrow.InvalidInput):
            await runrow.waiting_inputs(dsn, limit=0, schema=schema)
        assert {r.id for r in await runrow.list_runs(dsn, status="waiting", schema=schema)} == {a.id, b.id}
        assert (await runrow.queue_stats(dsn, schema=schema)).by_status.get("waiting") == 2
    assert calls.names == ["plan", "plan"]
    got = await rows(
        conn, sql.SQL("SELECT count(*) FROM {} WHERE status = 'waiting'").format(table(schema, "run_step"))
    )
    assert got[0][0] == 2


async def test_the_cli_lists_waiting_inputs_and_provides_one(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    from .test_cli import cli

    calls = Calls()
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    db = ("--database-url", dsn, "--schema", schema)
    async with runrow.Dispatcher(dsn, approval_agent(calls), schema=schema, **FAST):
        await wait_for(lambda: _waiting(conn, schema, run.id), what="the run to wait")
        listed = await anyio.to_thread.run_sync(lambda: cli("runs", "waiting", *db))
        assert listed.returncode == 0, listed.stderr
        assert (
            str(run.id) in listed.stdout and "approve:t1" in listed.stdout and '"approval"' in listed.stdout
        )
        as_json = await anyio.to_thread.run_sync(lambda: cli("runs", "waiting", "--json", *db))
        assert json.loads(as_json.stdout)[0]["key"] == "approve:t1"
        by_status = await anyio.to_thread.run_sync(lambda: cli("runs", "list", "--status", "waiting", *db))
        assert str(run.id) in by_status.stdout and "waiting" in by_status.stdout
        not_json = await anyio.to_thread.run_sync(
            lambda: cli("runs", "input", str(run.id), "approve:t1", "yes", *db)
        )
        assert not_json.returncode != 0 and "is not JSON" in not_json.stderr
        wrong = await anyio.to_thread.run_sync(lambda: cli("runs", "input", str(run.id), "nope", "true", *db))
        assert wrong.returncode != 0 and "not waiting for input 'nope'" in wrong.stderr
        given = await anyio.to_thread.run_sync(
            lambda: cli("runs", "input", str(run.id), "approve:t1", '{"approved": true}', *db)
        )
        assert given.returncode == 0, given.stderr
        assert "recorded" in given.stdout
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run to end")
    assert await status_of(conn, schema, run.id) == "completed"
    again = await anyio.to_thread.run_sync(
        lambda: cli("runs", "input", str(run.id), "approve:t1", '{"approved": true}', *db)
    )
    assert again.returncode == 0 and "already recorded" in again.stdout


async def test_queue_metrics_count_waiting_runs_apart_from_running_ones(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    from prometheus_client import CollectorRegistry

    from runrow.metrics import QueueCollector, with_metrics

    from .test_metrics import _not_found, scrape, value

    calls, gate = Calls(), anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        if run.content == "wait":
            await approval_agent(calls)(run)
        else:
            await gate.wait()

    waits = await runrow.enqueue(
        dsn, schema=schema, conversation_id="a", user_id="u", content="wait", tenant_id="t"
    )
    runs = await runrow.enqueue(
        dsn, schema=schema, conversation_id="b", user_id="u", content="run", tenant_id="t"
    )
    registry = CollectorRegistry()
    app = with_metrics(_not_found, registry=registry)
    collector = QueueCollector(dsn, schema=schema, interval=0.05, registry=registry)
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST), collector:
        await wait_for(lambda: _waiting(conn, schema, waits.id), what="one run to wait")
        await wait_for(lambda: _is(conn, schema, runs.id, "running"), what="the other to run")
        seen = collector.refreshes
        await wait_for(lambda: collector.refreshes >= seen + 2, what="fresh metrics")
        found = await scrape(app)
        assert value(found, "runrow_runs_waiting", tenant="t") == 1
        assert value(found, "runrow_runs_running", tenant="t") == 1
        assert value(found, "runrow_queue_depth", tenant="t") == 0
        gate.set()


async def test_a_retry_of_an_expired_run_asks_again_and_replays_the_steps_before(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    calls = Calls()
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, approval_agent(calls, timeout=0.3), schema=schema, **FAST):
        await wait_for(lambda: _is(conn, schema, run.id, "expired"), what="the wait to expire")
        again = await runrow.retry_run(dsn, run.id, schema=schema)
        await wait_for(lambda: _waiting(conn, schema, again.id), what="the retry to ask again")
        (pending,) = await runrow.waiting_inputs(dsn, schema=schema)
        assert (pending.run_id, pending.key) == (again.id, "approve:t1")
        assert await runrow.provide_input(dsn, again.id, "approve:t1", {"approved": True}, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, again.id), what="the retry to end")
    assert await status_of(conn, schema, again.id) == "completed"
    assert calls.names == ["plan", "send"]  # the plan step was recorded by the expired attempt
    await assert_journal_sound(conn, schema, again.id)


async def test_a_run_resumed_before_its_park_was_acknowledged_keeps_its_new_claim(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The park's answer is handled late (as after a lost answer, read back later) while
    the same worker already claimed the resumed run: letting go of the old claim must not
    drop the new one (it would get no heartbeat and be reaped mid-flight)."""
    import asyncio

    from runrow._engine import executor

    ended = executor.Executor._ended
    handled: list[bool] = []  # an answer handled (late): the first is the park's

    def late(self: executor.Executor, *args: Any) -> None:
        def now() -> None:
            ended(self, *args)
            handled.append(True)

        asyncio.get_running_loop().call_later(1.0, now)

    monkeypatch.setattr(executor.Executor, "_ended", late)
    resumed = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        value = await run.wait_for_input("k", "q")
        resumed.set()
        await wait_for(lambda: handled, what="the park's late answer")
        # A negative check, so a fixed wait: had that answer dropped this claim, its
        # lease would lapse and the reaper (every reap_interval) would end it by now.
        await anyio.sleep(FAST["lease"] + FAST["grace"] + 5 * FAST["reap_interval"])
        await run.text(f"after {value}")

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST) as d:
        await wait_for(lambda: _waiting(conn, schema, run.id), what="the run to wait")
        assert await runrow.provide_input(dsn, run.id, "k", 1, schema=schema)
        await wait_for(resumed.is_set, what="the resumed run")
        await wait_for(lambda: is_terminal(conn, schema, run.id), timeout=20, what="the run to end")
        assert d.get_stats()["reaped"] == 0 and d.get_stats()["lost"] == 0
    assert await status_of(conn, schema, run.id) == "completed"


async def test_a_wait_under_a_key_already_used_in_the_turn_is_refused(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """provide_input names a wait by its key: a second question under the same key could
    take a client's repeated first answer as its own, so the agent is told at once."""

    async def agent(run: runrow.RunContext) -> None:
        first = await run.wait_for_input("k", "first question")
        await run.write_message(f"first: {first}")
        await run.wait_for_input("k", "second question")

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        await wait_for(lambda: _waiting(conn, schema, run.id), what="the first wait")
        assert await runrow.provide_input(dsn, run.id, "k", "yes", schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run to end")
        # The client's retry of its answer changes nothing.
        assert await runrow.provide_input(dsn, run.id, "k", "yes", schema=schema) is False
    row = await run_row(conn, schema, run.id)
    assert row["status"] == "failed" and row["error"]["type"] == "InvalidInput"
    assert "already used in this turn" in row["error"]["message"]


async def test_stopping_a_resumed_run_before_a_worker_takes_it_keeps_the_question(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Input queued the run again but no worker has claimed it: it had started, so a stop
    ends it like a waiting run (no draft: its question was answered in part)."""
    calls = Calls()
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, approval_agent(calls), schema=schema, **FAST):
        await wait_for(lambda: _waiting(conn, schema, run.id), what="the run to wait")
    assert await runrow.provide_input(dsn, run.id, "approve:t1", {"approved": True}, schema=schema)
    assert await status_of(conn, schema, run.id) == "queued"
    for stop in ("cancel_run", "stop_conversation"):
        result = await getattr(runrow, stop)(dsn, run.id if stop == "cancel_run" else "c", schema=schema)
        if stop == "cancel_run":
            assert result.cancelled == [run.id] and result.drafts == []
        else:
            assert result.noop
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2] == {"status": "cancelled", "reason": "stopped"}
    statuses = [m.status for m in await runrow.transcript(dsn, "c", schema=schema)]
    assert statuses == ["sent", "complete"]  # the question stays, with what was said before the pause


async def test_a_resumed_replay_reads_the_transcript_as_its_first_pass_did(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    seen: list[list[str]] = []

    async def agent(run: runrow.RunContext) -> None:
        await run.text("thinking. ")
        seen.append([m.role for m in await run.transcript()])
        await run.write_message("a note")
        seen.append([m.role for m in await run.transcript()])
        await run.text("more. ")  # the park keeps it as a message of its own
        await run.wait_for_input("k", "q")
        seen.append([m.role for m in await run.transcript()])

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        await wait_for(lambda: _waiting(conn, schema, run.id), what="the run to wait")
        assert await runrow.provide_input(dsn, run.id, "k", 1, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run to end")
    first_pass, replay = seen[:2], seen[2:4]
    assert first_pass == [["user"], ["user", "assistant"]]
    assert replay == first_pass  # not the note twice, nor the text the park saved
    assert seen[4] == ["user", "assistant", "assistant"]  # after the wait: everything


async def _answers(dsn: str, schema: str) -> list[tuple[object, str]]:
    """Conversation c's assistant messages: (content, status), in transcript order."""
    return [
        (m.content, m.status)
        for m in await runrow.transcript(dsn, "c", schema=schema)
        if m.role == "assistant"
    ]


@pytest.mark.parametrize("ended_by", ["stop", "expiry"])
async def test_text_streamed_before_a_wait_is_in_the_transcript_once_across_a_retry(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, ended_by: str
) -> None:
    """Issue #36 (6): the park keeps the text streamed before the wait as a message; the
    retry of a stopped or expired wait streams it again and parks at the same wait, and
    used to save it again, a second `complete` message. The park's message is the turn's
    message for that wait (one id across attempts): the retry finds it written."""
    calls = Calls()

    async def agent(run: runrow.RunContext) -> None:
        timeout = 0.3 if ended_by == "expiry" and run.attempt == 1 else None
        await approval_agent(calls, timeout=timeout)(run)

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        await wait_for(lambda: _waiting(conn, schema, run.id), what="the run to wait")
        if ended_by == "stop":
            await runrow.cancel_run(dsn, run.id, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the first attempt to end")
        again = await runrow.retry_run(dsn, run.id, schema=schema)
        await wait_for(lambda: _waiting(conn, schema, again.id), what="the retry to ask again")
        said = [m.content for m in await runrow.transcript(dsn, "c", schema=schema) if m.role == "assistant"]
        assert said == ["let me check. "]
        assert await runrow.provide_input(dsn, again.id, "approve:t1", {"approved": True}, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, again.id), what="the retry to end")
    assert await status_of(conn, schema, again.id) == "completed"
    assert await _answers(dsn, schema) == [("let me check. ", "complete"), ("done: True", "complete")]


async def test_a_retry_that_replays_an_answered_wait_does_not_save_the_text_before_it_again(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The first attempt parked (keeping its text so far), was answered, and failed after
    the wait; the retry's wait returns the recorded answer without parking: the text it
    streamed before the wait is the park's message, not part of its own answer."""
    calls = Calls()

    async def agent(run: runrow.RunContext) -> None:
        await run.text("let me check. ")
        value = await run.wait_for_input("approve:t1", "?")
        if run.attempt == 1:
            raise RuntimeError("the model fell over after the approval")
        await run.step("send", calls.do, "send")
        await run.text(f"done: {value}")

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        await wait_for(lambda: _waiting(conn, schema, run.id), what="the run to wait")
        assert await runrow.provide_input(dsn, run.id, "approve:t1", "yes", schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the first attempt to fail")
        again = await runrow.retry_run(dsn, run.id, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, again.id), what="the retry to end")
    assert await status_of(conn, schema, again.id) == "completed"
    assert await _answers(dsn, schema) == [("let me check. ", "complete"), ("done: yes", "complete")]
    assert calls.names == ["send"]
