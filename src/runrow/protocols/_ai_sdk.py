"""The AI SDK's UI message stream, protocol v1 (what ``useChat`` and ``readUIMessageStream`` read).

One run is one assistant message, id ``run-<run_id>``. The mapping:

* the first event: ``start`` and ``start-step``;
* ``content_delta`` without ``stream``: a text part; with ``stream == "reasoning"``: a
  reasoning part; other streams and empty deltas are ignored (no frames, close nothing).
  A part spans consecutive deltas of its kind; any other event closes it (``text-end``)
  first, so a tool call or an agent event such as ``message_done`` splits the text;
* ``tool_call_started``: ``tool-input-start`` and ``tool-input-available``, as a
  ``dynamic`` tool (the client does not know runrow's tools) that is ``providerExecuted``
  (the server ran it: ``useChat`` must not call ``onToolCall`` for it);
* ``tool_call_finished``: ``tool-output-available`` (``output``: the ``result``, null if
  absent), or ``tool-output-error`` when ``ok`` is false;
* ``input_requested`` / ``input_provided``: one ``data-runrow-input`` part per key (id
  ``input-<key>``), ``{"status": "waiting", "key", "request", "expires_at"}`` and then the
  same part replaced with ``status: "provided"`` and the ``value``; a request still
  waiting when the run ends is replaced with ``status: "expired"`` (the run expired) or
  ``"closed"`` (it ended otherwise);
* ``steering_delivered``: a ``data-runrow-steering`` part (id ``steering-<message_id>``),
  ``{"message_id", "run_id", "content"}``: a steering message the run read, where it read it;
* other events (``user_message_created``, ``run_queued``, agent-defined ones): no frames;
* ``complete``: ``finish-step``; then ``error`` (failed, expired; ``errorText``: the run's
  recorded error, ``"type: message"``) or ``abort`` (cancelled); an ``absorbed`` run (its
  message read by another run, ``into``) sends a ``data-runrow-absorbed`` part
  ``{"into"}`` and no error;
  then ``finish`` and ``[DONE]``. ``useChat`` treats ``error`` as a failed request (status
  ``error``), keeping the parts it already has; ``readUIMessageStream`` carries on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._events import (
    CONTENT_DELTA,
    INPUT_PROVIDED,
    INPUT_REQUESTED,
    STEERING_DELIVERED,
    TERMINAL_EVENT,
    TOOL_CALL_FINISHED,
    TOOL_CALL_STARTED,
    Event,
)
from ._base import Frame, delta_kind, error_text, json_frame

if TYPE_CHECKING:
    import uuid

HEADERS = {"x-vercel-ai-ui-message-stream": "v1"}
DONE = Frame("[DONE]")
# A server-side tool the client has no definition for: shown as a "dynamic-tool" part and
# never handed to the client's onToolCall.
_TOOL_FLAGS = {"dynamic": True, "providerExecuted": True}


class AiSdkEncoder:
    """Turns one run's journal, in seq order, into UI message stream chunks."""

    def __init__(self, run_id: uuid.UUID) -> None:
        self._message_id = f"run-{run_id}"
        self._started = False
        self._open: tuple[str, str] | None = None  # (kind "text" | "reasoning", part id)
        self._tools: set[str] = set()
        self._inputs: dict[str, dict[str, Any]] = {}

    def encode(self, event: Event) -> list[Frame]:
        """The frames ``event`` encodes to, given every earlier event was encoded."""
        chunks: list[dict[str, Any]] = []
        if not self._started:
            self._started = True
            chunks += [{"type": "start", "messageId": self._message_id}, {"type": "start-step"}]
        payload = event.payload
        if event.type == CONTENT_DELTA:
            kind = delta_kind(payload)
            delta = payload.get("delta")
            if kind is None or not isinstance(delta, str) or not delta:
                return [json_frame(c) for c in chunks]
            if self._open is None or self._open[0] != kind:
                chunks += self._close()
                self._open = (kind, f"{kind}-{event.seq}")
                chunks.append({"type": f"{kind}-start", "id": self._open[1]})
            chunks.append({"type": f"{kind}-delta", "id": self._open[1], "delta": delta})
            return [json_frame(c) for c in chunks]
        chunks += self._close()
        if event.type == TOOL_CALL_STARTED:
            chunks += self._tool_started(payload)
        elif event.type == TOOL_CALL_FINISHED:
            chunks += self._tool_finished(payload)
        elif event.type in (INPUT_REQUESTED, INPUT_PROVIDED):
            chunks.append(self._input(event.type, payload))
        elif event.type == STEERING_DELIVERED:
            data = {k: payload.get(k) for k in ("message_id", "run_id", "content")}
            chunks.append(
                {"type": "data-runrow-steering", "id": f"steering-{data['message_id']}", "data": data}
            )
        elif event.type == TERMINAL_EVENT:
            chunks += self._unanswered(payload)
            return [json_frame(c) for c in chunks + _ending(payload)] + [DONE]
        return [json_frame(c) for c in chunks]

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        kind, part_id = self._open
        self._open = None
        return [{"type": f"{kind}-end", "id": part_id}]

    def _tool_started(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        call_id = str(payload.get("tool_call_id"))
        if call_id in self._tools:
            return []  # a repeated start: the client already has this call
        self._tools.add(call_id)
        name = str(payload.get("name", "tool"))
        arguments = payload.get("arguments", {})
        return [
            {"type": "tool-input-start", "toolCallId": call_id, "toolName": name, **_TOOL_FLAGS},
            {
                "type": "tool-input-available",
                "toolCallId": call_id,
                "toolName": name,
                "input": arguments,
                **_TOOL_FLAGS,
            },
        ]

    def _tool_finished(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        call_id = str(payload.get("tool_call_id"))
        # The client rejects an output for a call it never saw: announce one without input.
        chunks = [] if call_id in self._tools else self._tool_started({**payload, "arguments": {}})
        if payload.get("ok") is False:
            text = payload.get("error")
            text = text if isinstance(text, str) and text else "tool call failed"
            return [
                *chunks,
                {"type": "tool-output-error", "toolCallId": call_id, "errorText": text, **_TOOL_FLAGS},
            ]
        output = payload.get("result")
        return [
            *chunks,
            {"type": "tool-output-available", "toolCallId": call_id, "output": output, **_TOOL_FLAGS},
        ]

    def _input(self, etype: str, payload: dict[str, Any]) -> dict[str, Any]:
        key = str(payload.get("key"))
        if etype == INPUT_REQUESTED:
            data = {
                "status": "waiting",
                "key": key,
                "request": payload.get("request"),
                "expires_at": payload.get("expires_at"),
            }
        else:
            data = {
                **self._inputs.get(key, {"key": key}),
                "status": "provided",
                "value": payload.get("value"),
            }
        self._inputs[key] = data
        return {"type": "data-runrow-input", "id": f"input-{key}", "data": data}

    def _unanswered(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        # A request still waiting when the run ends will never be answered: say so, or a
        # UI rebuilt from this stream would offer to answer it forever.
        status = "expired" if payload.get("status") == "expired" else "closed"
        return [
            {"type": "data-runrow-input", "id": f"input-{key}", "data": {**data, "status": status}}
            for key, data in self._inputs.items()
            if data["status"] == "waiting"
        ]


def _ending(payload: dict[str, Any]) -> list[dict[str, Any]]:
    status = payload.get("status")
    chunks: list[dict[str, Any]] = [{"type": "finish-step"}]
    if status == "cancelled":
        chunks.append({"type": "abort", "reason": str(payload.get("reason") or "cancelled")})
    elif status == "absorbed":  # (its message went into another run's turn: no failure)
        chunks.append({"type": "data-runrow-absorbed", "data": {"into": payload.get("into")}})
    elif status != "completed":
        chunks.append({"type": "error", "errorText": error_text(payload)})
    chunks.append({"type": "finish"})
    return chunks
