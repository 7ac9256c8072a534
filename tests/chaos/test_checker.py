"""The chaos checker is itself tested: each kind of violation, seeded by hand, is reported.

A clean database comes from real runs (a real Dispatcher, real tails, a real stop);
each test then breaks one thing the way a bug would and checks that exactly the
matching invariant fails.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._engine.reaper import reap_expired
from tests.chaos.checker import INVARIANTS, CheckResult, Transcript, check
from tests.chaos.schema import ident, install, record_side_effect, record_step_effect, stop_and_log

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator

pytestmark = pytest.mark.anyio

META = {"lease": 3.0, "heartbeat": 1.0, "grace": 2.0, "tick": 0.5, "slack": 1.5}


@dataclass
class World:
    dsn: str
    schema: str
    chaos: str
    conn: psycopg.AsyncConnection
    transcripts: list[Transcript]
    completed: list[uuid.UUID]

    async def check(self, transcripts: list[Transcript] | None = None) -> CheckResult:
        return await check(
            self.conn, self.schema, self.chaos, self.transcripts if transcripts is None else transcripts
        )

    async def execute(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        q = sql.SQL(query).format(
            run=ident(self.schema, "agent_run"),
            ev=ident(self.schema, "run_event"),
            run_step=ident(self.schema, "run_step"),
            c=sql.Identifier(self.chaos),
        )
        cur = await self.conn.execute(q, params)
        return await cur.fetchall() if cur.description else []

    async def enqueue(self, conversation_id: str) -> uuid.UUID:
        run = await runrow.enqueue(
            self.conn, conversation_id=conversation_id, user_id="u", content="hi", schema=self.schema
        )
        return run.id

    async def start(self, run_id: uuid.UUID, *, expires_in: float = 30.0) -> None:
        """What a claim does to the row (without the claim's guards)."""
        await self.execute(
            "UPDATE {run} SET status = 'running', claim_token = gen_random_uuid(), worker_id = 'w', "
            "started_at = now(), claim_expires_at = clock_timestamp() + make_interval(secs => %s) "
            "WHERE id = %s",
            (expires_in, run_id),
        )

    async def finish(self, run_id: uuid.UUID, status: str = "completed") -> None:
        """What a finalize does: the status and the one terminal event."""
        await self.execute(
            "UPDATE {run} SET status = %s, finished_at = now() WHERE id = %s", (status, run_id)
        )
        await self.execute(
            "INSERT INTO {ev} (run_id, seq, type, payload) SELECT %s, max(seq) + 1, 'complete', "
            "jsonb_build_object('status', %s::text) FROM {ev} WHERE run_id = %s",
            (run_id, status, run_id),
        )


async def _agent(run: runrow.RunContext) -> None:
    chaos = run.request["chaos"]
    execution = uuid.uuid4()
    async with await psycopg.AsyncConnection.connect(run.request["dsn"], autocommit=True) as conn:
        for step in range(2):
            await run.text(f"step {step} ")
            await record_side_effect(conn, chaos, run.run_id, step, execution, run.worker_id)
            await run.emit({"type": "step_done", "step": step})


async def _follow(dsn: str, schema: str, run_id: uuid.UUID, *, cut_after: int | None = None) -> Transcript:
    tr = Transcript(str(run_id))
    cursor = 0
    while not tr.finished:
        events = runrow.tail(dsn, run_id, from_seq=cursor, schema=schema, poll=0.05)
        async with contextlib.aclosing(cast("AsyncGenerator[runrow.Event, None]", events)) as ev_iter:
            async for ev in ev_iter:
                if ev.keepalive:
                    continue
                tr.events.append((ev.seq, ev.type, ev.payload))
                cursor = ev.seq
                if ev.terminal:
                    tr.finished = True
                    break
                if cut_after is not None and ev.seq == cut_after:
                    cut_after = None
                    tr.resumes += 1
                    break  # disconnect; resume from the cursor
    return tr


@pytest.fixture
async def world(dsn: str, schema: str) -> AsyncIterator[World]:
    chaos = f"{schema}_chaos"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await install(conn, schema, chaos, META)
        try:
            w = World(dsn, schema, chaos, conn, [], [])
            ids = []
            for conv in ("a", "a", "b"):
                run = await runrow.enqueue(
                    conn,
                    conversation_id=conv,
                    user_id="u",
                    content="hi",
                    request={"chaos": chaos, "dsn": dsn},
                    schema=schema,
                )
                ids.append(run.id)
            stopped = [await w.enqueue("s"), await w.enqueue("s")]
            result = await stop_and_log(conn, schema, chaos, "s")
            assert sorted(result.cancelled) == sorted(stopped)
            async with runrow.Dispatcher(
                dsn, _agent, schema=schema, poll=0.1, lease=3, heartbeat=1, grace=2, notifications=False
            ):
                with anyio.fail_after(20):
                    while (
                        await w.execute("SELECT count(*) FROM {run} WHERE status IN ('queued', 'running')")
                    )[0][0]:
                        await anyio.sleep(0.05)
            w.completed = ids
            w.transcripts = [await _follow(dsn, schema, ids[0], cut_after=3)]
            w.transcripts += [await _follow(dsn, schema, rid) for rid in [*ids[1:], *stopped]]
            yield w
        finally:
            await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(chaos)))


