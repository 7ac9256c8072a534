"""A streamed OpenAI Agents SDK run, journaled: text, reasoning and tool calls.

``pip install runrow[openai-agents]``::

    from agents import Agent, Runner

    async def agent(run: runrow.RunContext) -> None:
        result = Runner.run_streamed(assistant, run.content)
        output = await stream_agents_run(run, result)
        await run.write_message(str(output))

The SDK runs the tools itself; this adapter reads its stream: the model's text deltas
go to ``run.text`` (reasoning deltas to the ``reasoning`` stream), each ``tool_called``
item becomes ``tool_call_started`` and each ``tool_output`` item ``tool_call_finished``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .._events import TOOL_CALL_FINISHED, TOOL_CALL_STARTED

if TYPE_CHECKING:
    from agents import RunResultStreaming

    from .._engine.context import RunContext

__all__ = ["REASONING", "stream_agents_run"]

REASONING = "reasoning"
"""The ``stream`` name reasoning text is journaled under."""

_TEXT = "response.output_text.delta"
_REASONING = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")


def _arguments(raw_item: Any) -> Any:
    raw = raw_item.get("arguments") if isinstance(raw_item, dict) else getattr(raw_item, "arguments", None)
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw or "{}")
    except ValueError:
        return raw


def _jsonable(value: Any) -> Any:
    """``value`` as JSON (pydantic models and dataclasses as objects; anything else as text)."""
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value, fallback=str)


async def stream_agents_run(run: RunContext, result: RunResultStreaming) -> Any:
    """Journals a streamed Agents SDK run (``Runner.run_streamed(...)``) as it goes,
    and returns its ``final_output`` once the stream ends.

    ``tool_call_started`` carries the call's id, the tool's name and its parsed
    arguments; ``tool_call_finished`` the id, name, ``ok: True`` and the tool's output.
    (The SDK turns a tool's exception into an error message for the model by default,
    so that message is the output journaled.) Errors the run raises (max turns, a
    guardrail) propagate; a stop that cancels the agent cancels the SDK's run too.
    """
    from agents import RawResponsesStreamEvent, RunItemStreamEvent, ToolCallItem, ToolCallOutputItem

    names: dict[str, str] = {}
    done = False
    try:
        async for event in result.stream_events():
            if isinstance(event, RawResponsesStreamEvent):
                data = event.data
                delta = getattr(data, "delta", None)
                if isinstance(delta, str) and delta:
                    if data.type == _TEXT:
                        await run.text(delta)
                    elif data.type in _REASONING:
                        await run.text(delta, stream=REASONING)
            elif isinstance(event, RunItemStreamEvent):
                item = event.item
                if event.name == "tool_called" and isinstance(item, ToolCallItem):
                    call_id, name = item.call_id or "", item.tool_name or ""
                    names[call_id] = name
                    await run.emit(
                        {
                            "type": TOOL_CALL_STARTED,
                            "tool_call_id": call_id,
                            "name": name,
                            "arguments": _arguments(item.raw_item),
                        }
                    )
                elif event.name == "tool_output" and isinstance(item, ToolCallOutputItem):
                    call_id = item.call_id or ""
                    await run.emit(
                        {
                            "type": TOOL_CALL_FINISHED,
                            "tool_call_id": call_id,
                            "name": names.get(call_id, ""),
                            "ok": True,
                            "result": _jsonable(item.output),
                        }
                    )
        done = True
    finally:
        if not done:
            result.cancel()  # a stop, or an error of ours: the SDK's run task ends too
    return result.final_output
