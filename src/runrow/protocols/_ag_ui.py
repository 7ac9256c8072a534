"""AG-UI events (protocol 1.0), sent as data-only SSE messages with camelCase JSON.

The mapping:

* the first event: ``RUN_STARTED`` (``threadId``: the conversation, ``runId``: the run);
* ``content_delta`` without ``stream``: an assistant text message (``TEXT_MESSAGE_START``
  / ``_CONTENT`` / ``_END``, id ``<run_id>-text-<seq>``); with ``stream == "reasoning"``:
  a reasoning message (``REASONING_START``, ``REASONING_MESSAGE_START`` / ``_CONTENT`` /
  ``_END``, ``REASONING_END``, id ``<run_id>-reasoning-<seq>``); other streams and empty
  deltas are ignored. A message spans consecutive deltas of its kind; any other event
  closes it first;
* ``tool_call_started``: ``TOOL_CALL_START`` (``parentMessageId``: the run's latest text
  message, if any), ``TOOL_CALL_ARGS`` (the arguments as JSON text), ``TOOL_CALL_END``;
* ``tool_call_finished``: ``TOOL_CALL_RESULT`` (``content``: the result as JSON text, or
  the error text when ``ok`` is false; id ``<run_id>-result-<seq>``);
* ``input_requested`` / ``input_provided``: ``CUSTOM`` named ``runrow.input_requested`` /
  ``runrow.input_provided`` with the journal payload as ``value``. AG-UI's interrupts end
  the run and resume it as a new one; a runrow run stays the same run while it waits;
* ``steering_delivered``: ``CUSTOM`` named ``runrow.steering_delivered`` (the payload as
  ``value``): a steering message the run read, where it read it;
* other events: nothing;
* ``complete``: ``RUN_FINISHED`` when completed; for an ``absorbed`` run (its message read
  by another run) ``CUSTOM`` ``runrow.absorbed`` (``{"into"}``), then ``RUN_FINISHED``;
  else ``RUN_ERROR`` (``code``: the status, ``message``: the error, or the status and reason).
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
from ._base import Frame, delta_kind, error_text, json_frame, json_text

if TYPE_CHECKING:
    import uuid

HEADERS: dict[str, str] = {}


class AgUiEncoder:
    """Turns one run's journal, in seq order, into AG-UI events."""

    def __init__(self, run_id: uuid.UUID, conversation_id: str) -> None:
        self._run = {"threadId": conversation_id, "runId": str(run_id)}
        self._prefix = str(run_id)
        self._started = False
        self._open: tuple[str, str] | None = None  # (kind "text" | "reasoning", message id)
        self._last_text: str | None = None
        self._tools: set[str] = set()

    def encode(self, event: Event) -> list[Frame]:
        """The frames ``event`` encodes to, given every earlier event was encoded."""
        out: list[dict[str, Any]] = []
        if not self._started:
            self._started = True
            out.append({"type": "RUN_STARTED", **self._run})
        payload = event.payload
        if event.type == CONTENT_DELTA:
            kind = delta_kind(payload)
            delta = payload.get("delta")
            if kind is not None and isinstance(delta, str) and delta:
                out += self._delta(kind, delta, event.seq)
            return [json_frame(e) for e in out]
        out += self._close()
        if event.type == TOOL_CALL_STARTED:
            out += self._tool_started(payload)
        elif event.type == TOOL_CALL_FINISHED:
            out += self._tool_finished(payload, event.seq)
        elif event.type in (INPUT_REQUESTED, INPUT_PROVIDED, STEERING_DELIVERED):
            out.append({"type": "CUSTOM", "name": f"runrow.{event.type}", "value": payload})
        elif event.type == TERMINAL_EVENT:
            if payload.get("status") == "absorbed":  # (read into another run: no failure)
                out.append(
                    {"type": "CUSTOM", "name": "runrow.absorbed", "value": {"into": payload.get("into")}}
                )
            if payload.get("status") in ("completed", "absorbed"):
                out.append({"type": "RUN_FINISHED", **self._run})
            else:
                code = str(payload.get("status", "failed"))
                out.append({"type": "RUN_ERROR", "message": error_text(payload), "code": code})
        return [json_frame(e) for e in out]

    def _delta(self, kind: str, delta: str, seq: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._open is None or self._open[0] != kind:
            out += self._close()
            message_id = f"{self._prefix}-{kind}-{seq}"
            self._open = (kind, message_id)
            if kind == "text":
                self._last_text = message_id
                out.append({"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"})
            else:
                out.append({"type": "REASONING_START", "messageId": message_id})
                out.append({"type": "REASONING_MESSAGE_START", "messageId": message_id, "role": "reasoning"})
        content = "TEXT_MESSAGE_CONTENT" if kind == "text" else "REASONING_MESSAGE_CONTENT"
        out.append({"type": content, "messageId": self._open[1], "delta": delta})
        return out

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        kind, message_id = self._open
        self._open = None
        if kind == "text":
            return [{"type": "TEXT_MESSAGE_END", "messageId": message_id}]
        return [
            {"type": "REASONING_MESSAGE_END", "messageId": message_id},
            {"type": "REASONING_END", "messageId": message_id},
        ]

    def _tool_started(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        call_id = str(payload.get("tool_call_id"))
        if call_id in self._tools:
            return []  # a repeated start: the client already has this call
        self._tools.add(call_id)
        start: dict[str, Any] = {
            "type": "TOOL_CALL_START",
            "toolCallId": call_id,
            "toolCallName": str(payload.get("name", "tool")),
        }
        if self._last_text is not None:
            start["parentMessageId"] = self._last_text
        return [
            start,
            {
                "type": "TOOL_CALL_ARGS",
                "toolCallId": call_id,
                "delta": json_text(payload.get("arguments", {})),
            },
            {"type": "TOOL_CALL_END", "toolCallId": call_id},
        ]

    def _tool_finished(self, payload: dict[str, Any], seq: int) -> list[dict[str, Any]]:
        call_id = str(payload.get("tool_call_id"))
        # A result for a call the client never saw would dangle: announce the call first.
        out = [] if call_id in self._tools else self._tool_started({**payload, "arguments": {}})
        if payload.get("ok") is False:
            error = payload.get("error")
            content = error if isinstance(error, str) and error else "tool call failed"
        else:
            content = json_text(payload.get("result"))
        result = {
            "type": "TOOL_CALL_RESULT",
            "messageId": f"{self._prefix}-result-{seq}",
            "toolCallId": call_id,
            "content": content,
            "role": "tool",
        }
        return [*out, result]
