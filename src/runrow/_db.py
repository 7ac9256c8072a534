"""Turns what a host hands runrow (conninfo, pool or connection) into a connection."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypeAlias, TypeVar, cast

import anyio
import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from ._errors import InvalidInput, JournalPartitionMissing, SchemaOutOfDate, no_journal_partition
from ._gateway import schema as _schema
from ._gateway._exec import own_transaction, run

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from ._ops import Operation

T = TypeVar("T")


Database: TypeAlias = str | AsyncConnectionPool[AsyncConnection] | AsyncConnection
"""Where runrow finds the database: a conninfo string, a pool or an open connection."""

# Errors that mean "the tables runrow expects are not there".
MISSING_SCHEMA = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
)


@asynccontextmanager
async def atomic(db: Database, *, idle_seconds: float | None = None) -> AsyncIterator[AsyncConnection]:
    """A connection on which what runs inside the block commits together or not at all.

    A caller's connection already inside a transaction is joined as it is: the work
    commits or rolls back with the caller's own writes. Otherwise runrow opens the
    transaction and commits it at the end of the block; the server ends it (and the
    session) if it waits more than ``idle_seconds`` for its client (see ``own_transaction``).
    """
    if isinstance(db, AsyncConnection):
        if db.info.transaction_status == TransactionStatus.INTRANS:
            yield db
        else:
            async with own_transaction(db, idle_seconds=idle_seconds):
                yield db
    elif isinstance(db, AsyncConnectionPool):
        async with db.connection() as conn, own_transaction(conn, idle_seconds=idle_seconds):
            yield conn
    elif isinstance(db, str):
        async with (
            await AsyncConnection.connect(db) as conn,
            own_transaction(conn, idle_seconds=idle_seconds),
        ):
            yield conn
    else:
        raise InvalidInput(
            "db",
            f"expected a conninfo string, an AsyncConnectionPool or an AsyncConnection, "
            f"got {type(db).__name__}",
        )


@asynccontextmanager
async def statement_conn(
    db: Database | HeldConnection, *, idle_seconds: float | None = None
) -> AsyncIterator[AsyncConnection]:
    """A connection for one self-contained statement (atomic on its own).

    Autocommit connections run it as one round trip; others get a transaction (bounded
    by ``idle_seconds``, as :func:`atomic`'s).
    """
    if isinstance(db, HeldConnection):
        async with db.statement() as conn:
            yield conn
    elif isinstance(db, AsyncConnectionPool):
        async with db.connection() as conn:
            if conn.autocommit:
                yield conn
            else:
                async with own_transaction(conn, idle_seconds=idle_seconds):
                    yield conn
    elif (
        isinstance(db, AsyncConnection)
        and db.autocommit
        and db.info.transaction_status == TransactionStatus.IDLE
    ):
        yield db
    else:
        async with atomic(db, idle_seconds=idle_seconds) as conn:
            yield conn


@asynccontextmanager
async def schema_guard(db: Database, schema: str) -> AsyncIterator[None]:
    """Turns "relation does not exist" into :class:`SchemaOutOfDate`, which names the fix."""
    try:
        yield
    except MISSING_SCHEMA as exc:
        raise await out_of_date(db, schema) from exc
    except psycopg.errors.CheckViolation as exc:
        if no_journal_partition(exc):
            raise JournalPartitionMissing(schema) from exc
        raise


async def out_of_date(db: Database, schema: str) -> SchemaOutOfDate:
    """The error that names the fix, after a statement found a relation missing (the
    inside of :func:`schema_guard`, for a loop that catches :data:`MISSING_SCHEMA` itself)."""
    try:
        async with statement_conn(db) as conn:
            found = await run(conn, _schema.version(schema))
    except psycopg.Error:
        found = None  # e.g. the caller's transaction is aborted: say what we can
    expected = _schema.latest_version()
    return SchemaOutOfDate(schema, found if found != expected else None, expected)


async def perform(db: Database, schema: str, op: Operation[T]) -> T:
    """Runs an operation of the API (see ``_ops.py``) and returns its result.

    Its checks run first, before a connection is taken; each step then runs in
    :func:`atomic` or :func:`statement_conn`, as it asks.
    """
    step = next(op)
    async with schema_guard(db, schema):
        while True:
            async with atomic(db) if step.atomic else statement_conn(db) as conn:
                result = await run(conn, step.plan)
            try:
                step = op.send(result)
            except StopIteration as done:
                return cast("T", done.value)


def describe(exc: BaseException) -> str:
    """An error for a log line: its type, SQLSTATE and primary message.

    Never the server's DETAIL: for constraint errors PostgreSQL quotes the failing row
    there, and rows hold users' messages, which logs must not carry.
    """
    name = type(exc).__name__
    if isinstance(exc, psycopg.Error) and exc.sqlstate:
        return f"{name} [{exc.sqlstate}]: {exc.diag.message_primary or ''}".rstrip(": ")
    return f"{name}: {exc}" if str(exc) else name


def out_of_budget(exc: BaseException, what: str, seconds: float) -> TimeoutError | None:
    """For a retried write that gives up on ``exc``: when ``exc`` is the bare
    ``TimeoutError`` of a deadline, which tells whoever reads the run's error nothing, a
    ``TimeoutError`` (still, for retry policies) naming the write and its budget, to raise
    from it; None to raise ``exc`` as it is."""
    if not isinstance(exc, TimeoutError) or str(exc):
        return None
    return TimeoutError(
        f"{what} did not land within {seconds:g}s (half the lease): the database was slow or unreachable"
    )


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

    def __init__(
        self,
        pool: Callable[[], AsyncConnectionPool[AsyncConnection]],
        *,
        min_pool: int,
        idle_seconds: float | None = None,
    ) -> None:
        self._pool = pool
        self._min_pool = min_pool
        self._idle = idle_seconds  # (a statement's own transaction, on a pool not in autocommit)
        self._conn: AsyncConnection | None = None
        self._undo: Callable[[AsyncConnection], Awaitable[None]] | None = None

    def keeps(self, conn: AsyncConnection) -> bool:
        """Whether ``conn`` is the connection kept here (not one taken for one statement)."""
        return conn is self._conn

    def carries(self, conn: AsyncConnection) -> bool:
        """Whether ``conn`` is the kept connection and its session carries the loop's
        setting (a connection given back has had it taken off, even if the pool hands
        the same one out again)."""
        return conn is self._conn and self._undo is not None

    def session_changed(self, undo: Callable[[AsyncConnection], Awaitable[None]]) -> None:
        """The kept connection's session now carries a setting of the loop's own. When
        the connection is given back, ``undo(conn)`` takes it off first; if that
        fails, the connection is closed instead of handed to the pool's other users."""
        self._undo = undo

    async def take(self) -> None:
        """Takes the connection to keep now rather than at the first statement, so a pool
        the other users have emptied by then cannot hold the loop's first statement up
        (a no-op below ``min_pool``, or when one is kept)."""
        pool = self._pool()
        if self._conn is None and pool.max_size >= self._min_pool:
            self._conn = await pool.getconn()

    @asynccontextmanager
    async def statement(self) -> AsyncIterator[AsyncConnection]:
        """A connection for one self-contained statement, as ``statement_conn``."""
        pool = self._pool()
        if pool.max_size < self._min_pool:
            async with statement_conn(pool, idle_seconds=self._idle) as conn:
                yield conn
            return
        if self._conn is None:
            self._conn = await pool.getconn()
        try:
            async with statement_conn(self._conn, idle_seconds=self._idle) as conn:
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


async def _undone(conn: AsyncConnection, undo: Callable[[AsyncConnection], Awaitable[None]]) -> bool:
    """Runs ``undo`` on an idle connection, within a short bound; False if it did not."""
    if conn.closed or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    try:
        with anyio.fail_after(_UNDO_SECONDS):
            await undo(conn)
    except Exception:  # broken, refused or too slow: the caller closes the connection
        return False
    return True
