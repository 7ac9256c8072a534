"""The executor: runs the host's agent on one claimed run, then hands its ending over.

Each run is one task. Its helpers (the journal's flush clock, its deadline) start only
if it needs them and end before its ending is written. The agent's outcome decides the
ending: returning is ``completed``; raising is ``failed`` with the error's type and
message; runrow's own cancellation is ``cancelled`` (a stop), ``failed`` with
``worker_shutdown`` (a drain) or ``deadline_exceeded``; a lost claim writes nothing; an
agent waiting for input parks the run ``waiting`` (not an ending: the run resumes later).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any

import anyio

from .. import _aio, _json
from .._errors import LeaseLost
from .._retry_later import RetryLater
from .context import RunContext
from .flight import ending_for
from .journal_writer import JournalWriter
from .signals import Ended
from .view import RunView

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from .._gateway.claims import ClaimedRun
    from .._status import RunStatus
    from .context import Agent
    from .ending import EndingWriter
    from .flight import ActiveRun, RunHost
    from .journal_writer import Appender
    from .kit import Kit
    from .roster import Roster
    from .steps import Steps

log = logging.getLogger("runrow.dispatcher")
log.addFilter(_json.TracebackText())  # a failed run's traceback follows its line


class _Helper:
    """A task that serves one run (its flush clock, its deadline); ``stop()`` cancels it
    and waits until it has ended, so nothing of the run is still writing when its
    ending is written."""

    __slots__ = ("done", "scope", "started")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.started = False

    async def run(self, fn: Callable[[], Awaitable[None]]) -> None:
        self.started = True
        try:
            with self.scope:
                await fn()
        except Exception:  # a helper's failure must not end the run
            log.exception("a run's helper task failed")
        finally:
            self.done.set()

    async def stop(self) -> None:
        if not self.started:
            # A task that never started (cancelled before its first step) runs nothing:
            # its cancelled scope ends it at its first checkpoint, before any write.
            self.scope.cancel()
            return
        # Cancelled from a loop callback, not from this task: anyio words a scope's
        # cancel reason with the repr of the task that cancels it, and a task's repr
        # costs about 0.1 ms (a streaming run stops its flush clock on every ending).
        # The scope is the same, shields and all; it is cancelled one loop step later.
        asyncio.get_running_loop().call_soon(self.scope.cancel)
        await self.done.wait()


class Executor:
    """Starts and runs the runs the claimer took."""

    def __init__(
        self,
        kit: Kit,
        roster: Roster,
        agents: Mapping[str | None, Agent],
        endings: EndingWriter,
        appender: Appender,
        host: RunHost,
    ) -> None:
        self._settings = kit.settings
        self._roster = roster
        self._agents = agents  # by agent key (None: the default agent)
        self._observe = kit.observe
        self._signals = kit.signals
        self._endings = endings
        self._appender = appender
        self._tasks = kit.tasks
        self._host = host
        self._stats = kit.stats

    def start(self, row: ClaimedRun) -> None:
        """Runs the claimed ``row`` in a task of its own."""
        self._tasks.start(self._execute(row))

    async def _execute(self, row: ClaimedRun) -> None:
        active = self._roster.runs[row.id]
        try:
            await self._run(active, row)
        except Exception:
            # A bug of runrow's must not take the worker and its other runs down with
            # this one: the run stays claimed until its lease lapses and a reaper ends it.
            self._roster.unrecorded.add(active.id)
            log.exception(
                "run %s: unexpected error; its ending is left to the reaper",
                active.id,
                extra={"run_id": str(active.id), "worker_id": self._settings.worker_id},
            )
        finally:
            if active.phase in ("running", "finishing"):  # (else the ending writer lets it go)
                self._roster.release(active)

    async def _run(self, active: ActiveRun, row: ClaimedRun) -> None:
        s, roster = self._settings, self._roster
        run_id = active.id
        journal = JournalWriter(
            row,
            self._appender,
            flush_interval=s.flush_interval,
            max_event_bytes=s.max_event_bytes,
            on_lost=lambda: roster.lost(run_id),
            retry_budget=s.lease / 2,
        )
        roster.attach(active, journal)
        ctx = RunContext(self._host, active, journal)
        if log.isEnabledFor(logging.INFO):  # (its extra costs a UUID's text: not made for nothing)
            log.info("run %s started", run_id, extra=self._extra(active))
        started = _aio.now()
        view: RunView | None = None
        if self._observe:
            view = RunView(row, s.worker_id)
            wait = (row.started_at - row.created_at).total_seconds()
            self._observe(lambda o: o.run_started(view, queue_wait=wait))
            journal.on_flush = lambda n: self._flushed(view, journal, n, started)
        status: RunStatus | None = None
        error: dict[str, Any] | None = None
        retry = False  # whether a failure is one the retry policy (if any) retries
        told: str | None = None  # the agent's traceback, for its failure's log line
        later: RetryLater | None = None  # the agent asked to be queued again (back-pressure)
        # The deadline, measured on the database's clock: both times come from the claim.
        remaining = None if row.deadline_at is None else (row.deadline_at - row.started_at).total_seconds()
        # The run's helpers (its flush clock, its deadline) are started only if it needs
        # them, and ended before its ending is written: a run that needs neither costs
        # no task and no cancellation.
        helpers: list[_Helper] = []
        journal.start_flusher = functools.partial(self._start_helper, helpers, journal.run_flusher)
        if remaining is not None:
            if remaining <= 0:
                roster.cancel(active, "deadline")  # claimed too late: never call the agent
            else:
                self._start_helper(helpers, functools.partial(self._deadline_watch, active, remaining))
        try:
            with active.scope, self._observe.scopes(view):
                try:
                    if active.reason is None:  # not already stopped or past its deadline
                        # (The claim takes only runs of keys served: a miss is a bug.)
                        await self._agents[row.agent_key](ctx)
                        status = "completed"
                except LeaseLost:
                    roster.lost(run_id)
                except RetryLater as exc:
                    status, later = "queued", exc
                except Exception as exc:
                    status = "failed"
                    error = _json.error_of(exc, traceback=s.record_tracebacks)
                    if s.log_error_messages:  # (made now: the exception is not kept)
                        told = error.get("traceback") or _json.traceback_of(exc)
                    retry = s.retry is not None and s.retry.retries(exc)
                except asyncio.CancelledError as exc:
                    # Only runrow's own cancellations (a stop, a drain, a lost claim, the
                    # deadline: all through this run's scope) or the task's (shutdown)
                    # end a run as cancelled. Any other CancelledError is the agent's own
                    # (it awaited a future someone else cancelled): a failure like any
                    # other, or the run would sit "running" until the reaper.
                    if active.scope.cancel_called or _task_cancelling():
                        raise
                    status = "failed"
                    error = _agent_cancelled(exc)
                    log.warning(
                        "run %s: the agent raised CancelledError that runrow did not ask for; "
                        "failing the run (%s)",
                        run_id,
                        error["message"],
                        extra=self._extra(active),
                    )
        finally:
            journal.start_flusher = None
            if helpers:
                with anyio.CancelScope(shield=True):
                    for helper in helpers:
                        await helper.stop()
        if (book := ctx.handing_steps()) is not None:
            status, error = await self._records_landed(active, book, status, error)
        # (The agent is done: its slot goes with the ending, see EndingWriter.hand_over.)
        worker_lost = s.retry is not None and s.retry.worker_lost
        ending = ending_for(
            active.reason,
            status,
            error,
            retry,
            cut=active.scope.cancelled_caught,
            retry_worker_lost=worker_lost,
        )
        if ending.status is None:
            self._stats["lost"] += 1
            log.warning(
                "run %s: claim lost, standing down without writing", run_id, extra=self._extra(active)
            )
            if view is not None:
                self._observe(lambda o: o.claim_lost(view))
            if self._signals is not None:
                self._signals.ended.fire(Ended(run_id, None))
            return
        # The task ends here; the ending writer reports back.
        self._endings.hand_over(
            active,
            ending.status,
            ending.error,
            functools.partial(
                self._ended,
                active,
                view,
                ending.status,
                ending.error,
                started,
                # (Only the agent's own error's: not a stop's or a drain's in its place.)
                told if ending.error is error else None,
            ),
            retry=ending.retry,
            park=active.park if ending.status == "waiting" else None,
            later=later if ending.status == "queued" else None,
        )

    async def _records_landed(
        self, active: ActiveRun, book: Steps, status: RunStatus | None, error: dict[str, Any] | None
    ) -> tuple[RunStatus | None, dict[str, Any] | None]:
        """Waits, before the ending, for the step records the agent's steps handed over
        (shielded: a stop must not leave them unknown). A record the claim no longer
        fenced means the claim is lost; one the database refused fails a run that
        would otherwise have completed."""
        try:
            with anyio.CancelScope(shield=True):
                await book.records.flushed()
        except LeaseLost:
            self._roster.lost(active.id)
        except Exception as exc:
            if status == "completed":
                return "failed", _json.error_of(exc)
        return status, error

    def _ended(
        self,
        active: ActiveRun,
        view: RunView | None,
        status: str,
        error: dict[str, Any] | None,
        started: float,
        told: str | None,
        recorded: str | None,
    ) -> None:
        """The run's ending landed as ``recorded`` (or, None, failed for good): report it
        and let the run go. Called from the ending writer's task (or a retry's), not the run's."""
        landed = recorded is not None
        if recorded is not None and recorded != status:
            # A stop asked for before the ending committed (one that had not reached this
            # worker yet, say): the database recorded the failure or the park as cancelled.
            status, error = recorded, None
        try:
            took = _aio.now() - started
            if view is not None:
                self._observe(lambda o: o.run_finished(view, status=status, seconds=took, recorded=landed))
            # (queued: a park on children that had all ended by then; it resumes at once)
            if landed and status in ("waiting", "queued"):
                self._stats["parked"] += 1
                park = active.park
                log.info(
                    "run %s waiting for input %r",
                    active.id,
                    None if park is None else park.key,
                    extra={**self._extra(active), "status": status},
                )
            elif landed:
                self._stats[status] += 1
                if error is None:
                    if log.isEnabledFor(logging.INFO):
                        log.info(
                            "run %s %s", active.id, status, extra={**self._extra(active), "status": status}
                        )
                else:
                    # What failed it: the type, and the message unless the host keeps
                    # it out of logs (log_error_messages=False: it may quote a user).
                    # (``told``, the agent's traceback, follows the same rule: its last
                    # line is the message.)
                    said = _said(error) if self._settings.log_error_messages else ""
                    tb = {} if told is None else {"traceback": told}
                    log.warning(
                        "run %s %s: %s%s (details: runrow runs show %s)",
                        *(active.id, status, error.get("type"), said, active.id),
                        extra={**self._extra(active), "status": status, **tb},
                    )
            else:
                log.warning(
                    "run %s: ending %s not recorded (claim lost or database unreachable)",
                    active.id,
                    status,
                    extra=self._extra(active),
                )
        finally:
            self._roster.release(active)
            if self._signals is not None:
                self._signals.ended.fire(Ended(active.id, recorded))

    def _extra(self, active: ActiveRun) -> dict[str, str]:
        """The fields a run's log lines carry."""
        return {
            "run_id": str(active.id),
            "conversation_id": active.row.conversation_id,
            "worker_id": self._settings.worker_id,
        }

    def _start_helper(self, helpers: list[_Helper], fn: Callable[[], Awaitable[None]]) -> None:
        helper = _Helper()
        helpers.append(helper)
        # (Shutting down past the drain, the task set is closed and the helper never
        # starts: the run is being cut, and its ending writes any pending text.)
        self._tasks.start(helper.run(fn))

    async def _deadline_watch(self, active: ActiveRun, seconds: float) -> None:
        await anyio.sleep(seconds)
        if not active.finishing:
            log.info("run %s passed its deadline; cancelling it", active.id, extra={"run_id": str(active.id)})
            self._roster.cancel(active, "deadline")

    def _flushed(self, view: RunView, journal: JournalWriter, rows: int, started: float) -> None:
        if journal.flushes == 1:
            took = anyio.current_time() - started
            self._observe(lambda o: o.first_event(view, seconds=took))
        self._observe(lambda o: o.journal_flush(view, rows=rows))


def _task_cancelling() -> bool:
    """Whether this task itself is being cancelled (``Task.cancel()``, e.g. at shutdown)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _agent_cancelled(exc: BaseException) -> dict[str, str]:
    """The error recorded for an agent that raised a CancelledError runrow did not ask for."""
    detail = _json.error_of(exc)["message"]
    return {
        "type": "agent_cancelled",
        "message": "the agent raised CancelledError without the run being cancelled "
        "(did it await something another task cancelled?)" + (f": {detail}" if detail else ""),
    }


def _said(error: dict[str, Any]) -> str:
    """The error's message for a log line: one line, at most 300 characters."""
    message = " ".join(str(error.get("message") or "").split())
    if not message:
        return ""
    return f": {message[:297]}..." if len(message) > 300 else f": {message}"
