"""Turns what a host hands runrow (conninfo, pool or connection) into a connection."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypeAlias

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from . import _sql
from .errors import InvalidInput, SchemaOutOfDate

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

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
            async with db.transaction():
                yield db
    elif isinstance(db, AsyncConnectionPool):
        async with db.connection() as conn, conn.transaction():
            yield conn
    elif isinstance(db, str):
        async with await AsyncConnection.connect(db) as conn, conn.transaction():
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
                async with conn.transaction():
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
