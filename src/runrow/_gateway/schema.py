"""The schema's version and its migrations: what ``migrate`` applies, and what a
dispatcher and the API check before they use the schema.

These statements run with plain ``conn.execute``, not :func:`._exec.execute`: a migration
is a multi-statement script, which a pipeline (the JIT guard's) cannot carry, and none
of them is planned at a cost JIT would compile.
"""

from __future__ import annotations

from typing import NamedTuple

import psycopg

from .. import _sql
from .._errors import SchemaOutOfDate
from ._exec import Plan, Query


class Migration(NamedTuple):
    """One forward-only step: its number, its name and its script (``{schema}`` unrendered)."""

    version: int
    name: str
    text: str


def migrations() -> tuple[Migration, ...]:
    """Every migration this runrow ships, in order (numbered from 1, increasing; a number
    may be skipped while a parallel change holds it)."""
    return tuple(Migration(*step) for step in _sql.migrations())


def latest_version() -> int:
    """The schema version this runrow needs: the number of its last migration."""
    return migrations()[-1].version


def version(schema: str) -> Plan[int | None]:
    """The migration version of ``schema``, or None if it was never migrated (a plan, see
    :mod:`._exec`, of plain statements)."""
    table = psycopg.sql.Identifier(schema, "schema_version").as_string()
    rows = yield Query(_sql.statement("version_table_exists", schema), {"version_table": table}, plain=True)
    if not rows or not rows[0][0]:
        return None
    rows = yield Query(_sql.statement("max_version", schema), plain=True)
    return int(rows[0][0]) if rows else 0


def require(schema: str) -> Plan[None]:
    """Raises :class:`SchemaOutOfDate` unless ``schema`` is at this runrow's version."""
    expected = latest_version()
    found = yield from version(schema)
    if found != expected:
        raise SchemaOutOfDate(schema, found, expected)


def lock_for_migration(schema: str, *, lock_key: str) -> Plan[set[int]]:
    """In the caller's transaction: takes the schema's migration lock (held until it ends),
    creates the schema and its version table if missing, and returns the versions applied."""
    yield Query(_sql.statement("migrate_lock", schema), {"lock_key": lock_key}, plain=True)
    yield Query(_sql.statement("create_schema", schema), plain=True)
    yield Query(_sql.statement("create_version_table", schema), plain=True)
    rows = yield Query(_sql.statement("applied_versions", schema), plain=True)
    return {row[0] for row in rows}


def apply_migration(schema: str, *, step: Migration) -> Plan[None]:
    """In the caller's transaction: runs ``step``'s script on ``schema`` and records its version."""
    yield Query(_sql.render(step.text, schema), plain=True)
    yield Query(
        _sql.statement("record_version", schema), {"version": step.version, "name": step.name}, plain=True
    )


def drop(schema: str) -> Plan[None]:
    """Drops ``schema`` and everything in it (runrow.testing's throwaway schemas only)."""
    yield Query(_sql.statement("drop_schema", schema), plain=True)


def dashboard_indexes(schema: str) -> Plan[None]:
    """Builds the dashboard's runs-list indexes, concurrently (opt-in since migration 12).

    Run it on an autocommit connection: each ``CREATE INDEX CONCURRENTLY`` is a
    statement of its own. An index a cancelled build left invalid is not rebuilt by
    ``IF NOT EXISTS``; it is reported instead, for the operator to drop.
    """
    rows = yield Query(_sql.statement("dashboard_indexes_invalid", schema), {"schema": schema}, plain=True)
    if rows:
        names = ", ".join(str(r[0]) for r in rows)
        raise psycopg.errors.ObjectNotInPrerequisiteState(
            f"invalid index(es) left by an interrupted build: {names}; "
            f"DROP INDEX CONCURRENTLY each (in schema {schema}), then run this again"
        )
    yield Query(_sql.statement("dashboard_index_created", schema), plain=True)
    yield Query(_sql.statement("dashboard_index_status", schema), plain=True)
    yield Query(_sql.statement("dashboard_index_tenant", schema), plain=True)
    yield Query(_sql.statement("dashboard_index_user", schema), plain=True)
    yield Query(_sql.statement("dashboard_index_worker", schema), plain=True)
