"""The journal: a per-run event log written behind a fence and read from a cursor.

Event vocabulary (``type`` plus payload keys). A type is an identifier: an ASCII
letter, then ASCII letters, digits, ``_``, ``.``, ``:`` or ``-``, at most 64 characters
(``emit`` raises :class:`InvalidInput` for any other).

* ``user_message_created`` ``{"message_id"}`` — seq 1, written by enqueue.
* ``run_queued`` ``{"run_id"}`` (``retry_of`` for a retry) — seq 2, written by enqueue.
* ``content_delta`` ``{"delta": str, "stream"?: str}`` — streamed text. Consecutive
  deltas with the same other keys are merged in memory and flushed on a clock.
* ``tool_call_started`` ``{"tool_call_id": str|int, "name": str, ...}`` and
  ``tool_call_finished`` ``{"tool_call_id", "name"?, "ok"?, ...}`` — emitted by the agent
  around each tool call (any further keys are the agent's). runrow reads only
  ``tool_call_id`` (matching is by equal JSON value) and ``name``: a run that ends
  without its worker lists every started id with no matching finished one as
  uncertain. Emit ``tool_call_started`` before the side effect and
  ``tool_call_finished`` after it, so the list is honest.
* anything else the agent emits (``message_done``, ...) is structural too: it flushes
  pending text and is written at once.
* ``complete`` ``{"status", "error"?, "reason"?, "uncertain_tool_calls"?}`` — the one
  terminal event, always last. Only runrow writes it (the worker's finalize, the reaper
  or a stop). ``reason``: ``stopped`` (a stop or interrupt ended it while running),
  ``stopped_before_start`` (cancelled while queued), ``deadline_exceeded`` (its worker
  ended it at its deadline, or the reaper did, its worker alive or not), ``worker_lost``
  (the reaper ended it after its lease lapsed). A reaper-written event always carries
  ``uncertain_tool_calls``: ``[{"tool_call_id", "name"}, ...]`` in start order, the tool
  calls whose side effects may or may not have happened (``[]`` when none).

Seq is gap-free from 1: enqueue writes 1-2, the claim holder the rest, and a finaliser
that is not the worker (reaper, stop) takes max+1 only after the status change has
fenced the worker out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from . import _aio, _json, _sql
from ._db import Database, configure_own, describe, execute, schema_guard, statement_conn
from ._models import TERMINAL
from ._names import DEFAULT_SCHEMA, Channels, check_schema
from .enqueue import parse_run_id
from .errors import InvalidInput, LeaseLost, RunNotFound

if TYPE_CHECKING:
    from ._groupcommit import GroupCommit
    from .hub import NotifyHub

__all__ = ["CONTENT_DELTA", "TERMINAL_EVENT", "Event", "tail"]

log = logging.getLogger("runrow.journal")

CONTENT_DELTA = "content_delta"
TERMINAL_EVENT = "complete"
KEEPALIVE = "keepalive"
DEFAULT_MAX_EVENT_BYTES = 256 * 1024
MAX_EVENT_TYPE_LENGTH = 64
# An event type is an identifier: an ASCII letter, then ASCII letters, digits, "_", ".",
# ":" or "-". Types travel in batches, SSE "event:" lines and logs: no NUL, no lone
# surrogate, no newline can reach any of them.
_EVENT_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]*")

# (run_id, claim_token, [(seq, type, payload_json), ...])
AppendItem = tuple[uuid.UUID, uuid.UUID, list[tuple[int, str, str]]]


@dataclass(frozen=True, slots=True)
class Event:
    """One journal event as a tail yields it. ``seq`` is the resume cursor.

    A keepalive (``type == "keepalive"``) carries the current cursor and no payload.
    """

    seq: int
    type: str
    payload: dict[str, Any] = field(default_factory=dict)

    @property
    def keepalive(self) -> bool:
        return self.type == KEEPALIVE

    @property
    def terminal(self) -> bool:
        return self.type == TERMINAL_EVENT

    def to_dict(self) -> dict[str, Any]:
        """The wire form: the payload with ``type`` and ``seq`` added."""
        return {**self.payload, "type": self.type, "seq": self.seq}


def validate_event(event: Mapping[str, Any], max_bytes: int) -> tuple[str, dict[str, Any]]:
    """Splits an emitted event into its type and payload, or raises InvalidInput."""
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
    if etype in (TERMINAL_EVENT, KEEPALIVE):
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
        return etype, payload
    _json.dumps(payload, "event", max_bytes)  # serialisable, NUL-free, bounded
    return etype, payload


# Failures of a flush that mean "these rows were refused and not written".
_REFUSED = (UnicodeError, psycopg.DataError)

# The terminal event's JSON for the endings that carry nothing but their status.
_STATUS_ONLY = {s: _json.dumps({"status": s}, "event") for s in ("completed", "failed", "cancelled")}


class JournalWriter:
    """Writes one run's events: merges text deltas, flushes on a clock, fenced.

    Owned by the dispatcher for the life of one claim.
    """

    def __init__(
        self,
        run_id: uuid.UUID,
        claim_token: uuid.UUID,
        next_seq: int,
        appender: GroupCommit[AppendItem, bool],
        *,
        flush_interval: float,
        max_event_bytes: int,
        on_lost: Callable[[], None],
        resolve: Callable[[uuid.UUID, uuid.UUID, list[int]], Awaitable[tuple[int, bool]]] | None = None,
        retry_budget: float = 10.0,
    ) -> None:
        self.run_id = run_id
        self.claim_token = claim_token
        self.next_seq = next_seq
        self._appender = appender
        self._interval = flush_interval
        self._max_bytes = max_event_bytes
        self._on_lost = on_lost
        self._resolve = resolve
        self.on_flush: Callable[[int], None] | None = None
        # Starts run_flusher as a task; called once, on the first merged delta, so a run
        # that streams nothing costs no flusher task (set by the owner).
        self.start_flusher: Callable[[], object] | None = None
        self.flusher_started = False
        self._retry_budget = retry_budget
        self._lock: anyio.Lock | None = None  # made at the first flush: most runs never flush
        self._pending: dict[str, Any] | None = None
        self._pending_key: str | None = None
        self._pending_parts: list[str] = []
        self._pending_since = 0.0
        self._has_pending = _aio.Event()
        self._answer: list[str] = []
        self.broken: BaseException | None = None
        self.rows_written = 0
        self.flushes = 0
        self.deltas = 0

    # -- what the agent calls ---------------------------------------------------------

    async def emit(self, event: Mapping[str, Any]) -> None:
        etype, payload = validate_event(event, self._max_bytes)
        self._check()
        if etype != CONTENT_DELTA:
            await self.flush(extra=(etype, payload))
            return
        self.deltas += 1
        delta = payload.pop("delta")
        # Deltas merge when their other keys match; most have none.
        key = json.dumps(payload, sort_keys=True, default=str) if payload else ""
        if "stream" not in payload:
            self._answer.append(delta)
        if self._pending is not None and key != self._pending_key:
            await self.flush()
        if self._pending is None:
            self._pending, self._pending_key = payload, key
            self._pending_parts = [delta]
            self._pending_since = _aio.now()
            self._has_pending.set()
            if not self.flusher_started and self.start_flusher is not None:
                self.flusher_started = True
                self.start_flusher()
        else:
            self._pending_parts.append(delta)
        if _aio.now() - self._pending_since >= self._interval:
            await self.flush()

    def answer_mark(self) -> int:
        """A mark of the streamed answer text so far, for :meth:`answer_taken`."""
        return len(self._answer)

    def answer_taken(self, upto: int | None = None) -> None:
        """The agent wrote its answer to the transcript: the text streamed before the
        mark ``upto`` (default: all of it) is no partial answer to keep."""
        del self._answer[: len(self._answer) if upto is None else upto]

    @property
    def answer_text(self) -> str | None:
        """Streamed default-stream text not yet written to the transcript, if any."""
        return "".join(self._answer) or None

    # -- flushing ---------------------------------------------------------------------

    def _take_pending(self) -> list[tuple[str, dict[str, Any]]]:
        if self._pending is None:
            return []
        payload = {**self._pending, "delta": "".join(self._pending_parts)}
        self._pending, self._pending_key, self._pending_parts = None, None, []
        self._has_pending = _aio.Event()
        return [(CONTENT_DELTA, payload)]

    def _number(self, events: list[tuple[str, dict[str, Any]]]) -> list[tuple[int, str, str]]:
        rows = []
        for i, (etype, payload) in enumerate(events):
            rows.append((self.next_seq + i, etype, _json.dumps(payload, "event")))
        return rows

    async def flush(self, extra: tuple[str, dict[str, Any]] | None = None, *, due_only: bool = False) -> None:
        """Writes pending text (and ``extra``) as one fenced batch.

        ``due_only`` (the flush clock) writes only text that has waited a full interval:
        if another flush took the text the clock woke for while this one waited for the
        lock, the text that arrived since waits for its own tick instead of becoming a
        tiny extra row.
        """
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            self._check()
            if due_only and (self._pending is None or _aio.now() < self._pending_since + self._interval):
                return
            events = self._take_pending() + ([extra] if extra else [])
            if not events:
                return
            rows = self._number(events)
            try:
                landed = await self._submit_resolving(rows)
            except _REFUSED as exc:
                # Refused for their content (by the driver before sending, or by the
                # server's statement, which then wrote nothing): these rows certainly did
                # not land, so the numbering still holds and the run can go on or end.
                raise InvalidInput("event", f"the database refused it ({describe(exc)})") from exc
            except BaseException as exc:
                # Unknown whether it landed: this writer cannot number another row.
                self.broken = exc
                raise
            if not landed:
                self.broken = LeaseLost(self.run_id)
                self._on_lost()
                raise self.broken
            self.next_seq += len(rows)
            self.rows_written += len(rows)
            self.flushes += 1
            if self.on_flush is not None:
                self.on_flush(len(rows))

    async def _submit_resolving(self, rows: list[tuple[int, str, str]]) -> bool:
        """Submits a flush; if the connection fails without an answer (a database restart,
        a cut connection), asks the database whether the rows landed and retries if not."""
        delay = 0.05
        deadline = anyio.current_time() + self._retry_budget
        while True:
            try:
                return await self._appender.submit((self.run_id, self.claim_token, rows))
            except (psycopg.OperationalError, psycopg.InterfaceError, TimeoutError) as exc:
                if self._resolve is None or anyio.current_time() + delay > deadline:
                    raise
                log.info(
                    "flush of run %s failed (%s); checking whether it landed",
                    self.run_id,
                    describe(exc),
                    extra={"run_id": str(self.run_id)},
                )
            while True:
                await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)
                try:
                    landed, owned = await self._resolve(self.run_id, self.claim_token, [r[0] for r in rows])
                    break
                except (psycopg.OperationalError, psycopg.InterfaceError, TimeoutError):
                    if anyio.current_time() + delay > deadline:
                        raise
            if landed == len(rows):
                return True
            if not owned:
                return False
            if landed:  # part of a batch cannot land alone; the seqs are someone else's
                raise LeaseLost(self.run_id)

    def final_rows(self, terminal: dict[str, Any]) -> list[tuple[int, str, str]]:
        """Pending text plus the terminal event, numbered, for the finalize statement."""
        rows = self._number(self._take_pending())
        seq = self.next_seq + len(rows)
        if len(terminal) == 1 and terminal.get("status") in _STATUS_ONLY:
            # Most endings are just {"status": ...}: their JSON is known in advance.
            return [*rows, (seq, TERMINAL_EVENT, _STATUS_ONLY[terminal["status"]])]
        return [*rows, (seq, TERMINAL_EVENT, _json.dumps(terminal, "event"))]

    def _check(self) -> None:
        if self.broken is not None:
            raise self.broken

    async def run_flusher(self) -> None:
        """Flushes merged text ``flush_interval`` after it started to accumulate."""
        while True:
            await self._has_pending.wait()
            await anyio.sleep_until(self._pending_since + self._interval)
            if self._pending is not None and self.broken is None:
                try:
                    await self.flush(due_only=True)
                except LeaseLost:
                    return
                except Exception as exc:
                    log.warning(
                        "journal flush failed for run %s: %s",
                        self.run_id,
                        describe(exc),
                        extra={"run_id": str(self.run_id)},
                    )
                    return


# -- reading: the tail ----------------------------------------------------------------


async def tail(
    db: Database,
    run_id: uuid.UUID | str,
    *,
    from_seq: int = 0,
    hub: NotifyHub | None = None,
    keepalive: float = 15.0,
    poll: float = 0.5,
    schema: str = DEFAULT_SCHEMA,
    batch: int = 500,
    prepared_statements: bool = True,
) -> AsyncIterator[Event]:
    """Yields the run's events after ``from_seq``, live, until its terminal event.

    Any process can serve a tail. It subscribes before its catch-up read (so no event
    can slip between the two), yields every event with its ``seq`` (pass the last one
    back as ``from_seq`` to resume: no gap, no duplicate), yields a keepalive after
    ``keepalive`` idle seconds, and ends after the terminal event. If the run ended
    without a journaled terminal event, one is synthesised from the run row. Without
    a hub (or while it is down) it polls every ``poll`` seconds. With one, an idle tail
    waits for a notification, reading again at most every ``keepalive`` seconds; once a
    read finds rows that came without a notification (a hub behind a transaction
    pooler, a dispatcher with ``journal_notify=False``), it polls every ``poll`` seconds
    until rows come announced again. A ``from_seq`` past the last event of the run's journal raises
    :class:`InvalidInput` (a trimmed journal ends with a synthesised event instead).
    Given a conninfo string, it keeps one connection of its own;
    ``prepared_statements=False`` is for a conninfo that points at a
    transaction-pooling pgbouncer.
    """
    check_schema(schema)
    rid = parse_run_id(run_id)
    if not isinstance(from_seq, int) or isinstance(from_seq, bool) or from_seq < 0:
        raise InvalidInput("from_seq", "must be a non-negative integer")
    if keepalive <= 0 or poll <= 0:
        raise InvalidInput("keepalive", "keepalive and poll must be positive")
    read_q = _sql.statement("read_events", schema)
    state_q = _sql.statement("run_terminal_state", schema)
    cursor = from_seq
    async with AsyncExitStack() as stack:
        own = isinstance(db, str)  # then the tail keeps one connection of its own
        conn_box: list[AsyncConnection] = []
        sub = None
        if hub is not None and hub.running:
            sub = await stack.enter_async_context(hub.subscribe(Channels.for_schema(schema).events(rid)))
        stack.push_async_callback(_close_all, conn_box)
        idle_since = anyio.current_time()
        backoff = poll
        # A connected hub's hints are trusted (an idle tail then waits for one, up to
        # the keepalive: a thousand tails of queued runs cost a read each per keepalive)
        # until a read finds rows that came without one, the evidence of a hub that
        # hears nothing for this run (journal_notify=False, a hub behind pgbouncer):
        # then the tail polls, until rows come announced again.
        trusted = True
        caught_up = False  # rows of the first read predate the subscription: no evidence
        heard = 0  # the subscription's notification count at the previous read
        more = False  # the previous read filled a batch: this one is its continuation
        while True:
            hints = sub.notified if sub is not None else 0
            read = False
            try:
                async with schema_guard(db, schema):
                    rows, state = await _read(
                        db, conn_box, own, read_q, state_q, rid, cursor, batch, prepared_statements
                    )
                read = True
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                # The database is unreachable for now: a tail waits it out (keepalives
                # continue), reconnecting as needed. A dropped read only costs latency.
                log.info(
                    "tail of run %s cannot read (%s); retrying",
                    rid,
                    describe(exc),
                    extra={"run_id": str(rid)},
                )
                await _close_all(conn_box)
                if isinstance(db, AsyncConnectionPool):
                    with contextlib.suppress(Exception):
                        await db.check()  # weed out the pool's dead connections
                rows, state = [], None
                backoff = min(backoff * 2, keepalive)
            if rows and not more and caught_up:
                trusted = hints != heard  # a hint came since the last read: announced
            heard, more = hints, len(rows) == batch
            if read:
                caught_up = True
                backoff = poll
            for seq, etype, payload in rows:
                cursor = seq
                yield Event(seq, etype, payload)
                if etype == TERMINAL_EVENT:
                    return
            if rows:
                idle_since = anyio.current_time()
                if len(rows) == batch:
                    continue
            elif state is not None and state[3] is not None and cursor > state[3]:
                # Seq is gap-free and a tail yields only committed events: this cursor is
                # not from this run's stream. Waiting would skip the events up to it
                # silently, or end with nothing; the client should resume from its last
                # seq (or 0) instead.
                raise InvalidInput(
                    "from_seq",
                    f"{cursor} is past the end of run {rid}'s journal (its last seq is {state[3]})",
                )
            elif state is not None and state[0] in TERMINAL:
                if state[2]:
                    return  # resumed past the journaled ending: nothing is left to send
                # Terminal without a journaled ending (e.g. a trimmed journal): say so.
                yield Event(
                    cursor + 1, TERMINAL_EVENT, {"status": state[0], "error": state[1], "synthesized": True}
                )
                return
            now = anyio.current_time()
            if now - idle_since >= keepalive:
                yield Event(cursor, KEEPALIVE)
                idle_since = now
            wait = max(0.0, idle_since + keepalive - now)
            if sub is None or hub is None or not hub.connected or not trusted:
                wait = min(wait, backoff)
            if sub is not None:
                await sub.wait(wait)
            else:
                await anyio.sleep(wait)


async def _read(
    db: Database,
    conn_box: list[AsyncConnection],
    own: bool,
    read_q: bytes,
    state_q: bytes,
    rid: uuid.UUID,
    cursor: int,
    batch: int,
    prepared_statements: bool = True,
) -> tuple[list[tuple[Any, ...]], tuple[Any, ...] | None]:
    """Events after ``cursor``; when there are none, the run's (status, error) as well."""
    if own:
        if not conn_box or conn_box[0].closed:
            assert isinstance(db, str)
            conn = await AsyncConnection.connect(
                db, autocommit=True, prepare_threshold=5 if prepared_statements else None
            )
            conn_box[:] = [conn]
            if prepared_statements:  # a direct connection (see configure_own)
                await configure_own(conn)
        source: Database = conn_box[0]
    else:
        source = db
    async with statement_conn(source) as conn:
        cur = await execute(conn, read_q, {"run_id": rid, "after": cursor, "limit": batch})
        rows = await cur.fetchall()
        if rows:
            return rows, None
        cur = await execute(conn, state_q, {"run_id": rid})
        state = await cur.fetchone()
        if state is None:
            raise RunNotFound(rid)
        if state[0] in TERMINAL:
            # The ending commits the status with its event: read once more.
            cur = await execute(conn, read_q, {"run_id": rid, "after": cursor, "limit": batch})
            rows = await cur.fetchall()
        return rows, state


async def _close_all(conn_box: list[AsyncConnection]) -> None:
    for c in conn_box:
        with anyio.CancelScope(shield=True):
            await c.close()
    conn_box.clear()
