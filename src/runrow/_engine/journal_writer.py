"""The journal writer: one run's events, merged, numbered and flushed behind the claim's fence."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import anyio
import psycopg

from .. import _aio, _json
from .._db import HeldConnection, describe, statement_conn
from .._errors import InvalidInput, LeaseLost
from .._events import CONTENT_DELTA, TERMINAL_EVENT, USAGE, checked_event
from .._gateway import journal as _journal
from .._gateway._exec import run
from .._gateway.journal import Appended, row_head
from .groupcommit import GroupCommit

if TYPE_CHECKING:
    import uuid
    from collections.abc import Awaitable, Callable, Mapping

    from anyio.abc import TaskStatus

    from .._gateway.claims import ClaimedRun
    from .._gateway.journal import FlushState
    from .kit import Kit

__all__ = ["Appender", "JournalWriter"]

log = logging.getLogger("runrow.journal")

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
        run: ClaimedRun,
        appender: Appender,
        *,
        flush_interval: float,
        max_event_bytes: int,
        on_lost: Callable[[], None],
        retry_budget: float = 10.0,
    ) -> None:
        self._run = run  # its id and claim token fence every flush
        self._head: str | None = None  # each flush's rows start with it (made at the first)
        self.next_seq = int(run.last_seq) + 1
        self._appender = appender
        self._interval = flush_interval
        self._max_bytes = max_event_bytes
        self._on_lost = on_lost
        self.on_flush: Callable[[int], None] | None = None
        # While a step's record is on its way (steps.py hands it over without waiting):
        # what a flush waits for first, so no event the agent wrote after the step lands
        # before the step's record.
        self.gate: Callable[[], Awaitable[None]] | None = None
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
        self._usage: list[str] = []  # usage events' JSON, riding the next flush
        self._has_pending = _aio.Event()
        self._answer: list[str] = []
        self.broken: BaseException | None = None
        # A resumed run's replay, before it reaches where the run paused: what the agent
        # emits was journaled before the pause, so it is dropped (see steps.Steps).
        self.muted = False
        self.rows_written = 0
        self.flushes = 0
        self.deltas = 0

    # -- what the agent calls ---------------------------------------------------------

    async def emit(self, event: Mapping[str, Any]) -> None:
        etype, payload, text = checked_event(event, self._max_bytes)
        self._check()
        if self.muted:
            return
        if text is not None:
            await self.flush(extra=(etype, text))
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

    async def journal(self, etype: str, payload: dict[str, Any]) -> None:
        """Writes an event runrow itself makes (a reserved type: ``steering_delivered``) at
        once, after pending text; dropped while muted (a replay: journaled before)."""
        self._check()
        if not self.muted:
            await self.flush(extra=(etype, _json.dumps(payload, "event")))

    def record_usage(self, payload_json: str) -> None:
        """Queues a usage event (its checked payload's JSON) for the next flush, whatever
        makes it: the flush clock, a structural event, an explicit flush or the ending."""
        self._check()
        if not self.muted:  # (a resumed run's replay: journaled before the pause)
            self._usage.append(payload_json)

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

    def _take_pending(self) -> list[tuple[str, dict[str, Any] | str]]:
        taken: list[tuple[str, dict[str, Any] | str]] = []
        if self._pending is not None:
            payload = {**self._pending, "delta": "".join(self._pending_parts)}
            self._pending, self._pending_key, self._pending_parts = None, None, []
            self._has_pending = _aio.Event()
            taken.append((CONTENT_DELTA, payload))
        if self._usage:
            taken += [(USAGE, text) for text in self._usage]
            self._usage = []
        return taken

    def _number(self, events: list[tuple[str, dict[str, Any] | str]]) -> list[tuple[int, str, str]]:
        rows = []
        for i, (etype, payload) in enumerate(events):
            text = payload if isinstance(payload, str) else _json.dumps(payload, "event")
            rows.append((self.next_seq + i, etype, text))
        return rows

    async def flush(
        self, extra: tuple[str, dict[str, Any] | str] | None = None, *, due_only: bool = False
    ) -> None:
        """Writes pending text (and ``extra``: a type and its payload, or the payload's
        JSON text as :func:`~runrow._events.checked_event` made it) as one fenced batch.

        ``due_only`` (the flush clock) writes only text that has waited a full interval:
        if another flush took the text the clock woke for while this one waited for the
        lock, the text that arrived since waits for its own tick instead of becoming a
        tiny extra row.
        """
        if self._lock is None:
            # Fast: an uncontended flush takes it without a trip round the event loop (a
            # checkpoint and a cancel scope each time: most of a structural emit's CPU
            # when a thousand runs emit at once); the write itself yields anyway.
            self._lock = anyio.Lock(fast_acquire=True)
        async with self._lock:
            self._check()
            if due_only and (self._pending is None or _aio.now() < self._pending_since + self._interval):
                return
            if self.gate is not None:
                await self.gate()
            events = self._take_pending() + ([extra] if extra else [])
            if not events:
                return
            rows = self._number(events)
            settled: list[bool] = []
            try:
                landed = await self._submit_resolving(rows, settled.append)
            except _REFUSED as exc:
                # Refused for their content (by the driver before sending, or by the
                # server's statement, which then wrote nothing): these rows certainly did
                # not land, so the numbering still holds and the run can go on or end.
                raise InvalidInput("event", f"the database refused it ({describe(exc)})") from exc
            except BaseException as exc:
                if settled:  # cancelled while in flight, and the outcome came: count it
                    self._landed(rows, settled[0])
                else:  # unknown whether it landed: this writer cannot number another row
                    self.broken = exc
                raise
            if not self._landed(rows, landed):
                raise self.broken  # type: ignore[misc]

    async def riding(self, write: Callable[[Appended], Awaitable[bool]]) -> bool:
        """Writes the pending text inside another fenced statement, all or nothing
        (``write_message``'s: the text lands with the message, one commit instead of a
        flush and then the message): ``write(item)`` gets the rows as one run's append
        and returns whether its fence held. The rows count as flushed if it did; False
        if it did not (the claim is lost: broken). Pending ``usage`` rows are flushed
        first, as usual (their rollup rides append_events alone)."""
        if self._usage:
            await self.flush()
        if self._lock is None:
            self._lock = anyio.Lock(fast_acquire=True)
        async with self._lock:
            self._check()
            rows = self._number(self._take_pending())
            if self._head is None:
                self._head = row_head(self._run.id, self._run.claim_token)
            try:
                landed = await write(Appended(self._run.id, self._run.claim_token, rows, self._head))
            except _REFUSED:
                raise  # (refused as a whole: nothing landed, the numbering holds)
            except BaseException as exc:
                if rows:  # whether they landed is unknown: no further row can be numbered
                    self.broken = exc
                raise
            if rows:
                return self._landed(rows, landed)
            return landed

    def _landed(self, rows: list[tuple[int, str, str]], landed: bool) -> bool:
        """Counts a flush's outcome: its rows numbered, or the claim lost (broken)."""
        if not landed:
            self.broken = LeaseLost(self._run.id)
            self._on_lost()
            return False
        self.next_seq += len(rows)
        self.rows_written += len(rows)
        self.flushes += 1
        if self.on_flush is not None:
            self.on_flush(len(rows))
        return True

    async def _submit_resolving(
        self, rows: list[tuple[int, str, str]], settle: Callable[[bool], None]
    ) -> bool:
        """Submits a flush; if the connection fails without an answer (a database restart,
        a cut connection), asks the database whether the rows landed and retries if not.
        A cancellation while the rows are in flight hands their outcome to ``settle``
        when it comes (see :meth:`GroupCommit.submit`)."""
        delay = 0.05
        deadline = _aio.now() + self._retry_budget
        if self._head is None:  # (not at construction: most runs never flush)
            self._head = row_head(self._run.id, self._run.claim_token)
        while True:
            try:
                return await self._appender.submit(
                    Appended(self._run.id, self._run.claim_token, rows, self._head), settle
                )
            except (psycopg.OperationalError, psycopg.InterfaceError, TimeoutError) as exc:
                if _aio.now() + delay > deadline:
                    raise
                log.info(
                    "flush of run %s failed (%s); checking whether it landed",
                    self._run.id,
                    describe(exc),
                    extra={"run_id": str(self._run.id)},
                )
            while True:
                await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)
                try:
                    found = await self._appender.landed(
                        self._run.id, self._run.claim_token, [r[0] for r in rows]
                    )
                    landed, owned = found.landed, found.owned
                    break
                except (psycopg.OperationalError, psycopg.InterfaceError, TimeoutError):
                    if _aio.now() + delay > deadline:
                        raise
            if landed == len(rows):
                return True
            if not owned:
                return False
            if landed:  # part of a batch cannot land alone; the seqs are someone else's
                raise LeaseLost(self._run.id)

    def final_rows(
        self, terminal: dict[str, Any], event_type: str = TERMINAL_EVENT
    ) -> list[tuple[int, str, str]]:
        """Pending text plus the terminal event (or a park's ``input_requested``),
        numbered, for the finalize statement."""
        rows = self._number(self._take_pending())
        seq = self.next_seq + len(rows)
        if event_type != TERMINAL_EVENT:
            return [*rows, (seq, event_type, _json.dumps(terminal, "event"))]
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
                        self._run.id,
                        describe(exc),
                        extra={"run_id": str(self._run.id)},
                    )
                    return


