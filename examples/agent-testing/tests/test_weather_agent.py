"""weather_agent's tests: a real PostgreSQL (runrow's pytest plugin), a scripted model."""

import anyio
import pytest
from weather_agent import make_agent

import runrow
from runrow.testing import ScriptedModel, ToolCall

pytestmark = pytest.mark.anyio


async def test_it_streams_the_answer_into_the_journal_and_the_transcript(runrow_run_agent):
    model = ScriptedModel(["Hello", ", ", "Ann!"])  # one response, in three text deltas

    result = await runrow_run_agent(make_agent(model), "hi")

    assert result.status == "completed"
    assert result.event_types == ["user_message_created", "run_queued", "content_delta", "complete"]
    assert result.text == "Hello, Ann!"
    assert [(m.role, m.content) for m in result.transcript] == [("user", "hi"), ("assistant", "Hello, Ann!")]
    assert model.requests == [[{"role": "user", "content": "hi"}]]  # what the agent sent the model


async def test_it_calls_the_weather_tool_and_answers_with_its_result(runrow_run_agent):
    model = ScriptedModel(
        [ToolCall("get_weather", {"city": "Paris"}, id="call_1")],  # response 1: a tool call
        ["It is sunny in Paris."],  # response 2, once the tool's result is in
    )

    result = await runrow_run_agent(make_agent(model), "Weather in Paris?")

    assert result.status == "completed"
    assert result.event_types == [
        "user_message_created",
        "run_queued",
        "tool_call_started",
        "tool_call_finished",
        "content_delta",
        "complete",
    ]
    assert result.payloads("tool_call_started") == [
        {"tool_call_id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}
    ]
    tool_message = {"tool_call_id": "call_1", "name": "get_weather", "result": "sunny, 21 °C"}
    assert [(m.role, m.content) for m in result.transcript] == [
        ("user", "Weather in Paris?"),
        ("tool", tool_message),
        ("assistant", "It is sunny in Paris."),
    ]
    assert model.requests[1][-1] == {"role": "tool", "content": tool_message}  # the model saw the result
    assert model.remaining == 0


async def test_a_model_failing_mid_answer_fails_the_run_and_keeps_the_partial_text(runrow_run_agent):
    model = ScriptedModel(["Let me think", RuntimeError("model overloaded")])

    result = await runrow_run_agent(make_agent(model), "hi")

    assert result.status == "failed"
    assert result.error == {"type": "RuntimeError", "message": "model overloaded"}
    assert result.events[-1].payload["status"] == "failed"
    assert [(m.role, m.content, m.status) for m in result.transcript] == [
        ("user", "hi", "sent"),
        ("assistant", "Let me think", "partial"),
    ]


async def test_a_follow_up_turn_reads_the_conversation_so_far(runrow_run_agent):
    model = ScriptedModel(["Paris is in France."], ["About two million people."])
    agent = make_agent(model)

    first = await runrow_run_agent(agent, "Where is Paris?")
    second = await runrow_run_agent(agent, "How big is it?", conversation_id=first.run.conversation_id)

    assert second.status == "completed"
    assert [m["content"] for m in model.requests[1]] == [
        "Where is Paris?",
        "Paris is in France.",
        "How big is it?",
    ]
    assert [m.content for m in second.transcript] == [
        "Where is Paris?",
        "Paris is in France.",
        "How big is it?",
        "About two million people.",
    ]


async def test_a_stop_cancels_the_run_mid_stream(runrow_database_url, runrow_schema, runrow_dispatcher):
    model = ScriptedModel(["word "] * 100, delay=0.1)  # ten seconds of streaming, unless stopped
    db, schema = runrow_database_url, runrow_schema

    async with runrow_dispatcher(make_agent(model), flush_interval=0.05) as dispatcher:
        run = await runrow.enqueue(db, schema=schema, conversation_id="c1", user_id="ann", content="talk")
        events, stopped = [], False
        with anyio.fail_after(30):
            async for event in runrow.tail(db, run.id, schema=schema, hub=dispatcher.hub):
                events.append(event)
                if event.type == "content_delta" and not stopped:  # the answer has begun: stop it
                    stopped = not (await runrow.stop_conversation(db, "c1", schema=schema)).noop

    assert stopped and events[-1].type == "complete"
    assert events[-1].payload["status"] == "cancelled" and events[-1].payload["reason"] == "stopped"
    assert (await runrow.get_run(db, run.id, schema=schema)).status == "cancelled"
