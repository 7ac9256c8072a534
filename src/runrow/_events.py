"""The journal: a per-run event log written behind a fence and read from a cursor.

Event vocabulary (``type`` plus payload keys). A type is an identifier: an ASCII
letter, then ASCII letters, digits, ``_``, ``.``, ``:`` or ``-``, at most 64 characters
(``emit`` raises :class:`InvalidInput` for any other).

* ``user_message_created`` ``{"message_id"}`` — seq 1, written by enqueue.
* ``run_queued`` ``{"run_id"}`` (``retry_of`` for a retry; ``attempt`` too for an
  automatic one) — seq 2, written by enqueue.
* ``content_delta`` ``{"delta": str, "stream"?: str}`` — streamed text. Consecutive
  deltas with the same other keys are merged in memory and flushed on a clock.
* ``tool_call_started`` ``{"tool_call_id": str|int, "name": str, ...}`` and
  ``tool_call_finished`` ``{"tool_call_id", "name"?, "ok"?, ...}`` — emitted by the agent
  around each tool call (any further keys are the agent's). runrow reads only
  ``tool_call_id`` (matching is by equal JSON value) and ``name``: a run that ends
  without its worker lists every started id with no matching finished one as
  uncertain. Emit ``tool_call_started`` before the side effect and
  ``tool_call_finished`` after it, so the list is honest.
* ``input_requested`` ``{"key", "request", "expires_at"}`` — the run paused to wait for a
  person's input (``RunContext.wait_for_input``): ``request`` is what the agent asked
  with, ``expires_at`` when the wait ends if no input comes (null: never). The run is
  ``waiting`` until ``input_provided`` ``{"key", "value"}`` (written by
  ``provide_input``), then runs on with the next seq. Only runrow writes either.
* ``children_awaited`` ``{"key", "children", "first"}`` — the run paused to wait for its
  child runs (``RunContext.wait_for_children``): ``children`` are their ids, ``first``
  whether the first to end is enough. The run is ``waiting`` until they have ended, then
  runs on with the next seq. Only runrow writes it.
* ``usage`` ``{"input_tokens": int, "output_tokens": int, "cost": number}`` — what a
  model call cost (``RunContext.record_usage``; only runrow writes it). It rides the
  run's next flush (or its ending) and the statement that journals it adds it to the
  tenant's and agent key's usage rollup.
* ``retry_later`` ``{"after", "key"}`` — the agent raised ``runrow.RetryLater``: the run
  went back to the queue, due in ``after`` seconds (with ``key``, that key's gate shut as
  long), spending no attempt; it runs on with the next seq when claimed again. Only
  runrow writes it.
* ``steering_delivered`` ``{"message_id", "run_id", "content", "user_id"}`` — a steering
  message (``enqueue(on_busy="steer")``, sent as run ``run_id``) delivered into this
  run: the agent read it (``RunContext.steering``), at this point of its journal. One
  event per message, in the order they were sent. Only runrow writes it.
* anything else the agent emits (``message_done``, ...) is structural too: it flushes
  pending text and is written at once.
* ``complete`` ``{"status", "error"?, "reason"?, "uncertain_tool_calls"?}`` — the one
  terminal event, always last. Only runrow writes it (the worker's finalize, the reaper
  or a stop). ``reason``: ``stopped`` (a stop or interrupt ended it while running),
  ``stopped_before_start`` (cancelled while queued), ``deadline_exceeded`` (its worker
  ended it at its deadline, or the reaper did: its deadline passed while its lease still
  held), ``worker_lost`` (the reaper ended it after its lease lapsed; a run both lost and
  past its deadline gets whichever passed first), ``input_expired`` (it waited for input
  past the wait's timeout: status ``expired``), ``steered`` (a steering message's turn
whose message a running turn read: status ``absorbed``, with ``into``, the run that
read it; written by that run's delivery). A reaper-written event always carries
  ``uncertain_tool_calls``: ``[{"tool_call_id", "name"}, ...]`` in start order, the tool
  calls whose side effects may or may not have happened (``[]`` when none, and always
  for a run that waited for input: it parked on purpose, cut in no call).

Seq is gap-free from 1: enqueue writes 1-2, the claim holder the rest, and a finaliser
that is not the worker (reaper, stop) takes max+1 only after the status change has
fenced the worker out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import _json
from ._errors import InvalidInput

if TYPE_CHECKING:
    import uuid

__all__ = [
    "CHILDREN_AWAITED",
    "CONTENT_DELTA",
    "ENDING_REASONS",
    "INPUT_PROVIDED",
    "INPUT_REQUESTED",
    "KEEPALIVE",
    "RETRY_LATER",
    "RUN_QUEUED",
    "STEERING_DELIVERED",
    "TERMINAL_EVENT",
    "TOOL_CALL_FINISHED",
    "TOOL_CALL_STARTED",
    "USAGE",
    "USER_MESSAGE_CREATED",
    "Event",
    "checked_event",
    "validate_event",
]

# The names above, as code uses them. The SQL that writes or reads events (enqueue and
# retry, finalize, ending_landed, reap, cancel_queued) spells them as literals and
# points here; tests/test_layout.py checks the two agree.
USER_MESSAGE_CREATED = "user_message_created"
RUN_QUEUED = "run_queued"
CONTENT_DELTA = "content_delta"
TOOL_CALL_STARTED = "tool_call_started"
TOOL_CALL_FINISHED = "tool_call_finished"
TERMINAL_EVENT = "complete"
INPUT_REQUESTED = "input_requested"
INPUT_PROVIDED = "input_provided"
CHILDREN_AWAITED = "children_awaited"
USAGE = "usage"
RETRY_LATER = "retry_later"
STEERING_DELIVERED = "steering_delivered"
KEEPALIVE = "keepalive"  # never stored: a tail's idle marker
ENDING_REASONS = (
    "stopped", "stopped_before_start", "deadline_exceeded", "worker_lost", "input_expired", "steered"
)  # fmt: skip
"""The terminal event's ``reason`` values (see the list above)."""
DEFAULT_MAX_EVENT_BYTES = 256 * 1024
MAX_EVENT_TYPE_LENGTH = 64
# An event type is an identifier: an ASCII letter, then ASCII letters, digits, "_", ".",
# ":" or "-". Types travel in batches, SSE "event:" lines and logs: no NUL, no lone
# surrogate, no newline can reach any of them.
_EVENT_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]*")


