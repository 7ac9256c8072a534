"""run_agent with scripted sub-agents (``children=``, #41 point 7): a parent's children
answer with their scripts (a value, a function of the content, a coroutine, an error),
as real child runs the parent waits for; real agents given by key run as themselves."""

from __future__ import annotations

import anyio
import pytest

import runrow
from runrow.testing import run_agent

pytestmark = pytest.mark.anyio


async def orchestrator(run: runrow.RunContext) -> None:
    kids = await run.spawn_many([("search", "tides"), ("search", "moons"), ("summarise", "both")])
    answers = []
    for result in await run.wait_for_children(kids):
        try:
            answers.append(result.get())
        except runrow.ChildFailed as exc:
            answers.append(f"failed: {(exc.error or {}).get('type')}")
    await run.write_message(answers)


async def test_scripted_children_answer_and_the_parent_gets_each_answer(dsn: str, schema: str) -> None:
    async def summarise(content: str) -> dict[str, str]:
        await anyio.sleep(0)
        return {"summary": content}

    result = await run_agent(
        dsn,
        orchestrator,
        "space",
        schema=schema,
        children={"search": lambda topic: f"notes on {topic}", "summarise": summarise},
    )
    assert result.status == "completed", result.error
    assert result.transcript[-1].content == ["notes on tides", "notes on moons", {"summary": "both"}]
    assert [(c.agent_key, c.status, c.parent_run_id) for c in result.children] == [
        ("search", "completed", result.run.id),
        ("search", "completed", result.run.id),
        ("summarise", "completed", result.run.id),
    ]
    assert "children_awaited" in result.event_types  # the parent really parked and resumed


async def test_a_scripted_failure_reaches_the_parent_as_child_failed(dsn: str, schema: str) -> None:
    for failure in (TimeoutError("the search timed out"), TimeoutError):
        result = await run_agent(
            dsn, orchestrator, "space", schema=schema, children={"search": failure, "summarise": "ok"}
        )
        assert result.status == "completed", result.error
        assert result.transcript[-1].content == ["failed: TimeoutError", "failed: TimeoutError", "ok"]
        assert [c.status for c in result.children] == ["failed", "failed", "completed"]


async def test_a_real_agent_by_key_runs_beside_scripted_ones_and_an_unscripted_key_is_refused(
    dsn: str, schema: str
) -> None:
    async def real_search(run: runrow.RunContext) -> None:
        await run.write_message(f"real {run.content}")

    result = await run_agent(
        dsn,
        orchestrator,
        "space",
        schema=schema,
        children={"search": "scripted", "summarise": "s"},
        agents={"search": real_search},
    )
    assert result.transcript[-1].content == ["real tides", "real moons", "s"]

    unscripted = await run_agent(dsn, orchestrator, "space", schema=schema, children={"search": "x"})
    assert unscripted.status == "failed" and unscripted.error is not None
    assert unscripted.error["type"] == "InvalidInput" and unscripted.children == []
