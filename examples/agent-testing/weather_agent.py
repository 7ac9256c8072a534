"""A small agent to test: it streams a model's answer and can look up the weather.

The agent takes its model as an argument, so a test hands it a scripted one
(``runrow.testing.ScriptedModel``) and production an adapter around a real client. A
model is anything whose ``stream(messages)`` returns an async iterator of chunks: a
``str`` is text to stream to the user; any other chunk is a tool call with ``id``,
``name`` and ``arguments``. In production, bind it once and run the result with
``runrow worker``: ``agent = make_agent(MyModelAdapter())``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import runrow


class Model(Protocol):
    def stream(self, messages: list[dict[str, Any]], /) -> AsyncIterator[Any]: ...


FORECASTS = {"Paris": "sunny, 21 °C", "Oslo": "snow, -4 °C"}


def get_weather(city: str) -> str:
    """The agent's one tool."""
    return FORECASTS.get(city, "no forecast")


TOOLS = {"get_weather": get_weather}


def make_agent(model: Model) -> runrow.Agent:
    """The agent loop, bound to ``model``: stream, call tools, ask again, answer."""

    async def agent(run: runrow.RunContext) -> None:
        messages = [{"role": m.role, "content": m.content} for m in await run.transcript()]
        answer = ""
        while True:
            calls = []
            async for chunk in model.stream(messages):
                if isinstance(chunk, str):
                    await run.text(chunk)
                    answer += chunk
                else:
                    calls.append(chunk)
            if not calls:
                break
            for call in calls:
                # Started before the side effect, finished after it: a run cut short in
                # between lists the call as uncertain instead of guessing.
                started = {"tool_call_id": call.id, "name": call.name, "arguments": call.arguments}
                await run.emit({"type": "tool_call_started", **started})
                result = TOOLS[call.name](**call.arguments)
                await run.emit({"type": "tool_call_finished", "tool_call_id": call.id, "ok": True})
                content = {"tool_call_id": call.id, "name": call.name, "result": result}
                await run.write_message(content, role="tool")
                messages.append({"role": "tool", "content": content})
        await run.write_message(answer)

    return agent
