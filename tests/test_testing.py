"""runrow.testing, used directly: the scripted model, run_agent's edges, the test schemas."""

from __future__ import annotations

import anyio
import psycopg
import pytest

import runrow
from runrow.testing import (
    TEST_SCHEMA_PREFIX,
    ScriptedModel,
    ScriptExhausted,
    ToolCall,
    create_test_schema,
    drop_test_schema,
    run_agent,
)

pytestmark = pytest.mark.anyio


async def _play(model: ScriptedModel, messages: object = None) -> list[object]:
    return [chunk async for chunk in model.stream(messages)]


async def test_a_scripted_model_plays_its_responses_in_order() -> None:
    model = ScriptedModel(["Hel", "lo", ToolCall("search", {"q": "x"})], ["done"])
    messages = [{"role": "user", "content": "hi"}]
    assert await _play(model, messages) == ["Hel", "lo", ToolCall("search", {"q": "x"}, id="call_search")]
    messages.append({"role": "assistant", "content": "Hello"})  # the agent's list grows later
    assert model.remaining == 1
    assert await _play(model, messages) == ["done"]
    assert model.requests == [[{"role": "user", "content": "hi"}], messages]  # each as it was sent
    with pytest.raises(ScriptExhausted, match="response 3, but only 2 were scripted"):
        model.stream(messages)


async def test_a_scripted_exception_is_raised_where_it_stands() -> None:
    model = ScriptedModel(["partial", ValueError("model down"), "never"])
    seen = []
    with pytest.raises(ValueError, match="model down"):
        async for chunk in model.stream():
            seen.append(chunk)
    assert seen == ["partial"]


@pytest.mark.parametrize("delay", [0.0, 0.01])
async def test_a_scripted_stream_can_be_cancelled_between_chunks(delay: float) -> None:
    model = ScriptedModel(["a"] * 1000, delay=delay)
    seen = []
    with anyio.CancelScope() as scope:
        async for chunk in model.stream():
            seen.append(chunk)
            if len(seen) == 3:
                scope.cancel()  # lands at the stream's next await, as a stop does in an agent
    assert seen == ["a"] * 3


async def test_test_schemas_are_migrated_and_only_they_can_be_dropped(dsn: str) -> None:
    name = await create_test_schema(dsn)
    assert name.startswith(TEST_SCHEMA_PREFIX)
    assert await runrow.list_runs(dsn, schema=name) == []  # migrated: the API accepts it
    await drop_test_schema(dsn, name)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (name,))
        assert await cur.fetchone() == (0,)
    with pytest.raises(runrow.InvalidInput, match="drops only schemas named runrow_test_"):
        await drop_test_schema(dsn, "runrow")


async def test_run_agent_gives_up_after_its_timeout_and_ends_the_run(dsn: str, schema: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.text("thinking")
        await anyio.sleep_forever()

    with anyio.fail_after(30), pytest.raises(TimeoutError, match=r"did not end within 1s \(it was "):
        await run_agent(dsn, agent, "hi", schema=schema, timeout=1)
    (run,) = await runrow.list_runs(dsn, schema=schema)
    # Not left running: cancelled as the dispatcher stopped (or never claimed, on a slow machine).
    assert run.status in ("failed", "queued"), run
    if run.status == "failed":
        assert run.error is not None and run.error["type"] == "worker_shutdown"


async def test_run_agent_returns_a_failed_run_with_its_journal(dsn: str, schema: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.emit({"type": "tool_call_started", "tool_call_id": 7, "name": "search"})
        raise KeyError("no such tool")

    result = await run_agent(dsn, agent, {"text": "hi"}, schema=schema, conversation_id="c-1", user_id="ann")
    assert result.status == "failed" and result.error == {"type": "KeyError", "message": "'no such tool'"}
    # The traceback apart (error stays type and message, as tests compare it whole).
    assert result.traceback is not None and result.traceback == (result.run.error or {})["traceback"]
    assert "in agent" in result.traceback and result.traceback.rstrip().endswith("KeyError: 'no such tool'")
    assert result.event_types == ["user_message_created", "run_queued", "tool_call_started", "complete"]
    assert [e.seq for e in result.events] == [1, 2, 3, 4]
    assert result.payloads("tool_call_started") == [{"tool_call_id": 7, "name": "search"}]
    assert result.text == ""
    assert result.run.conversation_id == "c-1" and result.run.user_id == "ann"
    assert [(m.role, m.content) for m in result.transcript] == [("user", {"text": "hi"})]


def test_every_public_name_of_the_testing_modules_is_documented() -> None:
    import inspect

    import runrow.pytest_plugin
    import runrow.testing

    for module in (runrow.testing, runrow.pytest_plugin):
        assert (module.__doc__ or "").strip()
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) or inspect.isfunction(obj) or hasattr(obj, "_get_wrapped_function"):
                assert (obj.__doc__ or "").strip(), f"{module.__name__}.{name} has no docstring"
