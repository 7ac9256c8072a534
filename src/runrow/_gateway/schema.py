"""The schema's version: what a dispatcher and the API check before they use it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg

from .. import _sql
from .._errors import SchemaOutOfDate

if TYPE_CHECKING:
    from psycopg import AsyncConnection


def latest_version() -> int:
    """The schema version this runrow needs: the number of its migrations."""
    return len(_sql.migrations())


async def version(conn: AsyncConnection, schema: str) -> int | None:
    """The migration version of ``schema``, or None if it was never migrated."""
    table = psycopg.sql.Identifier(schema, "schema_version").as_string(conn)
    cur = await conn.execute(_sql.statement("version_table_exists", schema), {"version_table": table})
    row = await cur.fetchone()
    if row is None or not row[0]:
        return None
    cur = await conn.execute(_sql.statement("max_version", schema))
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def require(conn: AsyncConnection, schema: str) -> None:
    """Raises :class:`SchemaOutOfDate` unless ``schema`` is at this runrow's version."""
    expected = latest_version()
    found = await version(conn, schema)
    if found != expected:
        raise SchemaOutOfDate(schema, found, expected)
