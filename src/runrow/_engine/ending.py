"""The ending writer: every run's terminal write, group-committed, fenced and bounded.

A run's task hands its ending over and goes; the writer batches the endings of many
runs into one ``finalize`` statement and calls each run back once it is answered
(landed, or failed for good, or at the latest ``finalize_timeout`` after the hand-over,
by one budget clock for all endings, not a task or a timer each, since nearly every
ending is answered long before its budget ends). A transient failure is retried by a per-run task (three attempts
in all, within the same budget); a retry after an ambiguous failure is safe: if the
first attempt committed, the fence makes the retry match nothing, and the writer then
reads back whether the ending recorded is its own (counted, not lost) or another's.

Every batch runs under a server-side bound that ends the statement before the first of
its endings' budgets does: an ending given up is then dead on the server, never left
waiting (on a row lock, say) to commit later.

With ``claim_with_endings`` (by default the claim loop takes a slot back at the
hand-over), a run's slot rides with its ending: the batch's first attempt claims for the
slots its endings free, in the same transaction and round trip (the claim follows the
finalize, so it sees the endings: a conversation's next turn can be claimed with the
end of the last). A busy worker's run then costs one commit, not two. Safe because nothing changes
for either write: the endings become visible only when that transaction commits, as
before; a claim that commits has its runs started here, or reaped if the answer is
lost (at most once, as for the claim loop's own claims); a claim the server refuses
takes the endings down with it, and they are written again alone at once. No claim goes
with endings once a drain has begun, and the drain waits for one in flight.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import anyio
import psycopg

from .. import _aio, _json
from .._db import HeldConnection, describe, statement_conn
from .._errors import LeaseLost
from .._events import CHILDREN_AWAITED, INPUT_REQUESTED, RETRY_LATER
from .._gateway import endings as _endings
from .._gateway._exec import jit_off_session, run
from .ending_answer import TRANSIENT, Answer, BudgetClock, Handed, OutOfTime
from .flight import terminal_reason
from .groupcommit import GroupCommit, WriterStopped

if TYPE_CHECKING:
    import uuid
    from collections.abc import Callable

    from .._gateway.claims import ClaimedRun
    from .._retry_later import RetryLater
    from .claimer import Claimer
    from .flight import ActiveRun, Park
    from .kit import Kit
    from .roster import Roster

log = logging.getLogger("runrow.dispatcher")


class EndingWriter:
    """Writes runs' endings (its group-commit loop is service ``endings``)."""

    def __init__(self, kit: Kit, roster: Roster, claimer: Claimer | None = None) -> None:
        settings = self._settings = kit.settings
        # Claims for the slots that endings free, in the endings' transaction (None: the
        # slot is freed at the hand-over and the claim loop claims for it).
        self._claimer = claimer
        self._folding = 0  # batches in flight that carry a claim
        self._settled = _aio.Event()  # set while none is
        self._settled.set()
        self._channels = settings.channels
        self._roster = roster
        self._pool = kit.pool
        self._stats = kit.stats
        self._tasks = kit.tasks
        self._db_trouble = kit.db_trouble
        self._extra = kit.extra
        # Kept between batches (see HeldConnection); its session may carry the bound.
        self.conn = HeldConnection(kit.pool, min_pool=4, idle_seconds=kit.settings.tx_idle_seconds)
        # Bounded by finalize_timeout: no run's task waits on its write (see hand_over).
        self._writer: GroupCommit[Handed, bool | None] = GroupCommit(
            self._write_batch, timeout=settings.finalize_timeout
        )
        self._clock = BudgetClock(self._out_of_time)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """The group-commit loop."""
        task_status.started()
        await self._writer.run()

    async def close(self) -> None:
        """Gives the kept connection back (at shutdown)."""
        await self.conn.release()

    def hand_over(
        self,
        active: ActiveRun,
        status: str,
        error: dict[str, Any] | None,
        done: Callable[[str | None], None],
        *,
        retry: bool = False,
        park: Park | None = None,
        later: RetryLater | None = None,
    ) -> None:
        """Hands the run's fenced terminal write over; ``done(recorded)`` is called exactly
        once, with the status recorded (None if none was): when it has landed, or failed
        for good, or at the latest ``finalize_timeout`` after the hand-over (a write still
        in flight then may yet land; the run is counted unrecorded, as the reaper would
        find it). The run's task does not wait for it:
        the writer calls back when the batch ends, so a run costs no wake-up after its write."""
        self._roster.finishing(active)
        # The agent is done: its slot can take the next run while the ending is written
        # (concurrency bounds agent calls). With a claimer to fold into, the slot rides
        # with the ending and the writer claims for it in the ending's transaction.
        rider = active if self._claimer is not None else None
        if rider is None:
            self._roster.free_slot(active)
        journal = active.journal
        assert journal is not None
        terminal: dict[str, Any] = {"status": status}
        if error is not None:
            # The journal is streamed to the run's clients: its ending carries the error's
            # type and message; the traceback stays on the row, for operators.
            terminal["error"] = {k: v for k, v in error.items() if k != "traceback"}
        if (reason := terminal_reason(active.reason, status)) is not None:
            terminal["reason"] = reason
        if journal.broken is not None and not isinstance(journal.broken, LeaseLost):
            # A flush of unknown outcome: our seq numbering cannot be trusted. Let the
            # reaper (max(seq)+1) record the ending.
            self._roster.unrecorded.add(active.id)
            done(None)
            return
        budget = self._settings.finalize_timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        answer = Answer(done, deadline, status, active)
        if park is not None and park.awaiting is not None:  # a wait for children (status waiting)
            events = journal.final_rows({"key": park.key, **park.request}, CHILDREN_AWAITED)
        elif later is not None:  # not an ending: back to the queue for a while (RetryLater)
            events = journal.final_rows({"after": later.after, "key": later.key}, RETRY_LATER)
        elif park is not None:  # not an ending: the run waits for input (status waiting)
            events = journal.final_rows({"key": park.key, "request": park.request}, INPUT_REQUESTED)
        else:
            events = journal.final_rows(terminal)
        handed = Handed(
            _endings.Ending(
                run_id=active.id,
                claim_token=active.token,
                status=status,
                error=None if error is None else _json.dumps(error, "error"),
                # (RetryLater: its text is streamed again by the next pass, not kept as a partial)
                partial=None if later is not None else journal.answer_text,
                events=events,
                retry=retry,
                input_timeout=None if park is None else park.timeout,
                partial_id=None if park is None else park.message_id,
                awaiting=None if park is None else park.awaiting,
                await_any=park is not None and park.await_any,
                retry_after=None if later is None else later.after,
                gate_key=None if later is None else later.key,
                child=active.row.parent_run_id is not None,
            ),
            answer,
            rider,
        )

        def first_attempt(landed: bool | None, exc: BaseException | None) -> None:
            if answer.answered:
                return
            if exc is None and landed is None:  # never sent: its budget had run out
                self._failed(active, OutOfTime(budget), 1, answer)
            elif exc is None:
                self._landed(bool(landed), answer)
            elif isinstance(exc, TRANSIENT) and not self._tasks.closed:
                self._tasks.start(self._again(active, handed, exc, deadline))
            else:  # rejected, or shutting down
                self._failed(active, exc, 1, answer)

        self._clock.add(loop, answer)
        self._roster.handed_over(active)
        self._writer.hand_over(handed, first_attempt)

    def _out_of_time(self, answer: Answer) -> None:
        assert answer.run is not None  # (unanswered)
        self._failed(answer.run, OutOfTime(self._settings.finalize_timeout), 0, answer)

    def _landed(self, landed: bool, answer: Answer) -> None:
        if answer.answered:
            return
        if not landed:  # the fence matched nothing: someone else ended or took the run
            self._stats["lost"] += 1
        answer(landed)

    def _failed(self, active: ActiveRun, exc: BaseException, attempt: int, answer: Answer) -> None:
        if answer.answered:
            return
        extra = {"run_id": str(active.id), **self._extra}
        if answer.sent:
            # The server has not answered the attempt in flight (a stalled network or
            # server: the statement's own server-side bound would have ended it in
            # time otherwise): it may yet commit. Say so, not "not recorded".
            log.warning(
                "finalize of run %s given up with an attempt unanswered: %s; it may yet land "
                "(the run then ends as written; if not, the reaper ends it)",
                active.id,
                exc,
                extra=extra,
            )
        elif isinstance(exc, OutOfTime | WriterStopped):
            log.warning("finalize of run %s given up: %s", active.id, exc, extra=extra)
        elif isinstance(exc, TRANSIENT):
            self._attempt_failed(active, attempt, exc)
        elif isinstance(exc, psycopg.Error):
            log.warning("finalize of run %s rejected: %s", active.id, describe(exc), extra=extra)
        else:
            log.error("finalize of run %s: unexpected error", active.id, exc_info=exc, extra=extra)
        self._roster.unrecorded.add(active.id)
        answer(False)

    def _attempt_failed(self, active: ActiveRun, attempt: int, exc: BaseException) -> None:
        self._db_trouble()
        log.warning(
            "finalize of run %s failed (attempt %d): %s",
            active.id,
            attempt,
            describe(exc),
            extra={"run_id": str(active.id), **self._extra},
        )

    async def _again(self, active: ActiveRun, handed: Handed, exc: BaseException, deadline: float) -> None:
        """Attempts 2 and 3 of a finalize whose first attempt failed, within its budget."""
        answer = handed.answer
        budget = self._settings.finalize_timeout
        attempt = 1
        try:
            with anyio.CancelScope(shield=True, deadline=deadline) as bound:
                while isinstance(exc, TRANSIENT) and attempt < 3:
                    self._attempt_failed(active, attempt, exc)
                    await anyio.sleep(0.2 * attempt)
                    attempt += 1
                    try:
                        landed = await self._writer.submit(handed, caller_shielded=True)
                        if landed is None:  # not sent: no budget left for a server-side bound
                            exc = OutOfTime(budget)
                            break
                        if not landed:
                            # The fence matched nothing: maybe the failed attempt had
                            # committed and only its answer was lost.
                            recorded = await self._read_back(handed.ending)
                            landed = recorded is not None
                            if recorded is not None:
                                answer.recorded = recorded
                                log.info(
                                    "finalize of run %s: an earlier attempt had landed (its answer was lost)",
                                    active.id,
                                    extra={"run_id": str(active.id), **self._extra},
                                )
                    except Exception as again:
                        exc = again
                        continue
                    self._landed(landed, answer)
                    return
            if bound.cancelled_caught:
                exc = OutOfTime(budget)
            self._failed(active, exc, attempt, answer)
        finally:
            if not answer.answered:  # the task was cancelled (shutdown past every budget)
                self._failed(active, WriterStopped("the dispatcher shut down"), attempt, answer)

    async def _read_back(self, ending: _endings.Ending) -> str | None:
        try:
            async with statement_conn(self._pool()) as conn:
                return await run(conn, _endings.landed(self._settings.schema, ending))
        except Exception as exc:  # the caller counts it as a failed attempt
            log.warning(
                "finalize of run %s: reading back whether an earlier attempt landed failed: %s",
                ending.run_id,
                describe(exc),
                extra={"run_id": str(ending.run_id), **self._extra},
            )
            raise

    async def _write_batch(self, items: list[Handed]) -> list[bool | None]:
        """Writes the endings whose budget leaves room for it (None for the others: not
        sent), under a server-side bound that ends the statement before the first of
        their budgets does, and claims for the slots they free in the same transaction."""
        now = asyncio.get_running_loop().time()
        margin = self._settings.ending_margin
        fits = [h.answer.deadline - now - margin >= 0.001 for h in items]
        sent = [h for h, ok in zip(items, fits, strict=True) if ok]
        # The slots riding with these endings: claimed for with them, or freed now (an
        # ending not sent, a drain begun). A slot rides with its first attempt only.
        riders: list[ActiveRun] = []
        for h, ok in zip(items, fits, strict=True):
            if h.slot is not None:
                if ok:
                    riders.append(h.slot)
                else:
                    self._roster.free_slot(h.slot)
                h.slot = None
        if riders and (self._claimer is None or not self._claimer.may_fold()):
            for active in riders:
                self._roster.free_slot(active)
            riders = []
        if not sent:
            return [None] * len(items)
        # statement_timeout ends the statement, all its waits included; lock_timeout
        # also bounds the commit's wait for the NOTIFY queue's lock.
        left = min(h.answer.deadline for h in sent) - now - margin
        for h in sent:
            h.answer.sent = True
        try:
            landed = await self._send(sent, left, riders)
        except psycopg.Error as exc:
            if not riders or isinstance(exc, TRANSIENT):
                raise
            # Refused with a claim in the transaction (a conflict over a conversation's
            # turn, say): nothing landed. The endings go again alone, at once; the claim
            # loop claims for their slots.
            log.info(
                "a claim made with endings failed (%s); writing them alone", describe(exc), extra=self._extra
            )
            landed = await self._send(sent, left, [])
        finally:
            for h in sent:
                h.answer.sent = False
        for h in sent:
            recorded = landed.get(h.ending.run_id)
            if recorded is not None:
                h.answer.recorded = recorded
        return [(h.ending.run_id in landed) if ok else None for h, ok in zip(items, fits, strict=True)]

    async def _send(self, sent: list[Handed], left: float, riders: list[ActiveRun]) -> dict[uuid.UUID, str]:
        """One finalize of ``sent`` (bounded to ``left`` seconds); with ``riders``, the claim
        for their slots follows it in the same transaction and round trip. Every rider's
        slot is passed on (claimed runs) or freed, however this ends.

        On the writer's own kept connection (direct, JIT off for its session) the bound
        is a session setting, ``session_budget``, set with the first finalize it carries;
        an ending that leaves at least that much of its budget (the usual case) then
        costs no setting. Any other batch (budgets partly spent, a retry, the host's pool,
        a transaction pooler) sets a tighter bound transaction-locally, pipelined ahead:
        same round trip, same implicit transaction, nothing left on the connection."""
        s = self._settings
        endings = [h.ending for h in sent]
        claim = None
        if riders:
            assert self._claimer is not None
            claim = self._claimer.request(len(riders))
            if not self._folding:
                self._settled = _aio.Event()
            self._folding += 1
        t0 = _aio.now()
        rows: list[ClaimedRun] = []
        try:
            async with self.conn.statement() as conn:
                held = self.conn
                session = held.keeps(conn) and jit_off_session(conn) and left >= s.session_budget
                bound: dict[str, int] = {}
                if session and not held.carries(conn):
                    # The first ending on this kept connection: the session's bound goes
                    # with it. Marked first: however this ends, the bound comes off (or
                    # the connection is closed) before it serves anything else.
                    held.session_changed(lambda c: _endings.unset_session_bound(c, s.schema))
                    bound = {"session_bound_ms": int(s.session_budget * 1000)}
                elif not session:
                    # (ending_budget also turns JIT off for the transaction: no guard here.)
                    bound = {"local_bound_ms": int(left * 1000)}
                if claim is None:
                    return await _endings.finalize(conn, s.schema, endings, channels=self._channels, **bound)
                landed, rows = await _endings.finalize_then_claim(
                    conn, s.schema, endings, claim, channels=self._channels, **bound
                )
                return landed
        finally:
            if claim is not None:
                assert self._claimer is not None
                self._folding -= 1
                if not self._folding:
                    self._settled.set()
                if rows:
                    self._claimer.folded(riders, rows, _aio.now() - t0)
                else:
                    self._claimer.folded_empty()
                    for active in riders:
                        self._roster.free_slot(active)

    async def folds_settled(self) -> None:
        """Returns once no batch carrying a claim is in flight (a drain waits for this
        after it stopped claiming, so that every run claimed is in the roster)."""
        await self._settled.wait()
