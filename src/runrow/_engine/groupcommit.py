"""Group commit: many runs' writes of one kind share one statement when they coincide.

A lone write goes out at once (no waiting to fill a batch); writes that arrive while a
statement is in flight ride the next one. So one run sees one round trip, and many
runs cost one statement per round trip instead of one each. A batch refused for what
may be one item's fault (a conflict, a value the server cannot take or the driver
cannot encode, a batch too large) is retried item by item, so one run's write cannot
fail another's.

A writer either waits for its item's result (:meth:`GroupCommit.submit`) or hands it
over with a callback the writer calls when the batch ends (:meth:`GroupCommit.hand_over`):
no task waits, so nothing has to wake up to learn the result.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Generic, TypeVar

import anyio
import psycopg

from .. import _aio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("runrow.groupcommit")


# Refusals that can be one item's doing: a constraint it breaks, a value the server
# cannot take, a batch too large for one statement, or a parameter the driver cannot
# encode before sending (a lone surrogate raises UnicodeEncodeError, not a psycopg error).
_ONE_ITEMS_FAULT = (
    psycopg.IntegrityError,
    psycopg.DataError,
    psycopg.errors.ProgramLimitExceeded,
    UnicodeError,
)


class WriterStopped(Exception):
    """The writer loop has ended (its owner is shutting down): the item was not written."""


class _Slot(Generic[R]):
    # A bare future, not an Event: one is made per write, and an Event costs a waiter
    # list and a loop lookup on top of the future it wraps.
    __slots__ = ("done", "error", "finished", "result")

    def __init__(self) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.result: R | None = None
        self.error: BaseException | None = None
        self.finished = False  # (set with the outcome, even when `done` was cancelled)


if TYPE_CHECKING:
    # Called from the writer with (result, None) or (None, error).
    Callback = Callable[[R | None, BaseException | None], None]
    _Waiter = _Slot[R] | Callback[R]


class GroupCommit(Generic[T, R]):
    """Runs ``write(items) -> results`` (one result per item, in order) in batches."""

    def __init__(
        self, write: Callable[[list[T]], Awaitable[list[R]]], *, max_batch: int = 500, timeout: float = 30.0
    ) -> None:
        self._write = write
        self._max_batch = max_batch
        self._timeout = timeout
        self._queue: list[tuple[T, _Waiter[R]]] = []
        self._kick = _aio.Event()
        self._stopped = False
        self.batches = 0
        self.items = 0

    async def submit(
        self, item: T, *, caller_shielded: bool = False, settle: Callable[[R], None] | None = None
    ) -> R:
        """Queues ``item`` and waits for its result.

        Once handed over, a write either lands or fails as a whole, and the caller must
        learn which (it decides what the run's seq is), so a cancellation never leaves
        the caller guessing. By default the wait is shielded. A caller already inside a
        shielded, bounded scope says ``caller_shielded`` and the wait skips its own
        scope (entering one costs measurably per write). A caller that passes
        ``settle`` waits unshielded, which costs nothing until a cancellation comes:
        then it waits, shielded and bounded, for the outcome, hands a result to
        ``settle`` and lets the cancellation go on (an error is not handed: the
        outcome stays unknown).
        """
        if self._stopped:
            raise WriterStopped("the writer has stopped")
        slot: _Slot[R] = _Slot()
        self._queue.append((item, slot))
        self._kick.set()
        if caller_shielded:
            await slot.done
        elif settle is not None:
            try:
                await slot.done
            except asyncio.CancelledError:
                await self._outcome(slot)
                if slot.finished and slot.error is None:
                    settle(slot.result)  # type: ignore[arg-type]
                raise
        else:
            with anyio.CancelScope(shield=True, deadline=_aio.now() + self._timeout + 5):
                await slot.done
        if not slot.done.done() or slot.done.cancelled():
            raise TimeoutError("database write did not finish in time")
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    async def _outcome(self, slot: _Slot[R]) -> None:
        """After the caller's wait was cancelled: waits for ``slot``'s outcome, shielded
        and bounded (the cancelled wait cancelled its future; the writer sets a new one)."""
        if slot.finished:
            return
        slot.done = asyncio.get_running_loop().create_future()
        with anyio.CancelScope(shield=True, deadline=_aio.now() + self._timeout + 5):
            await slot.done

    def hand_over(self, item: T, callback: Callback[R]) -> None:
        """Queues ``item``; the writer calls ``callback(result, None)`` or
        ``callback(None, error)`` once its batch has landed or failed. The callback runs
        in the writer's task: it must be quick and must not raise (a raise is logged).
        Once the writer has stopped, the callback gets :class:`WriterStopped` at once."""
        if self._stopped:
            _finish(callback, None, WriterStopped("the writer has stopped"))
            return
        self._queue.append((item, callback))
        self._kick.set()

    async def run(self) -> None:
        """The writer loop; run it as a task for the lifetime of the owner. When it ends
        (cancelled), whatever is still queued fails with :class:`WriterStopped`, and so
        does anything submitted later: no waiter is left waiting for nothing."""
        try:
            while True:
                await self._kick.wait()
                self._kick = _aio.Event()
                while self._queue:
                    batch = self._queue[: self._max_batch]
                    del self._queue[: self._max_batch]
                    self.batches += 1
                    self.items += len(batch)
                    with anyio.CancelScope(shield=True):
                        await self._flush(batch)
        finally:
            self._stopped = True
            left, self._queue = self._queue, []
            self._fail(left, WriterStopped("the writer stopped before this item was written"))

    async def _flush(self, batch: list[tuple[T, _Waiter[R]]]) -> None:
        try:
            # (A bare deadline scope, not fail_after: its context manager costs per batch.)
            with anyio.CancelScope(deadline=_aio.now() + self._timeout) as bound:
                results = await self._write([item for item, _ in batch])
            if bound.cancelled_caught:
                raise TimeoutError("database write did not finish in time")
        except _ONE_ITEMS_FAULT as exc:
            # One item may be to blame (a conflict, a value the server rejects): each goes
            # again alone, so it cannot cost the others theirs. (Not for faults of the
            # connection, the server or the schema: each item would fail in turn, one
            # timeout after another, while every other write waits.)
            if len(batch) == 1:
                self._fail(batch, exc)
            else:
                for one in batch:
                    await self._flush([one])
            return
        except Exception as exc:
            self._fail(batch, exc)
            return
        for (_, waiter), result in zip(batch, results, strict=True):
            _finish(waiter, result, None)

    @staticmethod
    def _fail(batch: list[tuple[T, _Waiter[R]]], exc: BaseException) -> None:
        for _, waiter in batch:
            _finish(waiter, None, exc)


def _finish(waiter: _Waiter[R], result: R | None, error: BaseException | None) -> None:
    if isinstance(waiter, _Slot):
        waiter.result, waiter.error, waiter.finished = result, error, True
        if not waiter.done.done():
            waiter.done.set_result(None)
        return
    try:
        waiter(result, error)
    except Exception:  # one item's callback must not cost the rest of the batch theirs
        log.exception("a group-commit callback failed")
