"""What both protocol encoders share: the SSE frame, the resume cursor and the id scheme.

A client resumes from the SSE id it saw last. One journal event may encode to several
frames, so an id names a frame inside an event: ``"12.0"``, ``"12.1"``, then ``"12"`` for
the last frame of event 12. ``"12"`` thus always means "all of event 12", whatever the
event encoded to, and a cut between two frames of one event resumes exactly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .._errors import InvalidInput

MAX_SEQ = 2**31 - 1
MAX_PART = 10_000
_CURSOR = re.compile(r"([0-9]{1,10})(?:\.([0-9]{1,5}))?")


@dataclass(frozen=True, slots=True)
class Frame:
    """One SSE message: its ``data`` (compact JSON, or ``"[DONE]"``) and ``event`` name."""

    data: str
    event: str | None = None


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a client is in a run's encoded stream.

    ``seq`` is the last journal seq the client saw any frame of (0: nothing). ``part`` is
    None when it saw every frame of that event, else the index of the last frame it saw.
    """

    seq: int
    part: int | None = None

    @classmethod
    def parse(cls, raw: str) -> Cursor:
        """Reads ``"12"`` or ``"12.3"`` (an SSE id this package produced)."""
        match = _CURSOR.fullmatch(raw) if isinstance(raw, str) else None
        if match is None:
            raise InvalidInput("cursor", f"must be digits, optionally '.' and digits, got {raw!r:.40}")
        seq = int(match.group(1))
        part = None if match.group(2) is None else int(match.group(2))
        if seq > MAX_SEQ:
            raise InvalidInput("cursor", f"seq must be at most {MAX_SEQ}")
        if part is not None and part > MAX_PART:
            raise InvalidInput("cursor", f"part must be at most {MAX_PART}")
        return cls(seq, part)

    def __str__(self) -> str:
        return str(self.seq) if self.part is None else f"{self.seq}.{self.part}"


def frame_id(seq: int, index: int, count: int) -> str:
    """The SSE id of frame ``index`` of the ``count`` frames event ``seq`` encoded to."""
    return str(seq) if index == count - 1 else f"{seq}.{index}"


def json_frame(value: dict[str, Any], event: str | None = None) -> Frame:
    """A frame whose data is ``value`` as compact JSON (no newline can reach the SSE text)."""
    return Frame(json.dumps(value, separators=(",", ":"), ensure_ascii=False), event)


def json_text(value: Any) -> str:
    """A JSON value as compact text, for protocols that carry JSON inside a string."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def error_text(payload: dict[str, Any]) -> str:
    """A terminal event's human-readable cause: its ``error``, else status and reason.

    runrow records an error as ``{"type", "message"}`` (the agent's exception, or its own
    ``worker_lost``, ``deadline_exceeded``...): that reads ``"type: message"``, the form
    of the worker's log line. A stream's reader is the run's owner, who can read the same
    error on the run's row and in its journal's terminal event anyway.
    """
    error = payload.get("error")
    if isinstance(error, dict):
        said = [error[k] for k in ("type", "message") if isinstance(error.get(k), str) and error[k]]
        if said:
            return ": ".join(said)
    if isinstance(error, str) and error:
        return error
    status = str(payload.get("status", "failed"))
    reason = payload.get("reason")
    return f"run {status}" + (f" ({reason})" if reason else "")


def delta_kind(payload: dict[str, Any]) -> str | None:
    """The part a ``content_delta`` belongs to: ``"text"`` (no ``stream``), ``"reasoning"``
    (``stream == "reasoning"``), or None for any other stream, which both protocols ignore."""
    stream = payload.get("stream")
    if stream is None:
        return "text"
    return "reasoning" if stream == "reasoning" else None
