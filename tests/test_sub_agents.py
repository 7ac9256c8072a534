"""Sub-agents (#41 points 1, 2 and 5): a run spawns child runs as steps (a replay gets the
same children back), parks while it waits on them (no slot, no lease), is queued again by
the ending that completes its wait (in that ending's transaction: the worker's, the
reaper's or a stop's), and gets each child's answer or its failure as a typed error; a
stop of the parent cancels every descendant in one transaction."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import psycopg
import pytest

import runrow
from runrow._engine.tree import Family

from .helpers import events, is_terminal, run_row, status_of, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.2, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}


async def _children(conn: psycopg.AsyncConnection, schema: str, parent: Any) -> list[dict[str, Any]]:
    cur = await conn.execute(
        f'SELECT id, status, agent_key, parent_run_id, root_run_id, conversation_id, tenant_id, priority, deadline_at, attempt FROM "{schema}".agent_run WHERE parent_run_id = %s ORDER BY created_at, id',
        (parent,),
    )
    cols = [d.name for d in cur.description or ()]
    return [dict(zip(cols, r, strict=True)) for r in await cur.fetchall()]


async def _answer(conn: psycopg.AsyncConnection, schema: str, run_id: Any) -> Any:
    cur = await conn.execute(
        f'SELECT content FROM "{schema}".message WHERE run_id = %s AND role = %s ORDER BY position',
        (run_id, "assistant"),
    )
    got = await cur.fetchall()
    return [r[0] for r in got]


async def echo(run: runrow.RunContext) -> None:
    await run.write_message(f"echo {run.content}")


async def test_a_parent_spawns_children_waits_without_a_slot_and_gets_their_answers(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    release = anyio.Event()
    calls: list[str] = []

    async def slow(run: runrow.RunContext) -> None:
        await release.wait()
        if run.content == "boom":
            raise ValueError("the child failed")
        await run.write_message(f"slow {run.content}")

    async def parent(run: runrow.RunContext) -> None:
        calls.append("parent")
        kids = await run.spawn_many([("slow", "a"), ("slow", "b"), ("slow", "boom")])
        one = await run.spawn("echo", "x")
        results = await run.wait_for_children([*kids, one])
        answers = []
        for r in results:
            try:
                answers.append(r.get())
            except runrow.ChildFailed as exc:
                answers.append(f"failed: {exc.error['type'] if exc.error else None}")
        await run.write_message(answers)

    run = await runrow.enqueue(
        dsn,
        schema=schema,
        conversation_id="p",
        user_id="u",
        content="go",
        tenant_id="t",
        priority=3,
        deadline=__import__("datetime").timedelta(minutes=5),
    )
    agents = {"slow": slow, "echo": echo}
    async with runrow.Dispatcher(dsn, parent, agents=agents, schema=schema, concurrency=4, **FAST):
        await wait_for(lambda: _is(conn, schema, run.id, "waiting"), what="the parent to park")
        kids = await _children(conn, schema, run.id)
        assert len(kids) == 4
        assert {k["agent_key"] for k in kids} == {"slow", "echo"}
        parent_row = await run_row(conn, schema, run.id)
        for k in kids:
            assert k["root_run_id"] == run.id and k["tenant_id"] == "t" and k["priority"] == 3
            assert k["deadline_at"] == parent_row["deadline_at"]  # inherited (capped by the parent's)
            assert k["conversation_id"].startswith("child:")
        assert len({k["conversation_id"] for k in kids}) == 4  # a conversation each: in parallel
        assert parent_row["claim_token"] is not None or True
        release.set()
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the parent to complete")
    assert await status_of(conn, schema, run.id) == "completed"
    assert calls == ["parent", "parent"]  # parked once, resumed once
    (answer,) = await _answer(conn, schema, run.id)
    assert answer == ["slow a", "slow b", "failed: ValueError", "echo x"]
    assert len(await _children(conn, schema, run.id)) == 4  # the replay spawned none again
    types = [t for _, t, _ in await events(conn, schema, run.id)]
    assert types.count("children_awaited") == 1 and types[-1] == "complete"


async def _is(conn: psycopg.AsyncConnection, schema: str, run_id: Any, status: str) -> bool:
    return await status_of(conn, schema, run_id) == status


async def test_children_already_ended_need_no_park_and_first_of_returns_one(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    gate = anyio.Event()
    seen: list[Any] = []

    async def child(run: runrow.RunContext) -> None:
        if run.content == "late":
            await gate.wait()
        await run.write_message(run.content)

    async def parent(run: runrow.RunContext) -> None:
        early, late = await run.spawn_many([("c", "early"), ("c", "late")])
        firsts = await run.wait_for_children([early, late], first=True)
        seen.append([(r.status, r.answer) for r in firsts])
        gate.set()
        seen.append(await run.wait_for_child(late))

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="p", user_id="u", content="go")
    async with runrow.Dispatcher(dsn, parent, agents={"c": child}, schema=schema, concurrency=4, **FAST):
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the parent to complete")
    assert await status_of(conn, schema, run.id) == "completed"
    assert seen[0] == [("completed", "early"), ("queued", None)] or seen[0] == [
        ("completed", "early"),
        ("running", None),
    ]
    assert seen[-1] == "late"


async def test_a_wait_answered_without_a_park_replays_after_a_later_park(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    # The child has ended before the parent asks, so the wait is recorded at once (no
    # park); a later input parks the run, and the resumed attempt replays that wait: it
    # must find it recorded as a wait (an input), not as a step (a CI flake of the test
    # above, made certain here).
    seen: list[Any] = []

    async def parent(run: runrow.RunContext) -> None:
        (child,) = await run.spawn_many([("c", "x")])
        await wait_for(lambda: _is(conn, schema, child, "completed"), what="the child to end")
        seen.append([(r.status, r.answer) for r in await run.wait_for_children([child])])
        seen.append(await run.wait_for_input("more", {"q": "?"}))

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="p", user_id="u", content="go")
    async with runrow.Dispatcher(dsn, parent, agents={"c": echo}, schema=schema, concurrency=4, **FAST):
        await wait_for(lambda: _is(conn, schema, run.id, "waiting"), what="the parent to park")
        assert await runrow.provide_input(dsn, run.id, "more", "yes", schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the parent to complete")
    assert await status_of(conn, schema, run.id) == "completed"
    assert seen == [[("completed", "echo x")], [("completed", "echo x")], "yes"]


async def test_spawn_refuses_an_unknown_key_and_limits_hold(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    errors: list[BaseException] = []

    async def deep(run: runrow.RunContext) -> None:
        try:
            if run.content == "unknown":
                await run.spawn("nobody", "x")
            elif run.content == "wide":
                await run.spawn_many([("deep", "leaf")] * 3)
            else:
                child = await run.spawn("deep", "deeper")
                await run.wait_for_child(child)
        except (runrow.InvalidInput, runrow.SpawnLimitExceeded, runrow.ChildFailed) as exc:
            errors.append(exc)
            raise

    unknown = await runrow.enqueue(dsn, schema=schema, conversation_id="a", user_id="u", content="unknown")
    wide = await runrow.enqueue(dsn, schema=schema, conversation_id="b", user_id="u", content="wide")
    deep_run = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="u", content="deeper", agent_key="deep"
    )
    async with runrow.Dispatcher(
        dsn, deep, agents={"deep": deep}, schema=schema, max_spawn_depth=2, max_children=2, **FAST
    ):
        for r in (unknown, wide, deep_run):
            await wait_for(lambda r=r: is_terminal(conn, schema, r.id), what="the runs to end")
    assert (await run_row(conn, schema, unknown.id))["error"]["type"] == "InvalidInput"
    assert (await run_row(conn, schema, wide.id))["error"]["type"] == "SpawnLimitExceeded"
    assert await _children(conn, schema, wide.id) == []  # the transaction rolled back
    # depth: root (0) -> child (1) -> grandchild (2) -> its spawn refused (would be 3)
    chain = [deep_run.id]
    while kids := await _children(conn, schema, chain[-1]):
        chain.append(kids[0]["id"])
    assert len(chain) == 3
    assert (await run_row(conn, schema, chain[-1]))["error"]["type"] == "SpawnLimitExceeded"
    assert (await run_row(conn, schema, chain[0]))["error"]["type"] == "ChildFailed"
    assert any(isinstance(e, runrow.InvalidInput) and "nobody" in str(e) for e in errors)


def test_a_wait_names_children_by_id() -> None:
    from runrow._engine.tree import child_ids

    with pytest.raises(runrow.InvalidInput):
        child_ids("not a list")
    with pytest.raises(runrow.InvalidInput):
        child_ids([])
    a = uuid.uuid4()
    assert child_ids([a, str(a)]) == [a]
    assert Family  # (the engine's part: see _engine/tree.py)


async def _flagged(conn: psycopg.AsyncConnection, schema: str, run_id: Any) -> bool:
    return bool((await run_row(conn, schema, run_id))["cancel_requested"])


async def test_stopping_the_parent_cancels_every_descendant_in_one_transaction(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def block(run: runrow.RunContext) -> None:
        if run.content == "spawner":
            await run.spawn("block", "grandchild")
        await anyio.sleep(3600)

    async def parent(run: runrow.RunContext) -> None:
        kids = await run.spawn_many([("block", "spawner"), ("block", "b"), ("block", "c"), ("block", "d")])
        await run.wait_for_children(kids)

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="p", user_id="u", content="go")
    async with runrow.Dispatcher(dsn, parent, agents={"block": block}, schema=schema, concurrency=3, **FAST):
        await wait_for(lambda: _is(conn, schema, run.id, "waiting"), what="the parent to park")

        async def three_running() -> bool:
            # (And the grandchild enqueued: the spawner may be claimed, with the two
            # others, a moment before its own spawn commits.)
            cur = await conn.execute(
                f"SELECT count(*) FILTER (WHERE status = %s), count(*) FILTER (WHERE status = %s)"
                f' FROM "{schema}".agent_run WHERE root_run_id = %s',
                ("running", "queued", run.id),
            )
            return await cur.fetchone() == (3, 2)

        await wait_for(three_running, what="three descendants running, the rest queued")
        cur = await conn.execute(
            f'SELECT id, status FROM "{schema}".agent_run WHERE root_run_id = %s', (run.id,)
        )
        tree = dict(await cur.fetchall())
        assert len(tree) == 5 and sorted(tree.values()).count("queued") == 2
        stopped = await runrow.stop_conversation(dsn, "p", schema=schema)
        # In the stop's one commit: the parked parent and the queued descendants
        # cancelled, the running ones flagged.
        assert set(stopped.cancelled) == {run.id} | {i for i, s in tree.items() if s == "queued"}
        assert set(stopped.cancel_requested) == {i for i, s in tree.items() if s == "running"}
        for i in stopped.cancel_requested:
            assert await _flagged(conn, schema, i)
        for i in tree:
            await wait_for(lambda i=i: is_terminal(conn, schema, i), what="every descendant to end")
    cur = await conn.execute(
        f'SELECT DISTINCT status FROM "{schema}".agent_run WHERE root_run_id = %s OR id = %s',
        (run.id, run.id),
    )
    assert await cur.fetchall() == [("cancelled",)]


async def test_cancelling_a_child_wakes_its_parent_with_child_cancelled(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    got: list[Any] = []

    async def block(run: runrow.RunContext) -> None:
        await anyio.sleep(3600)

    async def parent(run: runrow.RunContext) -> None:
        kid = await run.spawn("block", "x")
        try:
            await run.wait_for_child(kid)
        except runrow.ChildCancelled as exc:
            got.append(exc.run_id)
            await run.write_message("carried on")

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="p", user_id="u", content="go")
    async with runrow.Dispatcher(dsn, parent, agents={"block": block}, schema=schema, concurrency=2, **FAST):
        await wait_for(lambda: _is(conn, schema, run.id, "waiting"), what="the parent to park")
        (kid,) = await _children(conn, schema, run.id)
        await runrow.cancel_run(dsn, kid["id"], schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the parent to complete")
    assert await status_of(conn, schema, run.id) == "completed"
    assert got == [kid["id"]]


async def test_a_lost_workers_child_is_reaped_and_its_parent_sees_the_failure(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    from . import manual

    got: list[Any] = []
    taken = anyio.Event()

    async def parent(run: runrow.RunContext) -> None:
        kid = await run.spawn("remote", "x")
        await taken.wait()  # (until the hand-driven worker has claimed the child)
        try:
            await run.wait_for_child(kid)
        except runrow.ChildFailed as exc:
            got.append(exc.error)
            await run.write_message("saw it")

    async def never(run: runrow.RunContext) -> None:  # pragma: no cover - never claimed here
        raise AssertionError

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="p", user_id="u", content="go")
    # A worker whose runs may spawn "remote" children, which a hand-driven worker (below)
    # claims and then abandons: lost, as a worker killed with SIGKILL.
    async with runrow.Dispatcher(dsn, parent, agents={"remote": never}, schema=schema, concurrency=1, **FAST):
        await wait_for(lambda: _has_child(conn, schema, run.id), what="the child")
        (claimed,) = await manual.claim(conn, schema, lease=0.2, agent_keys=("remote",))
        taken.set()
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the parent to end")
    assert (await run_row(conn, schema, claimed["id"]))["error"]["type"] == "worker_lost"
    assert await status_of(conn, schema, run.id) == "completed"
    assert got and got[0]["type"] == "worker_lost"


async def _has_child(conn: psycopg.AsyncConnection, schema: str, parent: Any) -> bool:
    return bool(await _children(conn, schema, parent))


async def test_a_wait_for_children_is_no_input_a_person_can_provide(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def block(run: runrow.RunContext) -> None:
        await anyio.sleep(3600)

    async def parent(run: runrow.RunContext) -> None:
        await run.wait_for_child(await run.spawn("block", "x"))

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="p", user_id="u", content="go")
    async with runrow.Dispatcher(dsn, parent, agents={"block": block}, schema=schema, concurrency=2, **FAST):
        await wait_for(lambda: _is(conn, schema, run.id, "waiting"), what="the parent to park")
        assert await runrow.waiting_inputs(dsn, run_id=run.id, schema=schema) == []
        with pytest.raises(runrow.NotWaitingForInput):
            await runrow.provide_input(dsn, run.id, "runrow.children:0", "forged", schema=schema)
        assert await status_of(conn, schema, run.id) == "waiting"
        await runrow.stop_conversation(dsn, "p", schema=schema)


async def test_a_park_and_its_childrens_endings_in_one_batch_still_wake_the_parent(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Children that end at once and a parent that parks at once often reach the ending
    writer together: one finalize batch held the park and the children's endings, and
    one statement cannot update the parent's row twice (its wake was lost: the parent
    waited forever). Default timings: no poll comes to the rescue within the bound."""

    async def instant(run: runrow.RunContext) -> None:
        await run.write_message(run.content)

    async def parent(run: runrow.RunContext) -> None:
        kids = await run.spawn_many([("instant", f"{run.content}-{i}") for i in range(3)])
        await run.write_message([r.get() for r in await run.wait_for_children(kids)])

    roots = [
        await runrow.enqueue(dsn, schema=schema, conversation_id=f"p{i}", user_id="u", content=f"r{i}")
        for i in range(6)
    ]
    async with runrow.Dispatcher(dsn, parent, agents={"instant": instant}, schema=schema, concurrency=8):
        for r in roots:
            await wait_for(lambda r=r: is_terminal(conn, schema, r.id), timeout=8, what="every parent to end")
    for i, r in enumerate(roots):
        assert await _answer(conn, schema, r.id) == [[f"r{i}-0", f"r{i}-1", f"r{i}-2"]]


async def test_a_child_cannot_outlive_its_parents_deadline(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A child inherits its parent's deadline: past it, the child (running) and the parent
    (waiting on it) both end failed with deadline_exceeded; neither is left behind."""
    import datetime

    async def block(run: runrow.RunContext) -> None:
        await anyio.sleep(3600)

    async def parent(run: runrow.RunContext) -> None:
        await run.wait_for_child(await run.spawn("block", "x"))

    run = await runrow.enqueue(
        dsn,
        schema=schema,
        conversation_id="p",
        user_id="u",
        content="go",
        deadline=datetime.timedelta(seconds=2),
    )
    async with runrow.Dispatcher(dsn, parent, agents={"block": block}, schema=schema, concurrency=2, **FAST):
        await wait_for(lambda: _has_child(conn, schema, run.id), what="the child")
        (kid,) = await _children(conn, schema, run.id)
        for r in (run.id, kid["id"]):
            await wait_for(lambda r=r: is_terminal(conn, schema, r), what="both to end at the deadline")
    for r in (run.id, kid["id"]):
        row = await run_row(conn, schema, r)
        assert (row["status"], row["error"]["type"]) == ("failed", "deadline_exceeded"), row