class Appender:
    """The journal's group-commit writer: the flushes of many runs in one fenced
    statement (its loop is service ``appends``)."""

    def __init__(self, kit: Kit) -> None:
        self._settings = kit.settings
        self._channels = kit.settings.channels
        self._pool = kit.pool
        self._db_trouble = kit.db_trouble
        # Kept between batches: its prepared statement stays warm (see HeldConnection).
        self.conn = HeldConnection(kit.pool, min_pool=6, idle_seconds=kit.settings.tx_idle_seconds)
        self.writer: GroupCommit[Appended, bool] = GroupCommit(self._write_batch)

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        """The group-commit loop."""
        task_status.started()
        await self.writer.run()

    async def close(self) -> None:
        """Gives the kept connection back (at shutdown)."""
        await self.conn.release()

    async def submit(self, item: Appended, settle: Callable[[bool], None]) -> bool:
        """Writes one run's events with the next batch; False if the claim was lost.
        Unshielded: a cancellation while in flight waits for the outcome and hands it
        to ``settle`` before it goes on (no shielded scope per emit: with a thousand
        runs emitting at once, entering one was a third of an emit's CPU)."""
        return await self.writer.submit(item, settle=settle)

    async def landed(self, run_id: uuid.UUID, claim_token: uuid.UUID, seqs: list[int]) -> FlushState:
        """After a flush of unknown outcome: how much of it landed, and whether the claim holds."""
        self._db_trouble()
        async with statement_conn(self._pool()) as conn:
            return await run(conn, _journal.flush_landed(self._settings.schema, run_id, claim_token, seqs))

    async def _write_batch(self, items: list[Appended]) -> list[bool]:
        s = self._settings
        async with self.conn.statement() as conn:
            landed = await run(
                conn, _journal.append(s.schema, items, channels=self._channels, notify=s.journal_notify)
            )
        return [item.run_id in landed for item in items]
