"""The ``openai`` client's streams, journaled: text, reasoning and tool calls.

``pip install runrow[openai]``. Works with any OpenAI-compatible server (vLLM, Ollama,
LiteLLM, ...) through ``AsyncOpenAI(base_url=...)``::

    stream = await client.chat.completions.create(model=..., messages=messages, tools=tools, stream=True)
    turn = await stream_chat_completion(run, stream)
    messages.append(turn.message)
    for call in turn.tool_calls:
        messages.append(await call_tool(run, call, TOOLS[call.name]))

Text deltas go to ``run.text`` as they arrive; reasoning (``reasoning_content`` or
``reasoning`` deltas from compatible servers, the Responses API's reasoning text and
summaries) to ``run.text(..., stream="reasoning")``, a refusal to ``stream="refusal"``.
:func:`call_tool` journals ``tool_call_started`` before the tool runs and
``tool_call_finished`` after it.
"""

from __future__ import annotations

import inspect
import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.to_thread

from .._errors import LeaseLost, StepMismatch, StepUncertain
from .._events import TOOL_CALL_FINISHED, TOOL_CALL_STARTED

if TYPE_CHECKING:
    from collections.abc import AsyncIterable, Callable

    from openai.types.chat import ChatCompletionChunk
    from openai.types.responses import ResponseStreamEvent

    from .._engine.context import RunContext

__all__ = [
    "REASONING",
    "ChatTurn",
    "ResponseTurn",
    "ToolCall",
    "call_tool",
    "stream_chat_completion",
    "stream_response",
]

REASONING = "reasoning"
"""The ``stream`` name reasoning text is journaled under."""

# Failures of runrow's own bookkeeping: never handed to the model as a tool error.
_RUNROW_ERRORS = (LeaseLost, StepMismatch, StepUncertain)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model asked for."""

    id: str
    """The call's id (``call_...``), to send back with its result."""
    name: str
    arguments: Any
    """The arguments, parsed from JSON (a dict for a well-formed call; the raw text if
    it was not valid JSON)."""
    raw_arguments: str
    """The arguments as the model sent them."""
    api: Literal["chat", "responses"] = "chat"
    """Which API the call came from (it decides the shape of :func:`call_tool`'s result)."""


def _new_id() -> str:
    """An id for a call the server sent without one (runrow matches calls by id)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def _parse(raw: str) -> Any:
    try:
        return json.loads(raw or "{}")
    except ValueError:
        return raw


@dataclass(slots=True)
class ChatTurn:
    """The assistant turn a Chat Completions stream assembled to."""

    text: str = ""
    reasoning: str = ""
    refusal: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    """The stream's usage (sent when ``stream_options={"include_usage": True}``)."""

    @property
    def message(self) -> dict[str, Any]:
        """The turn as an assistant message, to append to the next request's ``messages``."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.raw_arguments}}
                for c in self.tool_calls
            ]
        return message


def _reasoning_of(delta: Any) -> str | None:
    """Reasoning text in a chunk's delta: compatible servers send it as an extra field."""
    extra = getattr(delta, "model_extra", None) or {}
    for key in ("reasoning_content", "reasoning"):
        value = extra.get(key)
        if isinstance(value, str) and value:
            return value
    return None


async def stream_chat_completion(run: RunContext, stream: AsyncIterable[ChatCompletionChunk]) -> ChatTurn:
    """Journals a streamed chat completion (``create(..., stream=True)``) and returns
    the assembled turn: text, reasoning, tool calls (fragments joined by index), finish
    reason and usage. Only the first choice (``n=1``) is read. A stream cut short (a
    stop cancels the agent) is closed."""
    turn = ChatTurn()
    calls: list[dict[str, str]] = []  # in the order they started
    slots: dict[int, dict[str, str]] = {}  # index -> the call it is filling
    try:
        async for chunk in stream:
            if chunk.usage is not None:
                turn.usage = chunk.usage.model_dump(exclude_none=True)
            for choice in chunk.choices:
                if choice.index != 0:
                    continue
                delta = choice.delta
                reasoning = _reasoning_of(delta)
                if reasoning:
                    turn.reasoning += reasoning
                    await run.text(reasoning, stream=REASONING)
                if delta.content:
                    turn.text += delta.content
                    await run.text(delta.content)
                if delta.refusal:
                    turn.refusal += delta.refusal
                    await run.text(delta.refusal, stream="refusal")
                for part in delta.tool_calls or ():
                    slot = slots.get(part.index)
                    # A new id at a used index is a new call (some servers send every call at index 0).
                    if slot is None or (part.id and slot["id"] and part.id != slot["id"]):
                        slot = slots[part.index] = {"id": "", "name": "", "arguments": ""}
                        calls.append(slot)
                    slot["id"] = part.id or slot["id"]
                    if part.function is not None:
                        slot["name"] = slot["name"] or part.function.name or ""
                        slot["arguments"] += part.function.arguments or ""
                if choice.finish_reason is not None:
                    turn.finish_reason = choice.finish_reason
    finally:
        await _close(stream)
    turn.tool_calls = [
        ToolCall(c["id"] or _new_id(), c["name"], _parse(c["arguments"]), c["arguments"]) for c in calls
    ]
    return turn


