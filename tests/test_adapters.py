"""runrow.adapters against the real client libraries, a real HTTP server and the test database.

Each agent here uses a real client (``openai.AsyncOpenAI``, the OpenAI Agents SDK,
PydanticAI) pointed at tests/openai_stub.py, a local OpenAI-compatible server playing
recorded turns; runrow.testing runs it against PostgreSQL, and the tests read the
run's journal. Tests of an adapter whose library is not installed are skipped (the
extras: ``runrow[openai]``, ``runrow[openai-agents]``, ``runrow[pydantic-ai]``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import runrow
from runrow.testing import AgentResult, run_agent

from .openai_stub import Call, OpenAIStub, Turn

pytestmark = pytest.mark.anyio

ANSWER = "It is 18 degrees and sunny in Paris, and 14:05 in Berlin. Anything else I can look up?"
REASONING = "The user wants weather and time; both tools can run at once."
WEATHER = Call("call_weather_1", "get_weather", '{"city": "Paris", "unit": "celsius"}')
TIME = Call("call_time_2", "get_time", '{"timezone": "Europe/Berlin"}')
TOOL_TURN = Turn(tool_calls=(WEATHER, TIME))
ANSWER_TURN = Turn(text=ANSWER, reasoning=REASONING)


def get_weather(city: str, unit: str) -> dict[str, Any]:
    """A sync tool (run in a worker thread)."""
    return {"city": city, "temperature": 18, "unit": unit, "sky": "sunny"}


async def get_time(timezone: str) -> str:
    """An async tool returning text."""
    return f"14:05 in {timezone}"


TOOLS = {"get_weather": get_weather, "get_time": get_time}
TOOL_SPECS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}} for name in TOOLS
]


def reasoning_of(result: AgentResult) -> str:
    return "".join(p["delta"] for p in result.payloads("content_delta") if p.get("stream") == "reasoning")


def tool_events(result: AgentResult) -> list[tuple[str, Any, str]]:
    return [
        (e.type, e.payload["tool_call_id"], e.payload["name"])
        for e in result.events
        if e.type in ("tool_call_started", "tool_call_finished")
    ]


def assert_tool_journal(result: AgentResult, *, started_together: bool = False) -> None:
    started = [("tool_call_started", WEATHER.id, "get_weather"), ("tool_call_started", TIME.id, "get_time")]
    finished = [
        ("tool_call_finished", WEATHER.id, "get_weather"),
        ("tool_call_finished", TIME.id, "get_time"),
    ]
    if started_together:  # the tools ran concurrently: both start, then both finish (in any order)
        events = tool_events(result)
        assert events[:2] == started
        assert sorted(events[2:]) == sorted(finished)
    else:  # one after the other
        assert tool_events(result) == [started[0], finished[0], started[1], finished[1]]
    started = result.payloads("tool_call_started")
    assert [p["arguments"] for p in started] == [json.loads(WEATHER.arguments), json.loads(TIME.arguments)]
    results = {p["tool_call_id"]: (p["ok"], p["result"]) for p in result.payloads("tool_call_finished")}
    assert results == {
        WEATHER.id: (True, get_weather("Paris", "celsius")),
        TIME.id: (True, "14:05 in Europe/Berlin"),
    }
    # The tools ran before the answer streamed: text comes after the last tool event.
    last_tool = max(i for i, e in enumerate(result.events) if e.type == "tool_call_finished")
    first_text = min(i for i, e in enumerate(result.events) if e.type == "content_delta")
    assert last_tool < first_text


# -- runrow.adapters.openai ---------------------------------------------------------------


async def test_a_chat_completions_agent_journals_tool_calls_and_streams_its_answer(
    dsn: str, schema: str
) -> None:
    pytest.importorskip("openai", reason="runrow.adapters.openai needs the openai extra")
    from openai import AsyncOpenAI

    from runrow.adapters.openai import call_tool, stream_chat_completion

    turns: list[dict[str, Any]] = []

    async def agent(run: runrow.RunContext) -> None:
        async with AsyncOpenAI(base_url=stub.url, api_key="test", max_retries=0) as client:
            messages: list[Any] = [{"role": "user", "content": run.content}]
            while True:
                stream = await client.chat.completions.create(
                    model="stub-model",
                    messages=messages,
                    tools=TOOL_SPECS,  # type: ignore[arg-type]
                    stream=True,
                    stream_options={"include_usage": True},
                )
                turn = await stream_chat_completion(run, stream)
                turns.append(
                    {"finish_reason": turn.finish_reason, "usage": turn.usage, "calls": turn.tool_calls}
                )
                messages.append(turn.message)
                if not turn.tool_calls:
                    await run.write_message(turn.text)
                    return
                for call in turn.tool_calls:
                    messages.append(await call_tool(run, call, TOOLS[call.name]))

    with OpenAIStub([TOOL_TURN, ANSWER_TURN]) as stub:
        result = await run_agent(dsn, agent, "Weather in Paris, time in Berlin?", schema=schema)
    assert result.status == "completed", result.error
    assert result.text == ANSWER
    assert reasoning_of(result) == REASONING
    assert_tool_journal(result)
    assert [(m.role, m.content) for m in result.transcript][-1] == ("assistant", ANSWER)
    # What the adapter assembled from the fragments.
    assert [t["finish_reason"] for t in turns] == ["tool_calls", "stop"]
    assert turns[1]["usage"] == {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}
    calls = turns[0]["calls"]
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        (WEATHER.id, "get_weather", {"city": "Paris", "unit": "celsius"}),
        (TIME.id, "get_time", {"timezone": "Europe/Berlin"}),
    ]
    # The follow-up request carried the assistant's calls and both results back.
    follow_up = stub.requests[1]["messages"]
    assert follow_up[1]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": WEATHER.arguments,
    }
    assert follow_up[2] == {
        "role": "tool",
        "tool_call_id": WEATHER.id,
        "content": json.dumps(get_weather("Paris", "celsius")),
    }
    assert follow_up[3] == {"role": "tool", "tool_call_id": TIME.id, "content": "14:05 in Europe/Berlin"}


async def test_parallel_calls_streamed_at_one_index_stay_apart(dsn: str, schema: str) -> None:
    pytest.importorskip("openai", reason="runrow.adapters.openai needs the openai extra")
    from openai import AsyncOpenAI

    from runrow.adapters.openai import stream_chat_completion

    calls: list[Any] = []

    async def agent(run: runrow.RunContext) -> None:
        async with AsyncOpenAI(base_url=stub.url, api_key="test", max_retries=0) as client:
            messages: list[Any] = [{"role": "user", "content": run.content}]
            stream = await client.chat.completions.create(model="m", messages=messages, stream=True)
            calls.extend((await stream_chat_completion(run, stream)).tool_calls)

    with OpenAIStub([Turn(tool_calls=(WEATHER, TIME), every_call_at_index_0=True)]) as stub:
        result = await run_agent(dsn, agent, "Weather and time?", schema=schema)
    assert result.status == "completed", result.error
    assert [(c.id, c.name, c.raw_arguments) for c in calls] == [
        (WEATHER.id, WEATHER.name, WEATHER.arguments),
        (TIME.id, TIME.name, TIME.arguments),
    ]


async def test_a_failing_tool_is_journaled_and_its_error_goes_back_to_the_model(
    dsn: str, schema: str
) -> None:
    pytest.importorskip("openai", reason="runrow.adapters.openai needs the openai extra")
    from openai import AsyncOpenAI

    from runrow.adapters.openai import call_tool, stream_chat_completion

    def get_weather(city: str, unit: str) -> dict[str, Any]:
        raise LookupError(f"no station in {city}")

    async def agent(run: runrow.RunContext) -> None:
        async with AsyncOpenAI(base_url=stub.url, api_key="test", max_retries=0) as client:
            messages: list[Any] = [{"role": "user", "content": run.content}]
            turn = await stream_chat_completion(
                run, await client.chat.completions.create(model="m", messages=messages, stream=True)
            )
            messages += [turn.message, await call_tool(run, turn.tool_calls[0], get_weather)]
            turn = await stream_chat_completion(
                run, await client.chat.completions.create(model="m", messages=messages, stream=True)
            )
            await run.write_message(turn.text)

    with OpenAIStub([Turn(tool_calls=(WEATHER,)), Turn(text="Sorry, no weather for Paris.")]) as stub:
        result = await run_agent(dsn, agent, "Weather?", schema=schema)
    assert result.status == "completed", result.error
    assert result.payloads("tool_call_finished") == [
        {
            "tool_call_id": WEATHER.id,
            "name": "get_weather",
            "ok": False,
            "error": "LookupError: no station in Paris",
        }
    ]
    assert result.text == "Sorry, no weather for Paris."
    assert stub.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": WEATHER.id,
        "content": "Error: LookupError: no station in Paris",
    }


async def test_a_responses_api_agent_journals_tool_calls_and_streams_its_answer(
    dsn: str, schema: str
) -> None:
    pytest.importorskip("openai", reason="runrow.adapters.openai needs the openai extra")
    from openai import AsyncOpenAI

    from runrow.adapters.openai import call_tool, stream_response

    seen: list[Any] = []

    async def agent(run: runrow.RunContext) -> None:
        async with AsyncOpenAI(base_url=stub.url, api_key="test", max_retries=0) as client:
            items: list[Any] = [{"role": "user", "content": run.content}]
            while True:
                stream = await client.responses.create(model="stub-model", input=items, stream=True)
                turn = await stream_response(run, stream)
                seen.append(turn)
                items += turn.output
                if not turn.tool_calls:
                    await run.write_message(turn.text)
                    return
                for call in turn.tool_calls:
                    items.append(await call_tool(run, call, TOOLS[call.name]))

    with OpenAIStub([TOOL_TURN, ANSWER_TURN]) as stub:
        result = await run_agent(dsn, agent, "Weather in Paris, time in Berlin?", schema=schema)
    assert result.status == "completed", result.error
    assert result.text == ANSWER
    assert reasoning_of(result) == REASONING
    assert_tool_journal(result)
    assert stub.paths == ["/v1/responses", "/v1/responses"]
    assert [(t.response_id, t.status) for t in seen] == [
        ("resp_stub0", "completed"),
        ("resp_stub1", "completed"),
    ]
    assert seen[1].usage is not None and seen[1].usage["total_tokens"] == 19
    follow_up = stub.requests[1]["input"]
    outputs = [i for i in follow_up if i.get("type") == "function_call_output"]
    assert outputs == [
        {
            "type": "function_call_output",
            "call_id": WEATHER.id,
            "output": json.dumps(get_weather("Paris", "celsius")),
        },
        {"type": "function_call_output", "call_id": TIME.id, "output": "14:05 in Europe/Berlin"},
    ]
    calls = [i for i in follow_up if i.get("type") == "function_call"]
    assert [(c["call_id"], c["arguments"]) for c in calls] == [
        (WEATHER.id, WEATHER.arguments),
        (TIME.id, TIME.arguments),
    ]


async def test_a_tool_call_made_a_step_runs_once_across_a_retry(dsn: str, schema: str) -> None:
    pytest.importorskip("openai", reason="runrow.adapters.openai needs the openai extra")
    from openai import AsyncOpenAI

    from runrow.adapters.openai import call_tool, stream_chat_completion

    charged: list[str] = []

    def charge(order: str, cents: int) -> dict[str, Any]:
        charged.append(order)
        return {"order": order, "cents": cents, "receipt": f"r-{len(charged)}"}

    async def agent(run: runrow.RunContext) -> None:
        async with AsyncOpenAI(base_url=stub.url, api_key="test", max_retries=0) as client:
            messages: list[Any] = [{"role": "user", "content": run.content}]
            stream = await client.chat.completions.create(model="m", messages=messages, stream=True)
            turn = await stream_chat_completion(run, stream)
            messages += [turn.message, await call_tool(run, turn.tool_calls[0], charge, step=True)]
            if run.attempt == 1:
                raise RuntimeError("the model timed out after the charge went through")
            stream = await client.chat.completions.create(model="m", messages=messages, stream=True)
            await run.write_message((await stream_chat_completion(run, stream)).text)

    call = Call("call_charge_1", "charge", '{"order": "o-17", "cents": 1200}')
    receipt = {"order": "o-17", "cents": 1200, "receipt": "r-1"}
    with OpenAIStub([Turn(tool_calls=(call,)), Turn(tool_calls=(call,)), Turn(text="Paid: r-1.")]) as stub:
        first = await run_agent(dsn, agent, "Pay order o-17", schema=schema)
        assert first.status == "failed" and first.payloads("tool_call_finished")[0]["result"] == receipt
        async with runrow.Dispatcher(dsn, agent, schema=schema, poll=0.1):
            retry = await runrow.retry_run(dsn, first.run.id, schema=schema)
            with anyio.fail_after(30):
                events = [
                    e async for e in runrow.tail(dsn, retry.id, schema=schema, poll=0.05) if not e.keepalive
                ]
    assert events[-1].payload["status"] == "completed", events[-1]
    assert charged == ["o-17"]  # once: the retry got the recorded receipt back
    finished = [e.payload for e in events if e.type == "tool_call_finished"]
    assert finished == [{"tool_call_id": call.id, "name": "charge", "ok": True, "result": receipt}]
    sent = stub.requests[2]["messages"][-1]
    assert (sent["role"], sent["tool_call_id"], json.loads(sent["content"])) == ("tool", call.id, receipt)


# -- runrow.adapters.openai_agents ----------------------------------------------------------


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_an_agents_sdk_run_is_journaled(api: str, dsn: str, schema: str) -> None:
    pytest.importorskip("agents", reason="runrow.adapters.openai_agents needs the openai-agents extra")
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    from runrow.adapters.openai_agents import stream_agents_run

    set_tracing_disabled(True)
    outputs: list[Any] = []

    async def agent(run: runrow.RunContext) -> None:
        async with AsyncOpenAI(base_url=stub.url, api_key="test", max_retries=0) as client:
            assistant = Agent(
                name="assistant",
                instructions="Answer with the tools.",
                model=(
                    OpenAIChatCompletionsModel(model="stub-model", openai_client=client)
                    if api == "chat_completions"
                    else OpenAIResponsesModel(model="stub-model", openai_client=client)
                ),
                tools=[function_tool(get_weather), function_tool(get_time)],
            )
            output = await stream_agents_run(run, Runner.run_streamed(assistant, run.content))
            outputs.append(output)
            await run.write_message(output)

    with OpenAIStub([TOOL_TURN, ANSWER_TURN]) as stub:
        result = await run_agent(dsn, agent, "Weather in Paris, time in Berlin?", schema=schema)
    assert result.status == "completed", result.error
    assert outputs == [ANSWER]
    assert result.text == ANSWER
    assert reasoning_of(result) == REASONING
    assert_tool_journal(result, started_together=True)
    # The SDK sent both results back in the follow-up request.
    if api == "chat_completions":
        follow_up = stub.requests[1]["messages"]
        results = {m["tool_call_id"]: m["content"] for m in follow_up if m["role"] == "tool"}
    else:
        follow_up = stub.requests[1]["input"]
        results = {i["call_id"]: i["output"] for i in follow_up if i.get("type") == "function_call_output"}
    assert set(results) == {WEATHER.id, TIME.id}
    assert results[WEATHER.id] == str(get_weather("Paris", "celsius"))  # the SDK sends str(output)
    assert results[TIME.id] == "14:05 in Europe/Berlin"


# -- runrow.adapters.pydantic_ai -----------------------------------------------------------


async def test_a_pydantic_ai_run_is_journaled(dsn: str, schema: str) -> None:
    pytest.importorskip("pydantic_ai", reason="runrow.adapters.pydantic_ai needs the pydantic-ai extra")
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from runrow.adapters.pydantic_ai import stream_pydantic_ai

    outputs: list[Any] = []

    async def agent(run: runrow.RunContext) -> None:
        async with AsyncOpenAI(base_url=stub.url, api_key="test", max_retries=0) as client:
            model = OpenAIChatModel("stub-model", provider=OpenAIProvider(openai_client=client))
            assistant = Agent(model, instructions="Answer with the tools.", tools=[get_weather, get_time])
            output = await stream_pydantic_ai(run, assistant, run.content)
            outputs.append(output)
            await run.write_message(output)

    with OpenAIStub([TOOL_TURN, ANSWER_TURN]) as stub:
        result = await run_agent(dsn, agent, "Weather in Paris, time in Berlin?", schema=schema)
    assert result.status == "completed", result.error
    assert outputs == [ANSWER]
    assert result.text == ANSWER
    assert reasoning_of(result) == REASONING
    assert_tool_journal(result, started_together=True)
    follow_up = stub.requests[1]["messages"]
    results = {m["tool_call_id"]: m["content"] for m in follow_up if m["role"] == "tool"}
    assert set(results) == {WEATHER.id, TIME.id}
    assert json.loads(results[WEATHER.id]) == get_weather("Paris", "celsius")
    assert results[TIME.id] == "14:05 in Europe/Berlin"


async def test_a_pydantic_ai_tool_asking_for_a_retry_is_journaled_as_not_ok(dsn: str, schema: str) -> None:
    pytest.importorskip("pydantic_ai", reason="runrow.adapters.pydantic_ai needs the pydantic-ai extra")
    from openai import AsyncOpenAI
    from pydantic_ai import Agent, ModelRetry
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from runrow.adapters.pydantic_ai import stream_pydantic_ai

    def get_weather(city: str, unit: str) -> dict[str, Any]:
        raise ModelRetry(f"no station in {city}; try a nearby city")

    async def agent(run: runrow.RunContext) -> None:
        async with AsyncOpenAI(base_url=stub.url, api_key="test", max_retries=0) as client:
            model = OpenAIChatModel("stub-model", provider=OpenAIProvider(openai_client=client))
            assistant = Agent(model, tools=[get_weather])
            await run.write_message(await stream_pydantic_ai(run, assistant, run.content))

    with OpenAIStub([Turn(tool_calls=(WEATHER,)), Turn(text="No weather for Paris today.")]) as stub:
        result = await run_agent(dsn, agent, "Weather?", schema=schema)
    assert result.status == "completed", result.error
    assert tool_events(result) == [
        ("tool_call_started", WEATHER.id, "get_weather"),
        ("tool_call_finished", WEATHER.id, "get_weather"),
    ]
    (finished,) = result.payloads("tool_call_finished")
    assert finished["ok"] is False and finished["outcome"] == "retried", finished
    assert "no station in Paris" in finished["error"]
    assert result.text == "No weather for Paris today."
    sent = [m for m in stub.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in sent] == [WEATHER.id]
    assert "no station in Paris" in sent[0]["content"]


# -- the examples docs/howto/adapters.md shows ------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "adapters"
WEATHER_CALL = Call("call_w1", "get_weather", '{"city": "Paris"}')
EXAMPLE_ANSWER = "It is 18 degrees and sunny in Paris."


@pytest.mark.parametrize(
    ("example", "needs"),
    [("openai_chat", "openai"), ("openai_agents_sdk", "agents"), ("pydantic_ai_agent", "pydantic_ai")],
)
async def test_the_documented_example_agents_run(
    example: str, needs: str, dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip(needs, reason=f"examples/adapters/{example}.py needs {needs}")
    spec = importlib.util.spec_from_file_location(f"runrow_example_{example}", EXAMPLES / f"{example}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with OpenAIStub([Turn(tool_calls=(WEATHER_CALL,)), Turn(text=EXAMPLE_ANSWER)]) as stub:
        monkeypatch.setenv("OPENAI_BASE_URL", stub.url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        result = await run_agent(dsn, module.agent, "Weather in Paris?", schema=schema)
    assert result.status == "completed", result.error
    assert result.text == EXAMPLE_ANSWER
    assert [(m.role, m.content) for m in result.transcript][-1] == ("assistant", EXAMPLE_ANSWER)
    assert tool_events(result) == [
        ("tool_call_started", WEATHER_CALL.id, "get_weather"),
        ("tool_call_finished", WEATHER_CALL.id, "get_weather"),
    ]
    assert result.payloads("tool_call_started")[0]["arguments"] == {"city": "Paris"}
    assert result.payloads("tool_call_finished")[0]["result"] == {
        "city": "Paris",
        "temperature_c": 18,
        "sky": "sunny",
    }
    sent = [m for m in stub.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in sent] == [WEATHER_CALL.id]
    assert stub.requests[0]["model"] == "gpt-4.1-mini"


@pytest.fixture(scope="module")
def fake_openai() -> Any:
    """examples/adapters/fake_openai.py started as docs/howto/adapters.md says, on a free port."""
    from .demo_support import free_port

    port = free_port()
    command = [sys.executable, str(EXAMPLES / "fake_openai.py"), str(port)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert (
                proc.stdout.readline().strip()
                == f"fake OpenAI-compatible server on http://127.0.0.1:{port}/v1"
            )
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()


@pytest.mark.parametrize(
    ("example", "needs"),
    [("openai_chat", "openai"), ("openai_agents_sdk", "agents"), ("pydantic_ai_agent", "pydantic_ai")],
)
async def test_the_documented_examples_run_against_the_documented_fake_server(
    example: str, needs: str, fake_openai: str, dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's copy-paste fake is enough to try each example offline: the tool call is
    journaled around the tool, and the answer (which quotes the tool's result) streams."""
    pytest.importorskip(needs, reason=f"examples/adapters/{example}.py needs {needs}")
    spec = importlib.util.spec_from_file_location(f"runrow_fake_{example}", EXAMPLES / f"{example}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, value in {
        "OPENAI_BASE_URL": fake_openai,
        "OPENAI_API_KEY": "fake",
        "OPENAI_MODEL": "fake",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(module, "MODEL", "fake")
    result = await run_agent(dsn, module.agent, "Weather in Paris?", schema=schema)
    assert result.status == "completed", result.error
    assert [(e[0], e[2]) for e in tool_events(result)] == [
        ("tool_call_started", "get_weather"),
        ("tool_call_finished", "get_weather"),
    ]
    assert result.payloads("tool_call_started")[0]["arguments"] == {"city": "Paris"}
    assert result.text.startswith("The tool says: ") and "sunny" in result.text, result.text
    assert result.transcript[-1].content == result.text


# -- the demo's agent on a real model ---------------------------------------------------------


async def test_the_demo_agent_answers_through_an_openai_compatible_server(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("openai", reason="the demo's model path needs the openai extra")
    import psycopg

    from runrow.demo import store
    from runrow.demo.agent import DemoAgent

    demo_schema = f"{schema}_demo"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await store.ensure_tables(conn, demo_schema)
    note = Call("call_note_1", "save_note", '{"text": "buy oat milk"}')
    answer = "Noted: buy oat milk."
    try:
        with OpenAIStub([Turn(tool_calls=(note,)), Turn(text=answer)]) as stub:
            monkeypatch.setenv("RUNROW_DEMO_OPENAI_BASE_URL", stub.url)
            monkeypatch.setenv("RUNROW_DEMO_OPENAI_MODEL", "local-model")
            monkeypatch.delenv("OPENAI_API_KEY", raising=False)
            agent = DemoAgent(conninfo=dsn, demo_schema=demo_schema, token_delay=0)
            result = await run_agent(dsn, agent, "Remember to buy oat milk", schema=schema)
        assert result.status == "completed", result.error
        assert result.text == answer
        assert [(m.role, m.content) for m in result.transcript][-1] == ("assistant", answer)
        assert tool_events(result) == [
            ("tool_call_started", note.id, "save_note"),
            ("tool_call_finished", note.id, "save_note"),
        ]
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            notes = await store.list_notes(conn, demo_schema, result.run.conversation_id)
        assert [n["text"] for n in notes] == ["buy oat milk"]
        assert result.payloads("tool_call_finished")[0]["result"] == {
            "note_id": notes[0]["id"],
            "notes_in_conversation": 1,
        }
        first, follow_up = stub.requests
        assert first["model"] == "local-model"
        assert first["messages"][1:] == [{"role": "user", "content": "Remember to buy oat milk"}]
        assert [t["function"]["name"] for t in first["tools"]] == ["save_note"]
        assert follow_up["messages"][-1]["tool_call_id"] == note.id
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{demo_schema}" CASCADE')


# -- packaging ----------------------------------------------------------------------------


def test_importing_runrow_adapters_imports_no_client_library() -> None:
    code = (
        "import sys, runrow, runrow.adapters\n"
        "loaded = sorted(m for m in ('openai', 'agents', 'pydantic_ai') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
