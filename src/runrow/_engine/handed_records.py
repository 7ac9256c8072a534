"""Step records handed over: a step's result goes back to the agent at once while its
record rides the step writer's next batch.

The step writer keeps its queue's order, so the run's later step writes and transcript
messages land in the same commit as the record or after it (the next step's begun
marker usually shares its commit: one commit a step instead of two). Writes that take
another path wait for the records first: the journal's flushes (through its gate),
a steering delivery, a spawn, a park and the ending. So nothing the run writes after a
step lands before the step's record; a worker dying in between leaves the step as one
dying during the step would (begun, not recorded: uncertain).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from .. import _aio
from .._errors import LeaseLost
from .._gateway import steps as _gw
from .groupcommit import WriterStopped
from .step_writer import TRANSIENT

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._gateway._exec import Plan
    from .flight import ActiveRun, RunHost
    from .journal_writer import JournalWriter

# A record whose batch failed for one of these is sent again (a record is safe to repeat).
_SEND_AGAIN = (*TRANSIENT, WriterStopped)


class HandedRecords:
    """One attempt's step records on their way, in the order they were handed over."""

    def __init__(
        self,
        host: RunHost,
        run: ActiveRun,
        journal: JournalWriter | None,
        write: Callable[..., Awaitable[Any]],
        settled: Callable[[object], None],
    ) -> None:
        self._host = host
        self._run = run
        self._journal = journal
        self._write = write  # the step book's fenced, retried write (to send one again)
        self._settled = settled  # the step book's: a park waits for the step until then
        self._handed: list[_Handed] = []
        self._refused: BaseException | None = None  # (raised by every later wait)

    @property
    def handing(self) -> bool:
        """Whether a record may still be on its way, or one was refused."""
        return bool(self._handed) or self._refused is not None

    @property
    def failed(self) -> bool:
        """Whether a record's batch has failed (it is sent again by :meth:`flushed`)."""
        return any(h.error is not None for h in self._handed)

    def hand_over(self, token: object, where: dict[str, Any], text: str) -> None:
        """Queues the record of a step that is not idempotent (``where``: its key,
        occurrence and position; ``text``: its result's JSON) with the step writer's next
        batch, without waiting. ``token`` (the step's, from ``Steps.begin``) is settled
        when the batch has ended."""
        handed = _Handed(token, where, text)
        if not self._handed and self._journal is not None:
            self._journal.gate = self.flushed  # its flushes wait for the records first
        self._handed.append(handed)
        schema, run_id, claim = self._host.settings.schema, self._run.id, self._run.token

        def plan() -> Plan[Any]:
            return _gw.record(
                schema,
                run_id=run_id,
                claim_token=claim,
                **where,
                idempotent=False,
                result=text,
                error=None,
            )

        def landed(result: Any, error: BaseException | None) -> None:
            # (In the writer's task, when the batch has ended: quick, never raises.)
            handed.error = error
            handed.fenced = error is None and result is None
            handed.done.set()
            if handed.fenced:
                self._host.lost(run_id)
            self._settled(token)
            self._forget_landed()

        self._host.hand_over_together(plan, landed)

    def _forget_landed(self) -> None:
        # Records known to have landed need nothing more (their results' JSON is let go:
        # a long turn of large results keeps none of them).
        handed = self._handed
        while handed and handed[0].done.is_set() and handed[0].error is None and not handed[0].fenced:
            handed.pop(0)
        if not handed and self._journal is not None:
            self._journal.gate = None

    async def flushed(self) -> None:
        """Returns once every record handed over has landed. A record whose batch failed
        for a reason that may pass is sent again (within half the lease, as any step
        write); :class:`LeaseLost` if the claim had gone; the database's error if it
        refused one (that record is not written: the run must not go on as if it were)."""
        if self._refused is not None:
            raise self._refused
        while self._handed:
            handed = self._handed[0]
            if not handed.done.is_set():
                # (Bounded by the writer: its batches fail after half the lease.)
                with anyio.CancelScope(shield=True):
                    await handed.done.wait()
            if handed.error is not None:
                if not isinstance(handed.error, _SEND_AGAIN):
                    self._refused = handed.error
                    raise handed.error
                await self._write(
                    _gw.record, **handed.where, idempotent=False, result=handed.text, error=None
                )
                handed.error = None
            if self._handed and self._handed[0] is handed:
                self._handed.pop(0)
            if handed.fenced:
                raise LeaseLost(self._run.id)
        if self._journal is not None:
            self._journal.gate = None


class _Handed:
    """A record handed over, and how its batch ended."""

    __slots__ = ("done", "error", "fenced", "text", "token", "where")

    def __init__(self, token: object, where: dict[str, Any], text: str) -> None:
        self.token = token
        self.where = where
        self.text = text
        self.done = _aio.Event()
        self.error: BaseException | None = None
        self.fenced = False