def failing(result: CheckResult) -> set[str]:
    return {name for name, ok in result.invariants.items() if not ok}


async def test_clean_database_passes(world: World) -> None:
    result = await world.check()
    assert result.ok, result.violations
    assert list(result.invariants) == list(INVARIANTS)
    assert result.counts["runs"] == 5
    assert result.counts["by_status"] == {"cancelled": 2, "completed": 3}
    assert result.counts["tails_resumed"] == 1
    assert result.counts["side_effects"] == 6
    assert result.counts["stops"] == 1


async def test_run_left_unfinished(world: World) -> None:
    await world.enqueue("late")
    result = await world.check()
    assert "exactly_one_terminal_state" in failing(result)
    assert "ended queued" in result.violations["exactly_one_terminal_state"][0]


async def test_terminal_state_changed(world: World) -> None:
    rid = world.completed[1]
    await world.execute("UPDATE {run} SET status = 'failed' WHERE id = %s", (rid,))
    result = await world.check()
    assert "terminal_states_never_changed" in failing(result)
    assert f"run {rid}: completed -> failed" in result.violations["terminal_states_never_changed"][0]
    # The journal's complete event no longer matches the row either.
    assert "journal_gap_free_one_complete" in failing(result)


async def test_terminal_error_rewritten(world: World) -> None:
    await world.execute("UPDATE {run} SET error = '{{\"x\": 1}}' WHERE id = %s", (world.completed[0],))
    assert failing(await world.check()) == {"terminal_states_never_changed"}


async def test_second_terminal_transition(world: World) -> None:
    rid = world.completed[2]
    await world.execute(
        "INSERT INTO {c}.transition (run_id, conversation_id, queue_order, old_status, new_status) "
        "SELECT id, conversation_id, queue_order, 'running', 'failed' FROM {run} WHERE id = %s",
        (rid,),
    )
    result = await world.check()
    assert "exactly_one_terminal_state" in failing(result)


async def test_side_effect_executed_twice(world: World) -> None:
    rid = world.completed[0]
    await record_side_effect(world.conn, world.chaos, rid, 1, uuid.uuid4(), "other-worker")
    result = await world.check()
    assert failing(result) == {"no_side_effect_twice"}
    assert "executed 2 times" in result.violations["no_side_effect_twice"][0]


async def test_same_execution_resent_is_not_a_repeat(world: World) -> None:
    rid, execution = world.completed[0], uuid.uuid4()
    await record_side_effect(world.conn, world.chaos, rid, 7, execution, "w")
    await record_side_effect(world.conn, world.chaos, rid, 7, execution, "w")
    assert (await world.check()).ok


async def test_durable_step_run_again_by_a_retry(world: World) -> None:
    """A turn's durable step counted once per turn: a second execution, by another
    attempt of the turn, is the recorded-step invariant's violation, and only its."""
    turn, rid = uuid.uuid4(), world.completed[0]
    await record_step_effect(world.conn, world.chaos, turn, 0, uuid.uuid4(), rid)
    assert (await world.check()).ok
    await record_step_effect(world.conn, world.chaos, turn, 0, uuid.uuid4(), uuid.uuid4())
    result = await world.check()
    assert failing(result) == {"recorded_steps_never_repeat"}
    assert "executed 2 times" in result.violations["recorded_steps_never_repeat"][0]


async def test_run_claimed_twice(world: World) -> None:
    rid = world.completed[0]
    await world.execute(
        "INSERT INTO {c}.transition (run_id, conversation_id, queue_order, old_status, new_status) "
        "SELECT id, conversation_id, queue_order, 'queued', 'running' FROM {run} WHERE id = %s",
        (rid,),
    )
    result = await world.check()
    assert "no_side_effect_twice" in failing(result)
    assert "claimed 2 times" in result.violations["no_side_effect_twice"][0]


