"""Runs bound statements on a connection, with JIT off (see sql/session.sql).

The gateway runs statements through :func:`run` (plans) or :func:`execute`; nothing
else in runrow runs SQL text.

Plans: the gateway's functions are written once, as *plans* (see the package's
docstring for the few exceptions): generators that yield each :class:`Query` and get its
rows back, then return a typed record. :func:`run` executes a plan on an
``AsyncConnection``, :func:`run_sync` on a ``Connection`` (the sync API shares them); the
rules of the JIT guard (which statement goes before and after a query) are decided once,
in :func:`_guard`, for both.
"""

from __future__ import annotations

import math
import weakref
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

from psycopg.pq import TransactionStatus

from .. import _sql

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Generator, Iterator, Mapping, Sequence

    from psycopg import AsyncConnection, AsyncCursor, Connection, Cursor
    from psycopg.rows import BaseRowFactory

T = TypeVar("T")
AnyConnection: TypeAlias = "AsyncConnection[Any] | Connection[Any]"

# -- JIT: no runrow statement is ever compiled (see sql/session.sql) --------------------

# Connections whose session runrow itself set to jit = off (its own, direct connections).
_JIT_OFF: weakref.WeakSet[AnyConnection] = weakref.WeakSet()

# Connections to a server that cannot compile at all (no JIT provider: built without
# LLVM, like the embedded wheel's), and to one that can. Asked once per connection
# (see _no_jit); a connection in neither set has not been asked yet.
_NO_JIT: weakref.WeakSet[AnyConnection] = weakref.WeakSet()
_CAN_JIT: weakref.WeakSet[AnyConnection] = weakref.WeakSet()

# Connections inside a transaction runrow opened itself that turned JIT off at its start
# (see own_transaction): the rest of the transaction runs plainly.
_OWN_TX: weakref.WeakSet[AnyConnection] = weakref.WeakSet()

OWN_TX_IDLE_SECONDS = 10.0
"""How long a transaction runrow opens itself may wait for its client before the server
ends it (``idle_in_transaction_session_timeout``): a process frozen mid-transaction
(SIGSTOP, a paused VM) would otherwise hold the rows it locked, a lost run the reaper
must end among them, for as long as the freeze lasts. runrow sends a transaction's
statements back to back, so a legitimate one never idles near this long."""

# Runrow's own connections whose session carries that bound (see configure_own), and its
# value: their transactions need no prelude of their own.
_IDLE_BOUND: weakref.WeakKeyDictionary[AnyConnection, float] = weakref.WeakKeyDictionary()


def _idle(seconds: float | None) -> tuple[float, dict[str, str]]:
    """The idle bound (seconds), and the parameters that set it (sql/session.sql)."""
    value = OWN_TX_IDLE_SECONDS if seconds is None else seconds
    if not value > 0:  # (also refuses NaN)
        raise ValueError(f"idle_seconds must be above 0, got {seconds!r}")
    return value, {"idle": f"{max(1, round(value * 1000))}ms"}


async def configure_own(conn: AsyncConnection, *, idle_seconds: float | None = None) -> None:
    """Sets up the session of a connection runrow opened and keeps to itself: JIT off,
    and the idle bound of the transactions runrow opens on it (``idle_seconds``, see
    :data:`OWN_TX_IDLE_SECONDS`), which then need no setting of their own.

    One statement per connection, none per statement afterwards. Only for direct
    connections: behind a transaction pooler the next statement may run on another
    server session, so those connections take the per-statement guard of :func:`execute`.
    """
    seconds, params = _idle(idle_seconds)
    await conn.execute(_sql.statement("jit_off_session", "public"), params)
    _JIT_OFF.add(conn)
    _IDLE_BOUND[conn] = seconds


def configure_own_sync(conn: Connection[Any], *, idle_seconds: float | None = None) -> None:
    """:func:`configure_own` for a synchronous connection."""
    seconds, params = _idle(idle_seconds)
    conn.execute(_sql.statement("jit_off_session", "public"), params)
    _JIT_OFF.add(conn)
    _IDLE_BOUND[conn] = seconds


def _probe(conn: AnyConnection) -> bytes | None:
    """The statement that asks whether ``conn``'s server can JIT-compile, if it must be asked.

    Asked once per connection, and only of an idle autocommit connection, where the
    probe is its own implicit transaction: on any other it would open or join a
    transaction of the host's, so that connection keeps the guard until it is idle.
    """
    if conn in _NO_JIT or conn in _CAN_JIT:
        return None
    if not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        return None
    return _sql.statement("jit_provider_available", "public")