@dataclass(frozen=True, slots=True)
class Event:
    """One journal event as a tail yields it. ``seq`` is the resume cursor.

    A keepalive (``type == "keepalive"``) carries the current cursor and no payload.
    """

    seq: int
    type: str
    payload: dict[str, Any] = field(default_factory=dict)
    run_id: uuid.UUID | None = None
    """In a tree's stream (``tail(..., tree=True)``): the run whose journal holds the
    event; ``seq`` is then its position in the tree's stream. None in a run's own stream."""
    run_seq: int | None = None
    """In a tree's stream: the event's seq in its own run's journal."""
    final: bool = False
    """In a tree's stream: True on its last event, the root's ending (the other runs'
    endings, and a root attempt's that was retried, come before it)."""

    @property
    def keepalive(self) -> bool:
        return self.type == KEEPALIVE

    @property
    def terminal(self) -> bool:
        """The stream's last event: a run's ending, or in a tree's stream the root's."""
        return self.type == TERMINAL_EVENT and (self.run_id is None or self.final)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: the payload with ``type`` and ``seq`` added (and, in a tree's
        stream, ``run_id`` and ``run_seq``)."""
        if self.run_id is None:
            return {**self.payload, "type": self.type, "seq": self.seq}
        return {
            **self.payload,
            "type": self.type,
            "seq": self.seq,
            "run_id": str(self.run_id),
            "run_seq": self.run_seq,
        }


def validate_event(event: Mapping[str, Any], max_bytes: int) -> tuple[str, dict[str, Any]]:
    """Splits an emitted event into its type and payload, or raises InvalidInput."""
    etype, payload, _ = checked_event(event, max_bytes)
    return etype, payload


def checked_event(event: Mapping[str, Any], max_bytes: int) -> tuple[str, dict[str, Any], str | None]:
    """:func:`validate_event`, plus the payload's JSON text for any event but a text
    delta (checking it means encoding it: the writer keeps that text rather than encode
    the payload a second time; a delta's payload is merged with others first)."""
    if not isinstance(event, Mapping):
        raise InvalidInput("event", f"must be a mapping, got {type(event).__name__}")
    etype = event.get("type")
    if not isinstance(etype, str) or not etype:
        raise InvalidInput("event", "needs a non-empty string 'type'")
    if len(etype) > MAX_EVENT_TYPE_LENGTH or not _EVENT_TYPE.fullmatch(etype):
        raise InvalidInput(
            "event",
            f"type {etype[:MAX_EVENT_TYPE_LENGTH]!r} must be an identifier: an ASCII letter, then "
            f"ASCII letters, digits, '_', '.', ':' or '-', at most {MAX_EVENT_TYPE_LENGTH} characters",
        )
    if etype in (
        TERMINAL_EVENT, KEEPALIVE, INPUT_REQUESTED, INPUT_PROVIDED, CHILDREN_AWAITED, USAGE, RETRY_LATER,
        STEERING_DELIVERED,
    ):  # fmt: skip
        raise InvalidInput("event", f"type {etype!r} is reserved for runrow")
    payload = {k: v for k, v in event.items() if k != "type"}
    if etype == CONTENT_DELTA:
        # The hot path (thousands per turn): check the text itself rather than serialise
        # the whole event; only the other keys (a stream name, say) go through JSON.
        delta = payload.get("delta")
        if not isinstance(delta, str):
            raise InvalidInput("event", "a content_delta needs a string 'delta'")
        if "\x00" in delta:
            raise InvalidInput("event", "must not contain NUL characters (\\u0000); jsonb rejects them")
        try:
            size = len(delta.encode())
        except UnicodeEncodeError:
            raise InvalidInput("event", "the delta is not valid Unicode text") from None
        if size > max_bytes:
            raise InvalidInput("event", f"is larger than the limit of {max_bytes} bytes")
        if len(payload) > 1:
            _json.dumps({k: v for k, v in payload.items() if k != "delta"}, "event", max_bytes)
        return etype, payload, None
    return etype, payload, _json.dumps(payload, "event", max_bytes)  # serialisable, NUL-free, bounded
