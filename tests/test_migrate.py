"""Migrations: forward-only, concurrent-safe, and a clear error when the schema is behind."""

from __future__ import annotations

import subprocess
import sys
import uuid

import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._gateway import schema as gateway_schema

from .helpers import table

pytestmark = pytest.mark.anyio


async def test_fresh_schema_reaches_latest_and_rerun_is_a_noop(
    dsn: str, schema_name: str, conn: psycopg.AsyncConnection
) -> None:
    try:
        assert await runrow.migrate(dsn, schema=schema_name) == list(range(1, runrow.latest_version() + 1))
        assert await runrow.migrate(dsn, schema=schema_name) == []
        cur = await conn.execute(
            sql.SQL("SELECT version FROM {}").format(table(schema_name, "schema_version"))
        )
        assert [r[0] for r in await cur.fetchall()] == list(range(1, runrow.latest_version() + 1))
    finally:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name)))


async def test_awkward_schema_names_are_quoted(dsn: str, conn: psycopg.AsyncConnection) -> None:
    name = f'Weird "Name"; DROP {uuid.uuid4().hex[:4]}'
    try:
        await runrow.migrate(dsn, schema=name)
        run = await runrow.enqueue(dsn, schema=name, conversation_id="c", user_id="u", content="x")
        assert run.status == "queued"
    finally:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_concurrent_migrate_from_four_processes(dsn: str, schema_name: str) -> None:
    code = "import asyncio, sys, runrow;print(asyncio.run(runrow.migrate(sys.argv[1], schema=sys.argv[2])))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, dsn, schema_name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    try:
        assert [p.returncode for p in procs] == [0, 0, 0, 0], [e for _, e in outs]
        applied = [eval(o.strip()) for o, _ in outs]
        # Every version applied exactly once, by whichever process got there first.
        flat = sorted(v for lst in applied for v in lst)
        assert flat == list(range(1, runrow.latest_version() + 1))
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name)))


async def test_out_of_date_schema_is_reported_with_the_fix(
    dsn: str, schema_name: str, conn: psycopg.AsyncConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pretend this runrow knows one more migration than the database has.
    real = gateway_schema.migrations()
    extra = (*real, gateway_schema.Migration(len(real) + 1, "future", "SELECT 1"))
    try:
        await runrow.migrate(dsn, schema=schema_name)
        monkeypatch.setattr(gateway_schema, "migrations", lambda: extra)
        from runrow._gateway.schema import require as require_schema

        with pytest.raises(runrow.SchemaOutOfDate, match="runrow migrate") as info:
            await require_schema(conn, schema_name)
        assert (info.value.found, info.value.expected) == (len(real), len(real) + 1)
        # And the other way round: a database newer than the code says to upgrade runrow.
        await runrow.migrate(dsn, schema=schema_name)
        monkeypatch.setattr(gateway_schema, "migrations", lambda: real)
        with pytest.raises(runrow.SchemaOutOfDate, match="upgrade the runrow package"):
            await require_schema(conn, schema_name)
        with pytest.raises(runrow.SchemaOutOfDate):
            await runrow.migrate(dsn, schema=schema_name)
    finally:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name)))


async def test_migrate_to_a_target(dsn: str, schema_name: str, conn: psycopg.AsyncConnection) -> None:
    try:
        assert await runrow.migrate(dsn, schema=schema_name, target=0) == []
        with pytest.raises(runrow.InvalidInput):
            await runrow.migrate(dsn, schema=schema_name, target=runrow.latest_version() + 1)
    finally:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name)))