@dataclass(slots=True)
class ResponseTurn:
    """What a Responses API stream assembled to."""

    text: str = ""
    reasoning: str = ""
    refusal: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    response_id: str | None = None
    """The response's id: pass it as ``previous_response_id`` to go on server-side."""
    status: str | None = None
    """``completed``, ``incomplete`` or ``failed`` (None if the stream ended early)."""
    usage: dict[str, Any] | None = None
    output: list[dict[str, Any]] = field(default_factory=list)
    """The response's output items: append them to the next request's ``input`` (with
    the tool results) when you keep the conversation yourself."""


async def stream_response(run: RunContext, stream: AsyncIterable[ResponseStreamEvent]) -> ResponseTurn:
    """Journals a streamed response (``client.responses.create(..., stream=True)``) and
    returns what it assembled: text, reasoning (reasoning text and summaries), function
    calls in output order, and the final response's id, status, usage and output."""
    turn = ResponseTurn()
    from openai.types import responses as types

    reasoning_deltas = (types.ResponseReasoningTextDeltaEvent, types.ResponseReasoningSummaryTextDeltaEvent)
    endings = (types.ResponseCompletedEvent, types.ResponseIncompleteEvent, types.ResponseFailedEvent)
    calls: dict[str, tuple[int, dict[str, str]]] = {}  # item id -> (output index, call)
    try:
        async for event in stream:
            if isinstance(event, types.ResponseTextDeltaEvent):
                turn.text += event.delta
                await run.text(event.delta)
            elif isinstance(event, reasoning_deltas):
                turn.reasoning += event.delta
                await run.text(event.delta, stream=REASONING)
            elif isinstance(event, types.ResponseRefusalDeltaEvent):
                turn.refusal += event.delta
                await run.text(event.delta, stream="refusal")
            elif isinstance(event, (types.ResponseOutputItemAddedEvent, types.ResponseOutputItemDoneEvent)):
                item = event.item
                if isinstance(item, types.ResponseFunctionToolCall):
                    call = {"id": item.call_id, "name": item.name, "arguments": item.arguments}
                    calls[item.id or item.call_id] = (event.output_index, call)
            elif isinstance(event, types.ResponseFunctionCallArgumentsDoneEvent) and event.item_id in calls:
                calls[event.item_id][1]["arguments"] = event.arguments
            elif isinstance(event, endings):
                response = event.response
                turn.response_id, turn.status = response.id, response.status
                turn.usage = response.usage.model_dump(exclude_none=True) if response.usage else None
                turn.output = [item.model_dump(mode="json", exclude_none=True) for item in response.output]
    finally:
        await _close(stream)
    turn.tool_calls = [
        ToolCall(c["id"] or _new_id(), c["name"], _parse(c["arguments"]), c["arguments"], "responses")
        for _, c in sorted(calls.values(), key=lambda entry: entry[0])
    ]
    return turn


async def _close(stream: object) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        with anyio.CancelScope(shield=True):
            result = close()
            if inspect.isawaitable(result):
                await result


async def _invoke(fn: Callable[..., Any], arguments: Any) -> Any:
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments are not a JSON object: {arguments!r:.200}")
    if inspect.iscoroutinefunction(fn):
        return await fn(**arguments)
    result = await anyio.to_thread.run_sync(lambda: fn(**arguments))
    return await result if inspect.isawaitable(result) else result


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


async def call_tool(
    run: RunContext,
    call: ToolCall,
    fn: Callable[..., Any],
    *,
    step: bool | Literal["idempotent"] = False,
    key: str | None = None,
) -> dict[str, Any]:
    """Runs ``fn(**call.arguments)`` (sync: in a worker thread; async: awaited),
    journaled, and returns the tool's result as the next request's input item: a
    ``{"role": "tool", ...}`` message for Chat Completions, a ``function_call_output``
    item for the Responses API. A result that is not a string is sent as JSON.

    ``tool_call_started`` (id, name, arguments) is emitted before ``fn`` runs;
    ``tool_call_finished`` after, with ``ok`` and ``result``, or ``ok: False`` and
    ``error`` (``"Type: message"``) if ``fn`` raised: the error goes back to the model as
    the tool's output rather than failing the run.

    ``step=True`` makes the call a durable :meth:`~runrow.RunContext.step` (``"idempotent"``:
    an :meth:`~runrow.RunContext.idempotent_step`) under ``key`` (default ``tool:<name>``),
    so a retried turn gets the recorded result instead of calling ``fn`` again. Its
    result must then be JSON, and the agent's code up to the call deterministic: see
    docs/howto/adapters.md.
    """
    await run.emit(
        {"type": TOOL_CALL_STARTED, "tool_call_id": call.id, "name": call.name, "arguments": call.arguments}
    )
    finished: dict[str, Any] = {"type": TOOL_CALL_FINISHED, "tool_call_id": call.id, "name": call.name}
    try:
        if step:
            durable = run.idempotent_step if step == "idempotent" else run.step
            result = await durable(key or f"tool:{call.name}", _invoke, fn, call.arguments)
        else:
            result = await _invoke(fn, call.arguments)
    except _RUNROW_ERRORS:
        raise
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        await run.emit({**finished, "ok": False, "error": error})
        return _tool_output(call, f"Error: {error}")
    await run.emit({**finished, "ok": True, "result": _jsonable(result)})
    return _tool_output(call, result if isinstance(result, str) else json.dumps(result, default=str))


def _tool_output(call: ToolCall, output: str) -> dict[str, Any]:
    if call.api == "responses":
        return {"type": "function_call_output", "call_id": call.id, "output": output}
    return {"role": "tool", "tool_call_id": call.id, "content": output}