def _probed(conn: AnyConnection, row: Sequence[Any] | None) -> None:
    (_CAN_JIT if row is not None and row[0] else _NO_JIT).add(conn)


async def _no_jit(conn: AsyncConnection) -> bool:
    """Whether ``conn``'s server cannot JIT-compile anything, so needs no guard (see :func:`_probe`)."""
    probe = _probe(conn)
    if probe is not None:
        cur = await conn.execute(probe)
        _probed(conn, await cur.fetchone())
    return conn in _NO_JIT


def _no_jit_sync(conn: Connection[Any]) -> bool:
    probe = _probe(conn)
    if probe is not None:
        _probed(conn, conn.execute(probe).fetchone())
    return conn in _NO_JIT


def jit_off_session(conn: AsyncConnection) -> bool:
    """Whether ``conn`` is one of runrow's own direct connections (see :func:`configure_own`)."""
    return conn in _JIT_OFF


@dataclass(frozen=True, slots=True)
class _Guard:
    """What a statement on a host's connection is pipelined between."""

    before: bytes
    after: bytes | None


def _guard(conn: AnyConnection) -> _Guard | None:
    """The JIT guard a statement on ``conn`` needs now; None to run it plainly.

    On a connection runrow configured itself, or to a server that cannot compile at all,
    none. On any other (the host's pool or connection) the statement is pipelined behind a
    transaction-local ``jit = off``: one round trip still, and nothing of the host's
    session changes. A transaction runrow opened on such a connection
    (:func:`own_transaction`) turned it off at its start, for all of it. In the host's own
    transaction every statement takes the guard, and the host's setting is put back in
    the same round trip.
    """
    if conn in _JIT_OFF or conn in _NO_JIT:
        return None
    joined = conn.info.transaction_status == TransactionStatus.INTRANS
    if joined and conn in _OWN_TX:
        return None
    if joined:
        return _Guard(
            _sql.statement("jit_save_off_local", "public"), _sql.statement("jit_restore_local", "public")
        )
    return _Guard(_sql.statement("jit_off_local", "public"), None)


async def execute(
    conn: AsyncConnection,
    query: bytes,
    params: Mapping[str, Any] | Sequence[Any] | None = None,
    *,
    cursor: AsyncCursor[Any] | None = None,
    prepare: bool | None = None,
) -> AsyncCursor[Any]:
    """Runs one statement on ``conn`` with JIT off (see :func:`_guard`), and returns its
    cursor, results read. ``prepare``: psycopg's (False: never a server-side prepared
    statement, so each execution is planned for its values)."""
    cur = cursor if cursor is not None else conn.cursor()
    guard = None if conn in _JIT_OFF or await _no_jit(conn) else _guard(conn)
    if guard is None:
        await cur.execute(query, params, prepare=prepare)
        return cur
    async with conn.pipeline():
        await conn.execute(guard.before)
        await cur.execute(query, params, prepare=prepare)
        if guard.after is not None:
            await conn.execute(guard.after)
    return cur


def execute_sync(
    conn: Connection[Any],
    query: bytes,
    params: Mapping[str, Any] | Sequence[Any] | None = None,
    *,
    cursor: Cursor[Any] | None = None,
    prepare: bool | None = None,
) -> Cursor[Any]:
    """:func:`execute` for a synchronous connection."""
    cur = cursor if cursor is not None else conn.cursor()
    guard = None if conn in _JIT_OFF or _no_jit_sync(conn) else _guard(conn)
    if guard is None:
        cur.execute(query, params, prepare=prepare)
        return cur
    with conn.pipeline():
        conn.execute(guard.before)
        cur.execute(query, params, prepare=prepare)
        if guard.after is not None:
            conn.execute(guard.after)
    return cur


def _bounded(conn: AnyConnection, seconds: float) -> bool:
    """Whether ``conn``'s session already holds runrow's transactions to ``seconds`` or less."""
    return conn in _JIT_OFF and _IDLE_BOUND.get(conn, math.inf) <= seconds


