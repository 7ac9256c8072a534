"""Forward-only schema migrations, safe to run from many processes at once."""

from __future__ import annotations

import logging

from psycopg import AsyncConnection

from ._errors import InvalidInput, SchemaOutOfDate
from ._gateway import partitions as _partitions
from ._gateway import schema as _schema
from ._gateway._exec import run
from ._names import DEFAULT_SCHEMA, check_schema

__all__ = ["latest_version", "migrate"]

log = logging.getLogger("runrow.migrate")


def latest_version() -> int:
    """The schema version this runrow needs."""
    return _schema.latest_version()


async def migrate(
    conninfo: str | AsyncConnection,
    *,
    schema: str = DEFAULT_SCHEMA,
    target: int | None = None,
    dashboard_indexes: bool = False,
) -> list[int]:
    """Brings ``schema`` up to ``target`` (default: the latest) and returns the versions applied.

    Each migration commits in its own transaction together with its version row,
    under a per-schema advisory lock, so concurrent migrators apply each step once
    and the others find it done. A schema newer than this runrow raises
    :class:`SchemaOutOfDate`.

    ``dashboard_indexes=True`` then builds the indexes of the dashboard's runs list
    (one per filter; opt-in since schema version 12, since each costs every run's status
    change a little: see ``docs/howto/dashboard.md``), with ``CREATE INDEX
    CONCURRENTLY`` (writes go on meanwhile; ``conninfo`` must then not be a connection
    inside a transaction). A second call finds them built and does nothing.
    """
    check_schema(schema)
    steps = _schema.migrations()
    latest = steps[-1].version
    goal = latest if target is None else target
    if not 0 <= goal <= latest:
        raise InvalidInput("target", f"must be between 0 and {latest}")
    if dashboard_indexes and goal < FIRST_OPT_IN_DASHBOARD:
        raise InvalidInput(
            "dashboard_indexes", f"needs the schema at version {FIRST_OPT_IN_DASHBOARD} or later"
        )
    if isinstance(conninfo, AsyncConnection):
        return await _migrate_then_index(conninfo, schema, steps, goal, dashboard_indexes)
    async with await AsyncConnection.connect(conninfo, autocommit=True) as conn:
        return await _migrate_then_index(conn, schema, steps, goal, dashboard_indexes)


FIRST_PARTITIONED_JOURNAL = 20
"""The schema version from which the journal is partitioned (migrations 18-20)."""

FIRST_OPT_IN_DASHBOARD = 12
"""The schema version from which the dashboard's list indexes are opt-in."""


async def _migrate_then_index(
    conn: AsyncConnection, schema: str, steps: tuple[_schema.Migration, ...], goal: int, indexes: bool
) -> list[int]:
    applied = await _migrate(conn, schema, steps, goal)
    if goal >= FIRST_PARTITIONED_JOURNAL:
        async with conn.transaction():  # (partitions ahead of the clock, on every call)
            await run(conn, _partitions.ensure(schema))
    if indexes:
        await run(conn, _schema.dashboard_indexes(schema))
        log.info("built the dashboard's list indexes in schema %s", schema)
    return applied


async def _migrate(
    conn: AsyncConnection, schema: str, steps: tuple[_schema.Migration, ...], goal: int
) -> list[int]:
    applied_now: list[int] = []
    lock_key = f"runrow.migrate:{schema}"
    latest = steps[-1].version  # (numbers may skip one a parallel change holds)
    for step in (s for s in steps if s.version <= goal):
        version, name = step.version, step.name
        async with conn.transaction():
            done = await run(conn, _schema.lock_for_migration(schema, lock_key=lock_key))
            newest = max(done, default=0)
            if newest > latest:
                raise SchemaOutOfDate(schema, newest, latest)
            if version in done:
                continue
            await run(conn, _schema.apply_migration(schema, step=step))
            applied_now.append(version)
            log.info(
                "applied migration %04d_%s to schema %s",
                version,
                name,
                schema,
                extra={"schema": schema, "version": version},
            )
    return applied_now
