"""Turns what a host hands runrow (conninfo, pool or connection) into a connection."""

from __future__ import annotations

import weakref
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio
import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from . import _sql
from ._errors import InvalidInput, SchemaOutOfDate

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping, Sequence

    from psycopg import AsyncCursor

Database: TypeAlias = str | AsyncConnectionPool[AsyncConnection] | AsyncConnection
"""Where runrow finds the database: a conninfo string, a pool or an open connection."""

# Errors that mean "the tables runrow expects are not there".
MISSING_SCHEMA = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
)


# -- JIT: no runrow statement is ever compiled (see sql/session.sql) --------------------

# Connections whose session runrow itself set to jit = off (its own, direct connections).
_JIT_OFF: weakref.WeakSet[AsyncConnection] = weakref.WeakSet()

# Connections to a server that cannot compile at all (no JIT provider: built without
# LLVM, like the embedded wheel's), and to one that can. Asked once per connection
# (see _no_jit); a connection in neither set has not been asked yet.
_NO_JIT: weakref.WeakSet[AsyncConnection] = weakref.WeakSet()
_CAN_JIT: weakref.WeakSet[AsyncConnection] = weakref.WeakSet()

# Connections inside a transaction runrow opened itself (see own_transaction), and
# whether JIT is already off in it: once it is, the rest of the transaction runs plainly.
_OWN_TX: weakref.WeakKeyDictionary[AsyncConnection, bool] = weakref.WeakKeyDictionary()


async def configure_own(conn: AsyncConnection) -> None:
    """Turns JIT off for the session of a connection runrow opened and keeps to itself.

    One statement per connection, none per statement afterwards. Only for direct
    connections: behind a transaction pooler the next statement may run on another
    server session, so those connections take the per-statement guard of :func:`execute`.
    """
    await conn.execute(_sql.statement("jit_off_session", "public"))
    _JIT_OFF.add(conn)


async def _no_jit(conn: AsyncConnection) -> bool:
    """Whether ``conn``'s server cannot JIT-compile anything, so needs no guard.

    Asked once per connection, and only of an idle autocommit connection, where the
    probe is its own implicit transaction: on any other it would open or join a
    transaction of the host's, so that connection keeps the guard until it is idle.
    """
    if conn in _NO_JIT:
        return True
    if conn in _CAN_JIT or not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    cur = await conn.execute(_sql.statement("jit_provider_available", "public"))
    row = await cur.fetchone()
    (_CAN_JIT if row is not None and row[0] else _NO_JIT).add(conn)
    return conn in _NO_JIT


def jit_off_session(conn: AsyncConnection) -> bool:
    """Whether ``conn`` is one of runrow's own direct connections (see :func:`configure_own`)."""
    return conn in _JIT_OFF


async def execute(
    conn: AsyncConnection,
    query: bytes,
    params: Mapping[str, Any] | Sequence[Any] | None = None,
    *,
    cursor: AsyncCursor[Any] | None = None,
) -> AsyncCursor[Any]:
    """Runs one statement on ``conn`` with JIT off, and returns its cursor, results read.

    On a connection runrow configured itself, or to a server that cannot compile at all
    (no JIT provider, asked once per connection), this is a plain ``execute``. On any other
    (the host's pool or connection) the statement is pipelined behind a transaction-local
    ``jit = off``: one round trip still, and nothing of the host's session changes. In
    a transaction runrow opened on such a connection (:func:`own_transaction`) only its
    first statement takes that guard: the setting lasts until the transaction ends, and
    the later statements run plainly. In the host's own transaction every statement
    takes it, and the host's setting is put back in the same round trip.
    """
    cur = cursor if cursor is not None else conn.cursor()
    if conn in _JIT_OFF or await _no_jit(conn):
        await cur.execute(query, params)
        return cur
    joined = conn.info.transaction_status == TransactionStatus.INTRANS
    own = _OWN_TX.get(conn)
    if own is not None and joined:
        if own:
            await cur.execute(query, params)
        else:
            async with conn.pipeline():
                await conn.execute(_sql.statement("jit_off_local", "public"))
                await cur.execute(query, params)
            _OWN_TX[conn] = True
        return cur
    async with conn.pipeline():
        if joined:
            await conn.execute(_sql.statement("jit_save_off_local", "public"))
        else:
            await conn.execute(_sql.statement("jit_off_local", "public"))
        await cur.execute(query, params)
        if joined:
            await conn.execute(_sql.statement("jit_restore_local", "public"))
    return cur


@asynccontextmanager
async def own_transaction(conn: AsyncConnection) -> AsyncIterator[AsyncConnection]:
    """``conn.transaction()``, opened by runrow on a connection that was not inside one:
    :func:`execute` turns JIT off once for all of it (it ends with the transaction).

    Nothing inside may open a savepoint before the first statement: a savepoint rolled
    back would take the setting with it. runrow's own blocks open none.
    """
    if conn.autocommit:
        await _no_jit(conn)  # (asked while still idle: inside the transaction it cannot be)
    async with conn.transaction():
        if conn in _JIT_OFF or conn in _NO_JIT:
            yield conn
            return
        _OWN_TX[conn] = False
        try:
            yield conn
        finally:
            _OWN_TX.pop(conn, None)


