"""The schema's version and its migrations: what ``migrate`` applies, and what a
dispatcher and the API check before they use the schema.

These statements run with plain ``conn.execute``, not :func:`._exec.execute`: a migration
is a multi-statement script, which a pipeline (the JIT guard's) cannot carry, and none
of them is planned at a cost JIT would compile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import psycopg

from .. import _sql
from .._errors import SchemaOutOfDate
from ._exec import Plan, Query, run

if TYPE_CHECKING:
    from psycopg import AsyncConnection


class Migration(NamedTuple):
    """One forward-only step: its number, its name and its script (``{schema}`` unrendered)."""

    version: int
    name: str
    text: str


def migrations() -> tuple[Migration, ...]:
    """Every migration this runrow ships, in order (numbered 1..n)."""
    return tuple(Migration(*step) for step in _sql.migrations())


def latest_version() -> int:
    """The schema version this runrow needs: the number of its migrations."""
    return len(migrations())


def version(schema: str) -> Plan[int | None]:
    """The migration version of ``schema``, or None if it was never migrated (a plan, see
    :mod:`._exec`, of plain statements)."""
    table = psycopg.sql.Identifier(schema, "schema_version").as_string()
    rows = yield Query(_sql.statement("version_table_exists", schema), {"version_table": table}, plain=True)
    if not rows or not rows[0][0]:
        return None
    rows = yield Query(_sql.statement("max_version", schema), plain=True)
    return int(rows[0][0]) if rows else 0


async def require(conn: AsyncConnection, schema: str) -> None:
    """Raises :class:`SchemaOutOfDate` unless ``schema`` is at this runrow's version."""
    expected = latest_version()
    found = await run(conn, version(schema))
    if found != expected:
        raise SchemaOutOfDate(schema, found, expected)


async def lock_for_migration(conn: AsyncConnection, schema: str, *, lock_key: str) -> set[int]:
    """In the caller's transaction: takes the schema's migration lock (held until it ends),
    creates the schema and its version table if missing, and returns the versions applied."""
    await conn.execute(_sql.statement("migrate_lock", schema), {"lock_key": lock_key})
    await conn.execute(_sql.statement("create_schema", schema))
    await conn.execute(_sql.statement("create_version_table", schema))
    cur = await conn.execute(_sql.statement("applied_versions", schema))
    return {row[0] for row in await cur.fetchall()}


async def apply_migration(conn: AsyncConnection, schema: str, *, step: Migration) -> None:
    """In the caller's transaction: runs ``step``'s script on ``schema`` and records its version."""
    await conn.execute(_sql.render(step.text, schema))
    await conn.execute(_sql.statement("record_version", schema), {"version": step.version, "name": step.name})


async def drop(conn: AsyncConnection, schema: str) -> None:
    """Drops ``schema`` and everything in it (runrow.testing's throwaway schemas only)."""
    await conn.execute(_sql.statement("drop_schema", schema))
