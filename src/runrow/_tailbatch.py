"""Group reads for tails: the tails on one pool that wake together share one read.

When a thousand runs each append an event at once, the hub wakes their thousand tails
in the same instant, and each would take a pooled connection for a read of its own:
a thousand round trips queued on a pool of ten. Here, a woken tail hands its read
(run, cursor, batch size) to its pool's :class:`ReadBatcher`, which sends every read
queued so far as one statement (``read_events_many``). A lone read goes out at once
(no waiting to fill a batch); reads that come while a statement is in flight ride the
next one. So a lone tail still sees one round trip, and a thousand cost a few statements.

Only tails that read through an ``AsyncConnectionPool`` come here: a tail on a
connection of its own or of the caller's reads alone, as before.

No task runs while nothing is queued: the first read of a burst starts a task that
sends statements until the queue is empty, and then ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import TYPE_CHECKING

import psycopg

from ._db import statement_conn
from ._errors import RunNotFound
from ._gateway import tail as _gw
from ._gateway._exec import run

if TYPE_CHECKING:
    import uuid

    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    from ._events import Event

__all__ = ["ReadBatcher", "batcher"]

# Reads per statement: a statement of a thousand reads takes a few milliseconds; past
# that, the reads queued behind it wait for the next one.
MAX_READS = 1000
# Rows per statement, counted by the reads' limits (the tails' ``batch``): a thousand
# tails catching up on long journals would otherwise fetch half a million rows at once
# (each tail reading alone through a pool of ten had at most ten reads' rows in hand).
MAX_ROWS = 50_000

Result = tuple["list[Event]", "_gw.RunEnd | None"]

_BATCHERS: weakref.WeakKeyDictionary[AsyncConnectionPool[AsyncConnection], dict[str, ReadBatcher]] = (
    weakref.WeakKeyDictionary()
)


def batcher(pool: AsyncConnectionPool[AsyncConnection], schema: str) -> ReadBatcher:
    """The read batcher of ``pool`` and ``schema``, made on first use (it lives as long
    as the pool does, and holds no task while idle)."""
    by_schema = _BATCHERS.get(pool)
    if by_schema is None:
        by_schema = _BATCHERS[pool] = {}
    found = by_schema.get(schema)
    if found is None:
        found = by_schema[schema] = ReadBatcher(pool, schema)
    return found


class _Read:
    __slots__ = ("future", "request")

    def __init__(self, request: _gw.ReadRequest, future: asyncio.Future[Result]) -> None:
        self.request = request
        self.future = future


class ReadBatcher:
    """Sends the tail reads queued on one pool and schema as one statement at a time."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection], schema: str) -> None:
        # Weak: the batcher is the value of a WeakKeyDictionary keyed by this pool.
        self._pool = weakref.ref(pool)
        self._schema = schema
        self._queue: list[_Read] = []
        self._task: asyncio.Task[None] | None = None
        self.statements = 0
        """Statements sent (a read alone counts one, as a batch of one)."""
        self.reads = 0
        """Reads answered or failed by those statements."""

    @property
    def busy(self) -> bool:
        """Whether a task is sending reads now (none is left once the queue is empty)."""
        return self._task is not None

    async def read(self, run_id: uuid.UUID, after: int, limit: int) -> Result:
        """What ``read_plan`` returns for this read: the run's events after ``after``
        (at most ``limit``), or none and the run's ending. Raises :class:`RunNotFound`,
        or the statement's error (every read of a failed statement gets it)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._queue.append(_Read(_gw.ReadRequest(run_id, after, limit), future))
        if self._task is None:
            self._task = loop.create_task(self._drain())
        # A waiter cancelled here cancels its future; the drain skips it.
        return await future

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch = self._take()
                if batch:
                    await self._send(batch)
        finally:
            # (No await between the empty queue and here: a read queued later starts a task.)
            self._task = None
            left, self._queue = self._queue, []
            _fail(left, psycopg.OperationalError("the tail's read was abandoned"))

    def _take(self) -> list[_Read]:
        """The next statement's reads, in queued order (the cancelled ones dropped): at
        least one, at most :data:`MAX_READS`, and at most :data:`MAX_ROWS` rows by
        their limits."""
        batch: list[_Read] = []
        rows = taken = 0
        for r in self._queue:
            if not r.future.done():
                if batch and (len(batch) >= MAX_READS or rows + r.request.limit > MAX_ROWS):
                    break
                batch.append(r)
                rows += r.request.limit
            taken += 1
        del self._queue[:taken]
        return batch

    async def _send(self, batch: list[_Read]) -> None:
        self.statements += 1
        self.reads += len(batch)
        pool = self._pool()
        try:
            if pool is None:
                raise psycopg.OperationalError("the pool is gone")
            async with statement_conn(pool) as conn:
                results = await run(conn, _gw.read_events_many(self._schema, [r.request for r in batch]))
        except BaseException as exc:
            if not isinstance(exc, Exception):  # cancelled: the waiters retry
                _fail(batch, psycopg.OperationalError("the tail's read was cancelled"))
                raise
            _fail(batch, exc)
            if pool is not None and isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
                # Once for the batch, not once per tail: weed out the pool's dead
                # connections before the next statement takes one.
                with contextlib.suppress(Exception):
                    await pool.check()
            return
        for r, result in zip(batch, results, strict=True):
            if r.future.done():
                continue
            if result is None:
                r.future.set_exception(RunNotFound(r.request.run_id))
            else:
                r.future.set_result(result)


def _fail(reads: list[_Read], exc: BaseException) -> None:
    for r in reads:
        if not r.future.done():
            r.future.set_exception(exc)