@asynccontextmanager
async def atomic(db: Database) -> AsyncIterator[AsyncConnection]:
    """A connection on which what runs inside the block commits together or not at all.

    A caller's connection already inside a transaction is joined as it is: the work
    commits or rolls back with the caller's own writes. Otherwise runrow opens the
    transaction and commits it at the end of the block.
    """
    if isinstance(db, AsyncConnection):
        if db.info.transaction_status == TransactionStatus.INTRANS:
            yield db
        else:
            async with own_transaction(db):
                yield db
    elif isinstance(db, AsyncConnectionPool):
        async with db.connection() as conn, own_transaction(conn):
            yield conn
    elif isinstance(db, str):
        async with await AsyncConnection.connect(db) as conn, own_transaction(conn):
            yield conn
    else:
        raise InvalidInput(
            "db",
            f"expected a conninfo string, an AsyncConnectionPool or an AsyncConnection, "
            f"got {type(db).__name__}",
        )


@asynccontextmanager
async def statement_conn(db: Database) -> AsyncIterator[AsyncConnection]:
    """A connection for one self-contained statement (atomic on its own).

    Autocommit connections run it as one round trip; others get a transaction.
    """
    if isinstance(db, AsyncConnectionPool):
        async with db.connection() as conn:
            if conn.autocommit:
                yield conn
            else:
                async with own_transaction(conn):
                    yield conn
    elif (
        isinstance(db, AsyncConnection)
        and db.autocommit
        and db.info.transaction_status == TransactionStatus.IDLE
    ):
        yield db
    else:
        async with atomic(db) as conn:
            yield conn


async def schema_version(conn: AsyncConnection, schema: str) -> int | None:
    """The migration version of ``schema``, or None if it was never migrated."""
    table = psycopg.sql.Identifier(schema, "schema_version").as_string(conn)
    cur = await conn.execute(_sql.statement("version_table_exists", schema), {"version_table": table})
    row = await cur.fetchone()
    if row is None or not row[0]:
        return None
    cur = await conn.execute(_sql.statement("max_version", schema))
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def require_schema(conn: AsyncConnection, schema: str) -> None:
    """Raises :class:`SchemaOutOfDate` unless ``schema`` is at this runrow's version."""
    expected = len(_sql.migrations())
    found = await schema_version(conn, schema)
    if found != expected:
        raise SchemaOutOfDate(schema, found, expected)


@asynccontextmanager
async def schema_guard(db: Database, schema: str) -> AsyncIterator[None]:
    """Turns "relation does not exist" into :class:`SchemaOutOfDate`, which names the fix."""
    try:
        yield
    except MISSING_SCHEMA as exc:
        try:
            async with statement_conn(db) as conn:
                found = await schema_version(conn, schema)
        except psycopg.Error:
            found = None  # e.g. the caller's transaction is aborted: say what we can
        expected = len(_sql.migrations())
        raise SchemaOutOfDate(schema, found if found != expected else None, expected) from exc


def describe(exc: BaseException) -> str:
    """An error for a log line: its type, SQLSTATE and primary message.

    Never the server's DETAIL: for constraint errors PostgreSQL quotes the failing row
    there, and rows hold users' messages, which logs must not carry.
    """
    name = type(exc).__name__
    if isinstance(exc, psycopg.Error) and exc.sqlstate:
        return f"{name} [{exc.sqlstate}]: {exc.diag.message_primary or ''}".rstrip(": ")
    return f"{name}: {exc}" if str(exc) else name


# How long giving a kept connection back may spend taking a session setting off.
_UNDO_SECONDS = 2.0


class HeldConnection:
    """One pooled connection that a serial loop (the claim loop, a group-commit writer)
    keeps between its statements instead of taking one from the pool each time.

    Getting and returning a pooled connection costs measurably per statement, and a
    statement prepared on a connection the loop keeps stays warm. A statement that
    fails gives the connection back for the pool to test (and replace if broken). With
    a pool smaller than ``min_pool`` nothing is kept: the other writers need it.
    """

    def __init__(self, pool: Callable[[], AsyncConnectionPool[AsyncConnection]], *, min_pool: int) -> None:
        self._pool = pool
        self._min_pool = min_pool
        self._conn: AsyncConnection | None = None
        self._undo: bytes | None = None

    def keeps(self, conn: AsyncConnection) -> bool:
        """Whether ``conn`` is the connection kept here (not one taken for one statement)."""
        return conn is self._conn

    def carries(self, conn: AsyncConnection) -> bool:
        """Whether ``conn`` is the kept connection and its session carries the loop's
        setting (a connection given back has had it taken off, even if the pool hands
        the same one out again)."""
        return conn is self._conn and self._undo is not None

    def session_changed(self, undo: bytes) -> None:
        """The kept connection's session now carries a setting of the loop's own. When
        the connection is given back, ``undo`` (a statement) takes it off first; if that
        fails, the connection is closed instead of handed to the pool's other users."""
        self._undo = undo

    @asynccontextmanager
    async def statement(self) -> AsyncIterator[AsyncConnection]:
        """A connection for one self-contained statement, as ``statement_conn``."""
        pool = self._pool()
        if pool.max_size < self._min_pool:
            async with statement_conn(pool) as conn:
                yield conn
            return
        if self._conn is None:
            self._conn = await pool.getconn()
        try:
            async with statement_conn(self._conn) as conn:
                yield conn
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.release()
            raise

    async def release(self) -> None:
        """Gives the kept connection back to the pool (at shutdown, or after a failure)."""
        conn, self._conn = self._conn, None
        undo, self._undo = self._undo, None
        if conn is not None:
            if undo is not None and not await _undone(conn, undo):
                await conn.close()  # the pool discards it (and opens another if it needs one)
            await self._pool().putconn(conn)


async def _undone(conn: AsyncConnection, undo: bytes) -> bool:
    """Runs ``undo`` on an idle connection, within a short bound; False if it did not."""
    if conn.closed or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    try:
        with anyio.fail_after(_UNDO_SECONDS):
            await conn.execute(undo)
    except Exception:  # broken, refused or too slow: the caller closes the connection
        return False
    return True