@asynccontextmanager
async def own_transaction(
    conn: AsyncConnection, *, idle_seconds: float | None = None
) -> AsyncIterator[AsyncConnection]:
    """``conn.transaction()``, opened by runrow on a connection that was not inside one.

    The server ends it, and its session, if it waits more than ``idle_seconds`` (default
    :data:`OWN_TX_IDLE_SECONDS`) for its client: a client frozen mid-transaction lets go
    of the rows it locked. Unless the connection's session already carries that bound
    (runrow's own, see :func:`configure_own`), the transaction starts with a statement
    that sets it and turns JIT off, both local to the transaction; the rest of it then
    runs plainly. That statement is a round trip of its own: pipelined with the next
    one, psycopg's flush request after the pipeline's sync would leave the server's idle
    timer off until a later statement (and ``BEGIN`` pipelined keeps the whole
    transaction in pipeline mode, where no statement ends with a sync, so none arms it).
    """
    seconds, params = _idle(idle_seconds)
    async with conn.transaction():
        if _bounded(conn, seconds):
            yield conn
            return
        await conn.execute(_sql.statement("own_transaction_local", "public"), params)
        _OWN_TX.add(conn)
        try:
            yield conn
        finally:
            _OWN_TX.discard(conn)


@contextmanager
def own_transaction_sync(
    conn: Connection[Any], *, idle_seconds: float | None = None
) -> Iterator[Connection[Any]]:
    """:func:`own_transaction` for a synchronous connection."""
    seconds, params = _idle(idle_seconds)
    with conn.transaction():
        if _bounded(conn, seconds):
            yield conn
            return
        conn.execute(_sql.statement("own_transaction_local", "public"), params)
        _OWN_TX.add(conn)
        try:
            yield conn
        finally:
            _OWN_TX.discard(conn)


# -- plans: one statement sequence, run by an async or a sync executor -----------------


@dataclass(frozen=True, slots=True)
class Query:
    """One statement of a plan: its text, its parameters, how to build its rows,
    whether it runs plainly (no JIT guard: the schema's statements, see ``schema.py``),
    and psycopg's ``prepare`` (False: planned for its values every time, see
    :func:`execute`)."""

    text: bytes
    params: Mapping[str, Any] | None = None
    row_factory: BaseRowFactory[Any] | None = None
    plain: bool = False
    prepare: bool | None = None


Plan: TypeAlias = "Generator[Query, list[Any], T]"
"""A gateway call as a generator: it yields its statements, receives each one's rows
(all of them, a list), and returns its typed result. Run it with :func:`run` or
:func:`run_sync`; a plan calls another with ``yield from``."""


async def run(conn: AsyncConnection, plan: Plan[T]) -> T:
    """Executes ``plan`` on ``conn``, statement by statement, and returns its result."""
    try:
        query = next(plan)
        while True:
            cur = conn.cursor(row_factory=query.row_factory) if query.row_factory else conn.cursor()
            if query.plain:
                await cur.execute(query.text, query.params, prepare=query.prepare)
            else:
                await execute(conn, query.text, query.params, cursor=cur, prepare=query.prepare)
            query = plan.send(await cur.fetchall() if cur.description is not None else [])
    except StopIteration as done:
        return cast("T", done.value)
    finally:
        plan.close()


async def run_together(conn: AsyncConnection, plans: Sequence[Plan[Any]]) -> list[Any]:
    """Runs single-statement ``plans`` on autocommit ``conn`` in one transaction and one
    round trip (pipelined), and returns their results in order: the writes of many runs
    then share one commit. A statement that fails rolls the transaction back: none
    landed, and the error is raised."""
    queries = [next(plan) for plan in plans]
    cursors: list[AsyncCursor[Any]] = []
    try:
        # On an autocommit connection, the statements pipelined up to one Sync (the
        # pipeline's end) run in one implicit transaction: one commit, all or none.
        async with conn.pipeline():
            for query in queries:
                cur = conn.cursor(row_factory=query.row_factory) if query.row_factory else conn.cursor()
                await execute(conn, query.text, query.params, cursor=cur, prepare=query.prepare)
                cursors.append(cur)
        results = []
        for plan, cur in zip(plans, cursors, strict=True):
            try:
                plan.send(await cur.fetchall() if cur.description is not None else [])
            except StopIteration as done:
                results.append(done.value)
            else:
                raise RuntimeError("run_together takes plans of one statement")
        return results
    finally:
        for plan in plans:
            plan.close()


def run_sync(conn: Connection[Any], plan: Plan[T]) -> T:
    """:func:`run` on a synchronous connection."""
    try:
        query = next(plan)
        while True:
            cur = conn.cursor(row_factory=query.row_factory) if query.row_factory else conn.cursor()
            if query.plain:
                cur.execute(query.text, query.params, prepare=query.prepare)
            else:
                execute_sync(conn, query.text, query.params, cursor=cur, prepare=query.prepare)
            query = plan.send(cur.fetchall() if cur.description is not None else [])
    except StopIteration as done:
        return cast("T", done.value)
    finally:
        plan.close()
