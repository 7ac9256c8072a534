"""Encoders from runrow's journal to frontend streaming protocols, free of I/O.

``ProtocolStream`` is fed a run's events from seq 1 and returns the SSE messages to send,
each with an SSE id that, given back as :class:`Cursor`, resumes after exactly that
message. Two formats: ``"ai-sdk"`` (the AI SDK's UI message stream v1) and ``"ag-ui"``
(AG-UI events). Every id inside the frames is derived from the run id and the journal, so
a resumed stream continues the same message parts the client already holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .._errors import InvalidInput
from . import _ag_ui, _ai_sdk, _tree
from ._base import Cursor, Frame, frame_id

if TYPE_CHECKING:
    import uuid
    from collections.abc import Mapping

    from .._events import Event

__all__ = ["FORMATS", "Cursor", "Frame", "ProtocolStream"]

FORMATS: tuple[str, ...] = ("ai-sdk", "ag-ui")
"""The formats :class:`ProtocolStream` encodes."""


class _Encoder(Protocol):
    def encode(self, event: Event) -> list[Frame]: ...


class ProtocolStream:
    """Encodes one run's journal, read from seq 1, for one protocol, and drops what the
    client already has (everything up to and including ``after``). With ``tree=True``,
    the stream of the tree whose root is ``run_id`` (see :mod:`._tree`), read from
    position 1.

    Every event must be fed, in seq order, even those the client has: the encoder's state
    (which parts are open, which tool calls were announced) is rebuilt from them.
    """

    def __init__(
        self,
        format: str,
        *,
        run_id: uuid.UUID,
        conversation_id: str,
        after: Cursor = Cursor(0),  # noqa: B008 (frozen, so sharing the default is safe)
        tree: bool = False,
    ) -> None:
        self._encoder: _Encoder
        if format == "ai-sdk":
            self._encoder = _ai_sdk.AiSdkEncoder(run_id)
            headers = _ai_sdk.HEADERS
        elif format == "ag-ui":
            self._encoder = _ag_ui.AgUiEncoder(run_id, conversation_id)
            headers = _ag_ui.HEADERS
        else:
            raise InvalidInput("format", f"must be one of {', '.join(FORMATS)}, got {format!r:.40}")
        if tree:  # a tree's stream (tail(root, tree=True)): its sub-agents are parts
            self._encoder = _tree.TreeEncoder(format, run_id, self._encoder)
        self.format = format
        self.after = after
        self.headers: Mapping[str, str] = dict(headers)
        """Extra response headers the protocol asks for."""

    def feed(self, event: Event) -> list[tuple[str, Frame]]:
        """The ``(SSE id, frame)`` pairs to send for ``event``; keepalives give none."""
        if event.keepalive:
            return []
        frames = self._encoder.encode(event)
        after = self.after
        if event.seq < after.seq:
            return []
        skip = 0
        if event.seq == after.seq:
            skip = len(frames) if after.part is None else after.part + 1
        count = len(frames)
        return [(frame_id(event.seq, i, count), frames[i]) for i in range(skip, count)]
