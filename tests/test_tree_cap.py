"""A cap on a tree's running runs (#41 point 3): ``Dispatcher(max_running_per_tree=N)``
starts at most N of a tree's spawned runs at once, in either claim order, however many
slots are free, and the other work in the queue keeps starting meanwhile."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import runrow

from .helpers import wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.05, "heartbeat": 0.2, "lease": 5.0, "grace": 1.0}


async def _tree(dsn: str, schema: str, *, cap: int | None, order: str) -> dict[str, Any]:
    running = [0]
    peak = [0]
    plain_done: list[float] = []
    children_done: list[float] = []

    async def child(run: runrow.RunContext) -> None:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        try:
            await anyio.sleep(0.15)
        finally:
            running[0] -= 1
        children_done.append(anyio.current_time())
        await run.write_message("ok")

    async def plain(run: runrow.RunContext) -> None:
        plain_done.append(anyio.current_time())

    async def root(run: runrow.RunContext) -> None:
        if run.content == "plain":
            await plain(run)
            return
        kids = await run.spawn_many([("child", i) for i in range(12)])
        results = await run.wait_for_children(kids)
        await run.write_message([r.get() for r in results])

    async with runrow.Dispatcher(
        dsn,
        root,
        agents={"child": child},
        schema=schema,
        concurrency=16,
        claim_order=order,  # type: ignore[arg-type]
        max_running_per_tree=cap,
        **FAST,
    ):
        turn = await runrow.enqueue(dsn, schema=schema, conversation_id="tree", user_id="u", content="go")

        async def spawned() -> bool:
            return len(await runrow.list_runs(dsn, schema=schema, parent_run_id=turn.id)) == 12

        await wait_for(spawned, what="the children")
        for i in range(5):
            await runrow.enqueue(dsn, schema=schema, conversation_id=f"p{i}", user_id="u", content="plain")
        events = [e async for e in runrow.tail(dsn, turn.id, schema=schema)]
    assert events[-1].payload["status"] == "completed"
    assert len(children_done) == 12
    return {"peak": peak[0], "plain_done": plain_done, "children_done": children_done}


@pytest.mark.parametrize("order", ["fair", "fifo"])
async def test_a_wide_tree_runs_at_most_its_cap_and_other_work_goes_by(
    dsn: str, schema: str, order: str
) -> None:
    got = await _tree(dsn, schema, cap=3, order=order)
    assert got["peak"] <= 3, got["peak"]
    assert got["peak"] == 3  # the cap is used, not undershot
    # The queue is not blocked behind the capped children: the plain runs, queued after
    # all twelve, finish before the last of them.
    assert len(got["plain_done"]) == 5
    assert max(got["plain_done"]) < max(got["children_done"])


async def test_without_a_cap_the_tree_takes_the_free_slots(dsn: str, schema: str) -> None:
    got = await _tree(dsn, schema, cap=None, order="fair")
    assert got["peak"] > 3  # what the cap prevents


def test_a_bad_cap_is_refused() -> None:
    async def agent(run: runrow.RunContext) -> None:
        return None

    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(runrow.ConfigurationError, match="max_running_per_tree"):
            runrow.Dispatcher("postgresql://x", agent, max_running_per_tree=bad)  # type: ignore[arg-type]
