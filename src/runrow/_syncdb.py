"""``_db`` for synchronous hosts: what :mod:`runrow.sync` hands runrow (conninfo, a
``ConnectionPool`` or a ``Connection``) turned into a connection, with the same rules."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

import psycopg
from psycopg import Connection
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from ._db import MISSING_SCHEMA
from ._errors import InvalidInput, JournalPartitionMissing, SchemaOutOfDate, no_journal_partition
from ._gateway import schema as _schema
from ._gateway._exec import own_transaction_sync, run_sync

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._ops import Operation

T = TypeVar("T")

SyncDatabase: TypeAlias = str | ConnectionPool[Connection[Any]] | Connection[Any]
"""Where runrow finds the database, for a synchronous host: a conninfo string, a
``psycopg_pool.ConnectionPool`` or an open ``psycopg.Connection``."""


@contextmanager
def atomic(db: SyncDatabase) -> Iterator[Connection[Any]]:
    """``_db.atomic`` for a synchronous connection: a caller's open transaction is joined."""
    if isinstance(db, Connection):
        if db.info.transaction_status == TransactionStatus.INTRANS:
            yield db
        else:
            with own_transaction_sync(db):
                yield db
    elif isinstance(db, ConnectionPool):
        with db.connection() as conn, own_transaction_sync(conn):
            yield conn
    elif isinstance(db, str):
        with Connection.connect(db) as conn, own_transaction_sync(conn):
            yield conn
    else:
        raise InvalidInput(
            "db",
            f"expected a conninfo string, a ConnectionPool or a Connection, got {type(db).__name__}",
        )


@contextmanager
def statement_conn(db: SyncDatabase) -> Iterator[Connection[Any]]:
    """``_db.statement_conn`` for a synchronous connection (one self-contained statement)."""
    if isinstance(db, ConnectionPool):
        with db.connection() as conn:
            if conn.autocommit:
                yield conn
            else:
                with own_transaction_sync(conn):
                    yield conn
    elif (
        isinstance(db, Connection) and db.autocommit and db.info.transaction_status == TransactionStatus.IDLE
    ):
        yield db
    else:
        with atomic(db) as conn:
            yield conn


@contextmanager
def schema_guard(db: SyncDatabase, schema: str) -> Iterator[None]:
    """``_db.schema_guard``: "relation does not exist" becomes :class:`SchemaOutOfDate`."""
    try:
        yield
    except MISSING_SCHEMA as exc:
        try:
            with statement_conn(db) as conn:
                found = run_sync(conn, _schema.version(schema))
        except psycopg.Error:
            found = None  # e.g. the caller's transaction is aborted: say what we can
        expected = _schema.latest_version()
        raise SchemaOutOfDate(schema, found if found != expected else None, expected) from exc
    except psycopg.errors.CheckViolation as exc:
        if no_journal_partition(exc):
            raise JournalPartitionMissing(schema) from exc
        raise


def perform(db: SyncDatabase, schema: str, op: Operation[T]) -> T:
    """``_db.perform`` on a synchronous connection: the same operation, the same steps."""
    step = next(op)
    with schema_guard(db, schema):
        while True:
            with atomic(db) if step.atomic else statement_conn(db) as conn:
                result = run_sync(conn, step.plan)
            try:
                step = op.send(result)
            except StopIteration as done:
                return cast("T", done.value)
