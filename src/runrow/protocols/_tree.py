"""A tree's stream (``tail(root, tree=True)``) in a protocol: the root's turn is the
message, its sub-agents are parts of it.

The root's events (and its retries', once a retry's ``run_queued`` names the attempt it
retries) go to the protocol's own encoder as a run's would. A root attempt's ending that
is not the stream's last (it was retried) only closes what is open, and is said as a
part. Every other run of the tree is a sub-agent:

* AI SDK: one ``data-runrow-child`` part per child (id ``child-<run_id>``), replaced as
  it goes: ``{"run_id", "status", "text"}`` (``status``: ``queued``, ``running``, then its
  ending's; ``text``: what it has streamed so far, its text stream only), plus ``error``
  once it failed. A root attempt retried: ``data-runrow-attempt`` (id
  ``attempt-<run_id>``, ``{"run_id", "status", "error"}``).
* AG-UI: ``CUSTOM`` events named ``runrow.child`` (``value``: ``{"runId", "seq", "type",
  "payload"}``, the child's journal event as it is) and ``runrow.attempt_ended`` (the
  retried attempt's ending's payload, with ``runId``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._events import CONTENT_DELTA, RUN_QUEUED, TERMINAL_EVENT, TOOL_CALL_STARTED, Event
from ._base import Frame, delta_kind, json_frame

if TYPE_CHECKING:
    import uuid

    from . import _Encoder

_CLOSE = "runrow.attempt_ended"  # (an event type no journal holds: the encoder closes parts on it)


class TreeEncoder:
    """Encodes a tree's stream, in stream order, for ``format`` around its ``main`` encoder."""

    def __init__(self, format: str, root: uuid.UUID, main: _Encoder) -> None:
        self._format = format
        self._main = main
        self._rootline = {str(root)}
        self._children: dict[str, dict[str, Any]] = {}

    def encode(self, event: Event) -> list[Frame]:
        """The frames ``event`` encodes to, given every earlier event was encoded."""
        run = str(event.run_id)
        if event.type == RUN_QUEUED and str(event.payload.get("retry_of")) in self._rootline:
            self._rootline.add(run)
        if run in self._rootline:
            if event.type != TERMINAL_EVENT or event.final:
                return self._main.encode(event)
            # A root attempt that was retried: the next attempt's events follow.
            frames = self._main.encode(Event(event.seq, _CLOSE))
            return [*frames, json_frame(self._attempt(run, event.payload))]
        return [*self._main.encode(Event(event.seq, _CLOSE)), *self._child(run, event)]

    def _attempt(self, run: str, payload: dict[str, Any]) -> dict[str, Any]:
        if self._format == "ai-sdk":
            data = {"run_id": run, "status": payload.get("status"), "error": payload.get("error")}
            return {"type": "data-runrow-attempt", "id": f"attempt-{run}", "data": data}
        return {"type": "CUSTOM", "name": "runrow.attempt_ended", "value": {**payload, "runId": run}}

    def _child(self, run: str, event: Event) -> list[Frame]:
        if self._format != "ai-sdk":
            value = {"runId": run, "seq": event.run_seq, "type": event.type, "payload": event.payload}
            return [json_frame({"type": "CUSTOM", "name": "runrow.child", "value": value})]
        state = self._children.setdefault(run, {"run_id": run, "status": "queued", "text": ""})
        if event.type == CONTENT_DELTA:
            delta = event.payload.get("delta")
            if delta_kind(event.payload) != "text" or not isinstance(delta, str) or not delta:
                return []
            state["status"] = "running"
            state["text"] += delta
        elif event.type == TERMINAL_EVENT:
            state["status"] = event.payload.get("status")
            if event.payload.get("error") is not None:
                state["error"] = event.payload["error"]
        elif event.type == TOOL_CALL_STARTED and state["status"] == "queued":
            state["status"] = "running"
        elif event.type != RUN_QUEUED:
            return []
        return [json_frame({"type": "data-runrow-child", "id": f"child-{run}", "data": dict(state)})]