async def test_two_running_turns_in_one_conversation(world: World) -> None:
    # Only a missing unique index lets this happen; drop it to seed the violation.
    await world.conn.execute(
        sql.SQL("DROP INDEX {}").format(ident(world.schema, "agent_run_one_turn_per_conversation"))
    )
    first, second = await world.enqueue("x"), await world.enqueue("x")
    await world.start(first)
    await world.start(second)
    await world.finish(first)
    await world.finish(second)
    result = await world.check()
    assert failing(result) == {"one_running_per_conversation"}
    assert f"run {second} started" in result.violations["one_running_per_conversation"][0]


async def test_turns_out_of_order(world: World) -> None:
    first, second = await world.enqueue("x"), await world.enqueue("x")
    await world.start(second)
    await world.finish(second)
    await world.start(first)
    await world.finish(first)
    result = await world.check()
    assert failing(result) == {"turns_in_order"}
    assert f"run {second}" in result.violations["turns_in_order"][0]


async def test_journal_gap(world: World) -> None:
    rid = world.completed[1]
    await world.execute("DELETE FROM {ev} WHERE run_id = %s AND seq = 3", (rid,))
    result = await world.check()
    assert "journal_gap_free_one_complete" in failing(result)
    assert "missing [3]" in result.violations["journal_gap_free_one_complete"][0]


async def test_event_after_complete(world: World) -> None:
    rid = world.completed[2]
    await world.execute(
        "INSERT INTO {ev} (run_id, seq, type) SELECT %s, max(seq) + 1, 'late' FROM {ev} WHERE run_id = %s",
        (rid, rid),
    )
    result = await world.check()
    assert "journal_gap_free_one_complete" in failing(result)
    assert "after complete" in result.violations["journal_gap_free_one_complete"][0]


async def test_tail_with_gap_duplicate_or_unfinished(world: World) -> None:
    good = world.transcripts[0]
    assert good.resumes == 1
    gap = Transcript(good.run_id, 0, [e for e in good.events if e[0] != 3], 1, True)
    dup = Transcript(good.run_id, 0, [*good.events[:3], good.events[2], *good.events[3:]], 1, True)
    cut = Transcript(good.run_id, 0, good.events[:-1], 1, False)
    changed = Transcript(good.run_id, 0, [(s, t, {**p, "x": 1}) for s, t, p in good.events], 1, True)
    for bad, words in (
        (gap, "missing [3]"),
        (dup, "duplicates [3]"),
        (cut, "never reached"),
        (changed, "first difference at seq 1"),
    ):
        result = await world.check([*world.transcripts, bad])
        assert failing(result) == {"tails_saw_exact_journal"}, words
        assert words in result.violations["tails_saw_exact_journal"][0]


async def test_queued_turn_started_after_a_stop(world: World) -> None:
    rid = await world.enqueue("y")
    # The stop is logged but (as a bug would) did not cancel the queued turn.
    await world.execute(
        "INSERT INTO {c}.stop_log (id, conversation_id, cancelled, cancel_requested) VALUES (%s, 'y', '{{}}', '{{}}')",
        (uuid.uuid4(),),
    )
    await world.start(rid)
    await world.finish(rid)
    result = await world.check()
    assert failing(result) == {"stops_honoured"}
    assert "started after the stop" in result.violations["stops_honoured"][0]


async def test_stopped_turn_that_failed(world: World) -> None:
    rid = await world.enqueue("z")
    await world.start(rid)
    stop = await stop_and_log(world.conn, world.schema, world.chaos, "z")
    assert stop.cancel_requested == [rid]
    await world.finish(rid, "failed")
    result = await world.check()
    assert failing(result) == {"stops_honoured"}
    assert "ended failed" in result.violations["stops_honoured"][0]


async def test_stopped_turn_that_ended_too_late(world: World) -> None:
    rid = await world.enqueue("z")
    await world.start(rid)
    await stop_and_log(world.conn, world.schema, world.chaos, "z")
    await world.execute("UPDATE {c}.stop_log SET at = at - interval '30 seconds'")
    await world.finish(rid, "cancelled")
    result = await world.check()
    assert failing(result) == {"stops_honoured"}
    assert "after the stop" in result.violations["stops_honoured"][0]


async def test_reaped_long_after_lease_expired(world: World) -> None:
    rid = await world.enqueue("r")
    await world.start(rid, expires_in=-60)
    assert await reap_expired(world.dsn, schema=world.schema, grace=2) == [rid]
    result = await world.check()
    assert failing(result) == {"recovery_bounded"}
    assert "reaped" in result.violations["recovery_bounded"][0]
    assert "faults near" not in result.violations["recovery_bounded"][0]


