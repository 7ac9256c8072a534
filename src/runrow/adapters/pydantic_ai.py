"""A PydanticAI agent's run, journaled: text, thinking and function tool calls.

``pip install runrow[pydantic-ai]``::

    from pydantic_ai import Agent

    assistant = Agent("openai:gpt-5.2", tools=[get_weather])

    async def agent(run: runrow.RunContext) -> None:
        output = await stream_pydantic_ai(run, assistant, run.content)
        await run.write_message(str(output))

PydanticAI runs the tools itself; this adapter reads the events of
``agent.run_stream_events(...)``: text part deltas go to ``run.text``, thinking part
deltas to the ``reasoning`` stream, each function tool call becomes
``tool_call_started`` and each function tool result ``tool_call_finished``.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic_ai.agent import AbstractAgent

    from .._engine.context import RunContext

__all__ = ["REASONING", "stream_pydantic_ai"]

REASONING = "reasoning"
"""The ``stream`` name thinking text is journaled under."""


def _jsonable(value: Any) -> Any:
    """``value`` as JSON (pydantic models and dataclasses as objects; anything else as text)."""
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value, fallback=str)


async def stream_pydantic_ai(
    run: RunContext, agent: AbstractAgent[Any, Any], prompt: Any, **kwargs: Any
) -> Any:
    """Runs ``agent`` on ``prompt`` (``kwargs`` go to ``agent.run_stream_events``:
    ``message_history``, ``deps``, ``model``, ...), journals its events as they come,
    and returns the run's output.

    ``tool_call_started`` carries the call's id, the tool's name and its arguments;
    ``tool_call_finished`` the id, the name and ``ok: True`` with the tool's ``result``,
    or ``ok: False`` with ``error`` when the call did not succeed (the tool failed, asked
    for a retry, or was denied: the return's ``outcome`` is kept too). Errors of the run
    itself propagate.
    """
    from pydantic_ai import AgentRunResultEvent
    from pydantic_ai.messages import (
        FunctionToolCallEvent,
        FunctionToolResultEvent,
        PartDeltaEvent,
        PartStartEvent,
        TextPart,
        TextPartDelta,
        ThinkingPart,
        ThinkingPartDelta,
    )

    output: Any = None
    opened: Any = agent.run_stream_events(prompt, **kwargs)
    # An async context manager in recent releases, a plain async iterator in older ones.
    async with opened if hasattr(opened, "__aenter__") else contextlib.nullcontext(opened) as events:
        async for event in events:
            if isinstance(event, PartStartEvent):
                # A part can start with text already in it; later deltas extend it.
                if isinstance(event.part, TextPart) and event.part.content:
                    await run.text(event.part.content)
                elif isinstance(event.part, ThinkingPart) and event.part.content:
                    await run.text(event.part.content, stream=REASONING)
            elif isinstance(event, PartDeltaEvent):
                delta = event.delta
                if isinstance(delta, TextPartDelta) and delta.content_delta:
                    await run.text(delta.content_delta)
                elif isinstance(delta, ThinkingPartDelta) and delta.content_delta:
                    await run.text(delta.content_delta, stream=REASONING)
            elif isinstance(event, FunctionToolCallEvent):
                call = event.part
                await run.emit(
                    {
                        "type": "tool_call_started",
                        "tool_call_id": call.tool_call_id,
                        "name": call.tool_name,
                        "arguments": _jsonable(call.args_as_dict()),
                    }
                )
            elif isinstance(event, FunctionToolResultEvent):
                part = event.part
                finished: dict[str, Any] = {
                    "type": "tool_call_finished",
                    "tool_call_id": part.tool_call_id,
                    "name": part.tool_name,
                }
                outcome = getattr(part, "outcome", "success")
                if outcome == "success":
                    finished.update(ok=True, result=_jsonable(part.content))
                else:
                    finished.update(ok=False, error=str(part.content), outcome=outcome)
                await run.emit(finished)
            elif isinstance(event, AgentRunResultEvent):
                output = event.result.output
    return output
