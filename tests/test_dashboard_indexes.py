"""The dashboard's list indexes are opt-in (#39, schema 12): a fresh schema has none of
them, so a run's status changes do not pay for them; ``migrate(dashboard_indexes=True)``
and ``runrow migrate --dashboard-indexes`` build them concurrently, valid, once; a build
an interruption left invalid is reported, not silently kept."""

from __future__ import annotations

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

pytestmark = pytest.mark.anyio

NAMES = {
    "agent_run_created_idx",
    "agent_run_status_created_idx",
    "agent_run_tenant_created_idx",
    "agent_run_user_created_idx",
    "agent_run_worker_created_idx",
}


async def _indexes(conn: psycopg.AsyncConnection, schema: str) -> dict[str, bool]:
    """The five's names present on agent_run, and whether each is valid."""
    cur = await conn.execute(
        "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = to_regclass(format('%%I.agent_run', %s::text))",
        (schema,),
    )
    return {name: valid for name, valid in await cur.fetchall() if name in NAMES}


async def test_a_fresh_schema_has_none_and_migrate_builds_them_once(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    assert await _indexes(conn, schema) == {}
    await runrow.enqueue(conn, schema=schema, conversation_id="c", user_id="u", content="hi")
    assert await runrow.migrate(dsn, schema=schema, dashboard_indexes=True) == []  # (no migration left)
    assert await _indexes(conn, schema) == dict.fromkeys(NAMES, True)
    await runrow.migrate(conn, schema=schema, dashboard_indexes=True)  # again: nothing to do
    assert await _indexes(conn, schema) == dict.fromkeys(NAMES, True)
    with pytest.raises(runrow.InvalidInput) as bad:
        await runrow.migrate(dsn, schema=schema, target=11, dashboard_indexes=True)
    assert bad.value.field == "dashboard_indexes"


async def test_an_index_a_build_left_invalid_is_reported(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await runrow.migrate(dsn, schema=schema, dashboard_indexes=True)
    # What a cancelled CREATE INDEX CONCURRENTLY leaves behind.
    await conn.execute(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(format('%%I.%%I', %s::text, %s::text))",
        (schema, "agent_run_user_created_idx"),
    )
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="agent_run_user_created_idx"):
        await runrow.migrate(dsn, schema=schema, dashboard_indexes=True)
    await conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, "agent_run_user_created_idx")))
    await runrow.migrate(dsn, schema=schema, dashboard_indexes=True)
    assert await _indexes(conn, schema) == dict.fromkeys(NAMES, True)


async def test_runrow_migrate_dashboard_indexes_builds_them(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    from .test_cli import cli

    out = await anyio.to_thread.run_sync(
        lambda: cli("migrate", "--dashboard-indexes", "--database-url", dsn, "--schema", schema)
    )
    assert out.returncode == 0, out.stderr
    assert await _indexes(conn, schema) == dict.fromkeys(NAMES, True)