async def test_a_late_reap_names_the_faults_around_it(world: World) -> None:
    rid = await world.enqueue("r")
    await world.start(rid, expires_in=-60)
    await world.execute(  # a delay that is not an outage: the bound stays, the message explains
        "INSERT INTO {c}.fault (kind, at, ended_at) "
        "VALUES ('proxy_delay', clock_timestamp() - interval '59 seconds', clock_timestamp() - interval '57 seconds')"
    )
    assert await reap_expired(world.dsn, schema=world.schema, grace=2) == [rid]
    result = await world.check()
    assert failing(result) == {"recovery_bounded"}
    assert "faults near: proxy_delay@+1." in result.violations["recovery_bounded"][0]


async def test_outage_extends_the_recovery_bound(world: World) -> None:
    rid = await world.enqueue("r")
    await world.start(rid, expires_in=-60)
    await world.execute(
        "INSERT INTO {c}.fault (kind, at, ended_at, outage) "
        "VALUES ('pg_restart', clock_timestamp() - interval '61 seconds', clock_timestamp(), true)"
    )
    assert await reap_expired(world.dsn, schema=world.schema, grace=2) == [rid]
    result = await world.check()
    assert result.ok, result.violations


async def test_victim_of_a_killed_worker_ended_late(world: World) -> None:
    rid = world.completed[0]
    await world.execute(
        "INSERT INTO {c}.fault (kind, at, victims) VALUES ('kill_mid_stream', clock_timestamp() - interval '1 minute', %s)",
        ([rid],),
    )
    result = await world.check()
    assert failing(result) == {"recovery_bounded"}
    assert result.recovery_by_kind["kill_mid_stream"][0] > 50


async def test_stop_reported_a_cancel_that_did_not_hold(world: World) -> None:
    rid = world.completed[0]
    await world.execute(
        "INSERT INTO {c}.stop_log (id, conversation_id, cancelled, cancel_requested) VALUES (%s, 'a', %s, '{{}}')",
        (uuid.uuid4(), [rid]),
    )
    result = await world.check()
    assert failing(result) == {"stops_honoured"}
    assert "cancelled before it started" in result.violations["stops_honoured"][0]


async def _child_of(world: World, parent: uuid.UUID, index: int, conversation: str) -> uuid.UUID:
    """A run made a child of ``parent`` (child ``index`` of a tree rooted there), as a spawn
    would link it (without the spawn's guards)."""
    child = await world.enqueue(conversation)
    await world.execute(
        "UPDATE {run} SET parent_run_id = %s, root_run_id = %s, request = jsonb_build_object('index', %s::int) "
        "WHERE id = %s",
        (parent, parent, index, child),
    )
    return child


async def test_a_child_spawned_twice(world: World) -> None:
    parent = await world.enqueue("tree-1")
    await world.start(parent)
    await world.finish(parent, "failed")  # (a parent that did not complete: only the spawn is judged)
    for conversation in ("child-a", "child-b"):  # the same child twice, as a replayed spawn would
        child = await _child_of(world, parent, 0, conversation)
        await world.start(child)
        await world.finish(child)
    result = await world.check()
    assert failing(result) == {"children_spawned_once"}
    assert "child 0 spawned 2 times" in result.violations["children_spawned_once"][0]
    assert result.counts["children"] == 2 and result.counts["parents"] == 1


async def test_a_parent_that_completed_before_its_child_ended(world: World) -> None:
    parent = await world.enqueue("tree-2")
    await world.start(parent)
    await world.finish(parent)  # answered without waiting for its child
    child = await _child_of(world, parent, 0, "child-c")
    await world.start(child)
    await world.finish(child)
    result = await world.check()
    assert failing(result) == {"parents_end_after_children"}
    assert f"before its child {child} ended" in result.violations["parents_end_after_children"][0]


async def test_a_child_spawned_after_its_tree_was_stopped(world: World) -> None:
    root = await world.enqueue("tree-3")
    await world.start(root)
    stop = await stop_and_log(world.conn, world.schema, world.chaos, "tree-3")
    assert stop.cancel_requested == [root]
    child = await _child_of(world, root, 0, "child-d")  # a spawn the stop should have refused
    await world.start(child)
    await world.finish(child)
    await world.finish(root, "cancelled")
    result = await world.check()
    assert failing(result) == {"stops_reach_descendants"}
    assert "was spawned after the stop" in result.violations["stops_reach_descendants"][0]


