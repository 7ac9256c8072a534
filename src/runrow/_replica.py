"""Tails served from a hot standby: ``tail(db, run_id, read_from=replica)``.

The events and the run's ending are read from the standby; ``db`` stays the primary,
where the notifications come from, and where a read goes when the standby cannot serve it.

A notification comes from the primary as soon as the event commits there, and the standby
replays that commit a little later. So a tail woken by one (and a tail's first read, whose
cursor may come from a stream served by the primary) first learns where the primary's WAL
ends (``pg_current_wal_lsn()``, one statement shared by the tails of the process that wake
together on one primary: :class:`_LsnSource`), then waits until the standby has replayed
that far before it reads. Past ``replica_lag_budget`` seconds it reads the primary instead,
and says so (a log line, and :data:`STATS`). A standby that cannot be reached (down,
restarting) sends the tail's reads to the primary for :data:`RETRY` seconds, then the tail
tries it again.

Why nothing is skipped or repeated: every read is "the run's events after my cursor", a
prefix of one run's append-only, gap-free journal, read in one snapshot, wherever it is
read. A standby that lags holds a shorter prefix of the same journal: it can only make
the read late (fewer events, or none yet), never give a different event at a seq. A read
that finds the standby behind the tail's own cursor (possible after a read on the
primary) finds no events and is taken as "nothing yet", not as a cursor past the end.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import TYPE_CHECKING, Any

import anyio
import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from . import _aio
from ._db import Database, describe, statement_conn
from ._gateway import tail as _gw
from ._gateway._exec import configure_own, run
from ._tailbatch import batcher

if TYPE_CHECKING:
    import uuid
    from collections.abc import Awaitable, Callable

    from ._events import Event
    from ._gateway._exec import Plan

__all__ = ["RETRY", "STATS", "ReplicaReader"]

log = logging.getLogger("runrow.journal")

RETRY = 1.0
"""Seconds a tail reads the primary after its standby could not be reached."""

STATS: dict[str, int] = {"replica_reads": 0, "lag_fallbacks": 0, "down_fallbacks": 0, "lsn_reads": 0}
"""Process-wide counters: reads served by a standby, reads sent to the primary because the
standby lagged past the budget or could not be reached, and primary LSN statements."""

Result = tuple["list[Event]", "_gw.RunEnd | None"]


class _LsnSource:
    """The primary's WAL end, asked once for all the tails that wake together: a tail
    woken at ``t`` takes the answer of a statement sent at or after ``t``, the one in
    flight if it was sent since, else the next one, which every tail that comes while
    one is in flight shares (at most two statements per burst of wakes)."""

    def __init__(self, primary: Database, schema: str) -> None:
        # Weak for a pool or connection: this source is the value of a WeakKeyDictionary
        # keyed by it (see _lsn_source).
        self._dsn = primary if isinstance(primary, str) else None
        self._ref = None if isinstance(primary, str) else weakref.ref(primary)
        self._schema = schema
        self._conn: AsyncConnection | None = None
        self._inflight: asyncio.Future[str] | None = None
        self._next: asyncio.Future[str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._sent = -1.0

    async def after(self, t: float) -> str:
        if self._inflight is not None and self._sent >= t:
            return await asyncio.shield(self._inflight)
        if self._next is None:
            loop = asyncio.get_running_loop()
            self._next = loop.create_future()
            if self._task is None:
                self._task = loop.create_task(self._drain())
        return await asyncio.shield(self._next)

    async def _drain(self) -> None:
        try:
            while self._next is not None:
                future, self._next = self._next, None
                self._inflight, self._sent = future, _aio.now()
                await self._ask(future)
                self._inflight = None
        finally:
            self._task = None
            self._inflight = None

    async def _ask(self, future: asyncio.Future[str]) -> None:
        try:
            STATS["lsn_reads"] += 1
            if self._dsn is not None:
                if self._conn is None or self._conn.closed:
                    self._conn = await AsyncConnection.connect(self._dsn, autocommit=True)
                    await configure_own(self._conn)
                lsn = await run(self._conn, _gw.primary_wal_lsn(self._schema))
            else:
                primary = self._ref() if self._ref is not None else None
                if primary is None:
                    raise psycopg.OperationalError("the primary's pool is gone")
                async with statement_conn(primary) as conn:
                    lsn = await run(conn, _gw.primary_wal_lsn(self._schema))
        except Exception as exc:
            if self._conn is not None:
                await self._conn.close()
                self._conn = None
            future.set_exception(exc)
            future.exception()  # (retrieved: its waiters raise it, if any is left)
        else:
            future.set_result(lsn)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()


_SOURCES: weakref.WeakKeyDictionary[Any, dict[str, _LsnSource]] = weakref.WeakKeyDictionary()


def _lsn_source(primary: Database, schema: str) -> _LsnSource:
    """Shared by the tails on one pool or connection; a tail given a conninfo keeps its own
    (one connection to the primary, as for its reads there)."""
    if isinstance(primary, str):
        return _LsnSource(primary, schema)
    by_schema = _SOURCES.setdefault(primary, {})
    if schema not in by_schema:
        by_schema[schema] = _LsnSource(primary, schema)
    return by_schema[schema]


class ReplicaReader:
    """One tail's reads on a standby (see the module's docstring)."""

    def __init__(
        self,
        primary: Database,
        replica: Database,
        schema: str,
        budget: float,
        prepared_statements: bool,
        read_plan: Callable[[str, uuid.UUID, int, int], Plan[Result]],
    ) -> None:
        self._read_plan = read_plan  # (the tail's single read: _tail imports this module)
        self._lsn = _lsn_source(primary, schema)
        self._owns_lsn = isinstance(primary, str)
        self._replica = replica
        self._schema = schema
        self._budget = budget
        self._prepared = prepared_statements
        self._conn: AsyncConnection | None = None
        self._down_until = 0.0
        self.on_primary = False
        """Whether the last read went to the primary."""

    async def read(
        self,
        rid: uuid.UUID,
        cursor: int,
        batch: int,
        *,
        woken_at: float | None,
        primary: Callable[[], Awaitable[Result]],
    ) -> Result:
        """The read of ``tail``: on the standby once it has replayed what the primary had
        at ``woken_at`` (None: any standby state will do, the read may only be late), else
        ``primary()``."""
        self.on_primary = True
        if _aio.now() < self._down_until:
            return await primary()
        try:
            if woken_at is not None and not await self._caught_up(woken_at):
                STATS["lag_fallbacks"] += 1
                log.warning(
                    "tail of run %s: the replica lags more than %.1fs behind the primary; reading the primary",
                    rid,
                    self._budget,
                    extra={"run_id": str(rid)},
                )
                return await primary()
            rows, state = await self._read(rid, cursor, batch)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            STATS["down_fallbacks"] += 1
            log.warning(
                "tail of run %s cannot read the replica (%s); reading the primary for %.0fs",
                rid,
                describe(exc),
                RETRY,
                extra={"run_id": str(rid)},
            )
            await self.close()
            self._down_until = _aio.now() + RETRY
            return await primary()
        self.on_primary = False
        STATS["replica_reads"] += 1
        if not rows and state is not None and state.last_seq is not None and cursor > state.last_seq:
            return [], None  # the standby is behind this tail's cursor: nothing yet
        return rows, state

    async def _caught_up(self, woken_at: float) -> bool:
        """Whether the standby replays past the primary's WAL end (asked after ``woken_at``)
        within the budget."""
        lsn = await self._lsn.after(woken_at)
        step = 0.005
        with anyio.move_on_after(self._budget):
            while True:
                if await self._statement(_gw.replica_replayed(self._schema, lsn=lsn)):
                    return True
                await anyio.sleep(step)
                step = min(step * 2, 0.05)
        return False

    async def _statement(self, plan: Any) -> Any:
        if isinstance(self._replica, str):
            if self._conn is None or self._conn.closed:
                self._conn = await AsyncConnection.connect(
                    self._replica, autocommit=True, prepare_threshold=5 if self._prepared else None
                )
                if self._prepared:
                    await configure_own(self._conn)
            return await run(self._conn, plan)
        async with statement_conn(self._replica) as conn:
            return await run(conn, plan)

    async def _read(self, rid: uuid.UUID, cursor: int, batch: int) -> Result:
        if isinstance(self._replica, AsyncConnectionPool):
            return await batcher(self._replica, self._schema).read(rid, cursor, batch)
        result: Result = await self._statement(self._read_plan(self._schema, rid, cursor, batch))
        return result

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()
        if self._owns_lsn:
            await self._lsn.close()
