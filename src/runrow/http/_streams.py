"""A run's journal as Server-Sent Events, in runrow's own format or a frontend protocol's.

runrow's format sends one SSE message per journal event (``id`` = seq, ``event`` = type)
and resumes from the seq after it. A protocol's format (``ai-sdk``, ``ag-ui``) is
encoded by :mod:`runrow.protocols`: its stream is always read from seq 1, so the
encoder's state (open text parts, tool calls) is rebuilt exactly, and what the client
already has (up to its cursor, which may fall between two frames of one event) is
dropped. Either way a finished run with nothing after the cursor answers 204, the one
answer that stops an EventSource from reconnecting for good. After ``trim``, a run's
stream in every format is one event, its ending synthesised from the run row, at seq 1.
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.responses import Response

import runrow

from ..protocols import FORMATS, Cursor, Frame, ProtocolStream
from ._errors import ApiError
from ._turns import close

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from psycopg_pool import AsyncConnectionPool

__all__ = ["RUNROW_FORMAT", "STREAM_FORMATS", "read_cursor", "stream_run"]

log = logging.getLogger("runrow.http")

RUNROW_FORMAT = "runrow"
STREAM_FORMATS = (RUNROW_FORMAT, *FORMATS)
MAX_SEQ = 2**31 - 1  # run_event.seq is an integer column
_SEQ = re.compile(r"[0-9]{1,10}")
# Lines end in LF alone: the SSE standard allows CRLF too, but AG-UI's client parser
# splits messages on a blank LF line only (and LF is what every client accepts).
SEP = "\n"
_NO_STORE = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def stream_format(raw: str | None) -> str:
    """The ``?format=`` value, checked (default: runrow's own)."""
    fmt = raw or RUNROW_FORMAT
    if fmt not in STREAM_FORMATS:
        raise ApiError(400, "bad_format", f"format must be one of: {', '.join(STREAM_FORMATS)}")
    return fmt


def read_cursor(headers: Mapping[str, str], query: Mapping[str, str], fmt: str) -> Cursor:
    """The client's cursor. ``Last-Event-ID`` (what an EventSource sends when it
    reconnects to the same URL) is newer than the URL's ``?from=`` and wins."""
    raw, source = headers.get("last-event-id"), "Last-Event-ID"
    if raw is not None:
        raw = raw.strip()  # a header value's padding is not part of it
    if not raw:  # absent, or empty: an EventSource that has seen no id yet
        raw, source = query.get("from"), "from"
    if raw is None:
        return Cursor(0)
    if fmt == RUNROW_FORMAT:
        if not _SEQ.fullmatch(raw) or int(raw) > MAX_SEQ:
            raise ApiError(400, "bad_cursor", f"{source} must be a whole number from 0 to {MAX_SEQ}")
        return Cursor(int(raw))
    try:
        return Cursor.parse(raw)
    except runrow.InvalidInput:
        raise ApiError(
            400, "bad_cursor", f"{source} must be an event id this stream sent (N or N.K), or 0"
        ) from None


def tree_flag(raw: str | None, info: runrow.RunInfo) -> bool:
    """The ``?tree=`` value, checked: a tree's stream is its root's."""
    if raw is None or raw.lower() in ("0", "false", ""):
        return False
    if raw.lower() not in ("1", "true"):
        raise ApiError(400, "bad_tree", "tree must be true or false")
    if info.root_run_id is not None:
        raise ApiError(
            400, "not_a_root", f"run {info.id} is a child: read its root's tree, {info.root_run_id}"
        )
    return True


async def stream_run(
    pool: AsyncConnectionPool[Any],
    info: runrow.RunInfo,
    *,
    fmt: str,
    cursor: Cursor,
    hub: runrow.NotifyHub | None,
    keepalive: float,
    schema: str,
    tree: bool = False,
    read_from: AsyncConnectionPool[Any] | None = None,
) -> Response:
    """The response for one run's stream from ``cursor`` (204 when a finished run has
    nothing more); with ``tree``, the stream of the tree it is the root of. ``read_from``:
    a hot standby's pool the run's events are read from (a tree's are read on the primary:
    its reads write)."""
    replica = None if tree else read_from
    if fmt == RUNROW_FORMAT:
        return await _runrow_stream(
            pool, info, cursor.seq, hub=hub, keepalive=keepalive, schema=schema, tree=tree, read_from=replica
        )
    encoder = ProtocolStream(
        fmt, run_id=info.id, conversation_id=info.conversation_id, after=cursor, tree=tree
    )
    events = runrow.tail(
        pool, info.id, from_seq=0, hub=hub, keepalive=keepalive, schema=schema, tree=tree, read_from=replica
    )
    headers = {**_NO_STORE, **encoder.headers}
    if info.terminal:
        # Finished: read up to the first frame to send, so that nothing-left is a 204 and
        # not an empty 200; the rest streams as it is read.
        try:
            first = await _first_frames(events, encoder)
        except runrow.RunNotFound:  # trimmed or deleted meanwhile
            first = []
        except BaseException:
            await close(events)
            raise
        if not first:
            await close(events)
            return Response(status_code=204, headers=_NO_STORE)
        return EventSourceResponse(_encode_live(events, encoder, first), ping=0, sep=SEP, headers=headers)
    return EventSourceResponse(_encode_live(events, encoder, []), ping=0, sep=SEP, headers=headers)


async def _first_frames(
    events: AsyncIterator[runrow.Event], encoder: ProtocolStream
) -> list[tuple[str, Frame]]:
    """Feeds ``events`` until one gives frames to send (the tail stays open for the rest)."""
    while True:
        try:
            ev = await anext(events)
        except StopAsyncIteration:
            return []
        if not ev.keepalive and (pairs := encoder.feed(ev)):
            return pairs


async def _encode_live(
    events: AsyncIterator[runrow.Event], encoder: ProtocolStream, ready: list[tuple[str, Frame]]
) -> AsyncIterator[ServerSentEvent]:
    try:
        for sse_id, frame in ready:
            yield ServerSentEvent(data=frame.data, event=frame.event, id=sse_id, sep=SEP)
        async for ev in events:
            if ev.keepalive:
                yield ServerSentEvent(comment="keepalive", sep=SEP)
                continue
            for sse_id, frame in encoder.feed(ev):
                yield ServerSentEvent(data=frame.data, event=frame.event, id=sse_id, sep=SEP)
    except runrow.RunNotFound:  # trimmed or deleted meanwhile
        return
    finally:
        await close(events)


async def _runrow_stream(
    pool: AsyncConnectionPool[Any],
    info: runrow.RunInfo,
    start: int,
    *,
    hub: runrow.NotifyHub | None,
    keepalive: float,
    schema: str,
    tree: bool,
    read_from: AsyncConnectionPool[Any] | None,
) -> Response:
    events = runrow.tail(
        pool,
        info.id,
        from_seq=start,
        hub=hub,
        keepalive=keepalive,
        schema=schema,
        tree=tree,
        read_from=read_from,
    )
    first: runrow.Event | None = None
    if info.terminal:
        # A finished run's tail answers at once: with nothing after the cursor, say 204.
        try:
            first = await anext(events)
        except (StopAsyncIteration, runrow.InvalidInput, runrow.RunNotFound):
            first = None
        if first is not None and start > 0 and first.payload.get("synthesized"):
            # A trimmed journal is its synthesised ending alone, at seq 1 (as the protocol
            # formats read it): a client past 0 has it, or all there was before the trim.
            # (The tail would synthesise one after any cursor, each reconnect one higher.)
            first = None
        if first is None:
            await close(events)
            return Response(status_code=204, headers=_NO_STORE)
    return EventSourceResponse(_runrow_events(events, first), ping=0, sep=SEP, headers=_NO_STORE)


async def _runrow_events(
    events: AsyncIterator[runrow.Event], first: runrow.Event | None
) -> AsyncIterator[ServerSentEvent]:
    async def all_events() -> AsyncIterator[runrow.Event]:
        if first is not None:
            yield first
        async for ev in events:
            yield ev

    try:
        async for ev in all_events():
            if ev.keepalive:
                yield ServerSentEvent(comment="keepalive", sep=SEP)
                continue
            yield ServerSentEvent(
                data=json.dumps(ev.to_dict(), ensure_ascii=False, default=str),
                event=ev.type,
                id=str(ev.seq),
                sep=SEP,
            )
    except runrow.RunNotFound:  # trimmed or deleted meanwhile
        return
    except runrow.InvalidInput as exc:
        # A cursor past the end of a live run's journal (not from this run's stream).
        # Ending the stream makes the client reconnect; once the run ends, that is a 204.
        log.info("event stream refused: %s", exc)
    finally:
        await close(events)