async def _steered(world: World, conversation: str) -> tuple[uuid.UUID, uuid.UUID]:
    """A turn started by hand that reads one steering message with the real delivery
    statement, then completes: (the turn, the steering message's run)."""
    from tests import manual

    turn = await world.enqueue(conversation)
    await world.start(turn)
    steer = await runrow.enqueue(
        world.conn,
        conversation_id=conversation,
        user_id="u",
        content="also",
        on_busy="steer",
        schema=world.schema,
    )
    [(token,)] = await world.execute("SELECT claim_token FROM {run} WHERE id = %s", (turn,))
    got = await manual.steer(world.conn, world.schema, turn, token, occurrence=0, position=0)
    assert got is not None and [m["run_id"] for m in got] == [str(steer.id)]
    await world.finish(turn)
    return turn, steer.id


async def test_a_steering_message_read_once_passes_and_read_twice_fails(world: World) -> None:
    _, steer = await _steered(world, "steer-1")
    result = await world.check()
    assert result.ok, result.violations
    assert result.counts["steering_messages"] == 1 and result.counts["steering_absorbed"] == 1
    # A second delivery (another turn's step) that read it again, as a replay that absorbed anew would.
    other = await world.enqueue("steer-1b")
    await world.start(other)
    await world.finish(other)
    await world.execute(
        "INSERT INTO {run_step} (lineage_id, key, occurrence, position, run_id, status, idempotent, result,"
        " recorded_at) VALUES (%s, 'runrow.steering', 0, 0, %s, 'recorded', true, jsonb_build_array("
        "jsonb_build_object('message_id', gen_random_uuid(), 'run_id', %s::text)), now())",
        (other, other, steer),
    )
    result = await world.check()
    assert failing(result) == {"no_lost_steering_message"}
    assert "read by 2 deliveries" in result.violations["no_lost_steering_message"][0]


async def test_a_steering_message_absorbed_without_a_delivery_is_lost(world: World) -> None:
    turn, _ = await _steered(world, "steer-2")
    lost = await runrow.enqueue(
        world.conn,
        conversation_id="steer-2",
        user_id="u",
        content="gone",
        on_busy="steer",
        schema=world.schema,
    )
    # Ended absorbed with its terminal event, but no delivery read it: the message is lost.
    await world.execute(
        "UPDATE {run} SET status = 'absorbed', absorbed_into = %s, finished_at = now() WHERE id = %s",
        (turn, lost.id),
    )
    await world.execute(
        "INSERT INTO {ev} (run_id, seq, type, payload) SELECT %s, max(seq) + 1, 'complete', "
        "jsonb_build_object('status', 'absorbed') FROM {ev} WHERE run_id = %s",
        (lost.id, lost.id),
    )
    result = await world.check()
    assert failing(result) == {"no_lost_steering_message"}
    assert "read by 0 deliveries" in result.violations["no_lost_steering_message"][0]


async def test_a_tree_tail_that_lost_repeated_or_misordered_an_event(world: World) -> None:
    root = await world.enqueue("tree-4")
    await world.start(root)
    child = await _child_of(world, root, 0, "child-e")
    await world.start(child)
    await world.finish(child)
    await world.finish(root)
    tree = Transcript(str(root), tree=[])
    async for ev in runrow.tail(world.dsn, root, schema=world.schema, tree=True, poll=0.05):
        if not ev.keepalive:
            tree.events.append((ev.seq, ev.type, ev.payload))
            assert tree.tree is not None
            tree.tree.append((str(ev.run_id), int(ev.run_seq or 0)))
    tree.finished = True
    assert {r for r, _ in tree.tree or []} == {str(root), str(child)}
    assert not failing(await world.check([*world.transcripts, tree]))

    def variant(keep: list[int], *, finished: bool = True) -> Transcript:
        assert tree.tree is not None
        events = [(i + 1, tree.events[k][1], tree.events[k][2]) for i, k in enumerate(keep)]
        return Transcript(tree.run_id, 0, events, 1, finished, [tree.tree[k] for k in keep])

    n = len(tree.events)
    child_end = next(
        k for k, (r, _) in enumerate(tree.tree or []) if r == str(child) and tree.events[k][1] == "complete"
    )
    for bad, words in (
        (variant([k for k in range(n) if k != 1]), "missing"),
        (variant([*range(n - 1), 1, n - 1]), "seen twice"),
        (variant(list(range(n - 1)), finished=False), "never reached"),
        (variant([*[k for k in range(n) if k != child_end], child_end]), "not the root's ending"),
        (variant([1, 0, *range(2, n)]), "out of order"),
    ):
        result = await world.check([*world.transcripts, bad])
        assert failing(result) == {"tree_tails_saw_whole_tree"}, (words, result.violations)
        assert any(words in v for v in result.violations["tree_tails_saw_whole_tree"]), (
            words,
            result.violations,
        )
