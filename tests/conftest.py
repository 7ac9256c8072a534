"""Test harness: a real, throwaway PostgreSQL server that the tests start themselves.

* The server is runrow's own launcher (``runrow.embedded``): under root it runs the
  server as an unprivileged account; as a normal user it runs as that user.
* ``RUNROW_TEST_SERVER=stock`` runs them on the distribution's server package instead
  (Debian's ``postgresql``, found under ``/usr/lib/postgresql``) with its default settings:
  JIT on, durability on. CI runs the suite both ways.
* ``RUNROW_TEST_DATABASE_URL`` reuses a server you already run instead (the tests then
  create and drop a database ``runrow_test_<random>`` on it).
* Each test gets its own freshly migrated runrow schema with a random name, which also
  keeps NOTIFY channels of concurrent tests apart (channel names derive from the schema).
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING

import psycopg
import pytest
from psycopg import sql
from pytest_postgresql.janitor import DatabaseJanitor

import runrow
from runrow.embedded import EmbeddedPostgres

from .stock import require_stock_bin_dir

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator


# The tiers (tests/README.md): what is marked one of these runs in the full suite only;
# every other test is the default tier, `-m quick`, a contributor's loop after a change.
_NOT_QUICK = ("slow", "browser", "node")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects on the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(name) for name in _NOT_QUICK):
            item.add_marker(pytest.mark.quick)
        # A test that never asks for the session's server (pure Python, or a server of
        # its own) runs the same whatever RUNROW_TEST_SERVER says: CI's stock-server pass
        # leaves it out.
        if "pg_server" not in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.serverless)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: two workers per core on a machine of up to four cores. The tests wait
    on their servers and subprocesses more than they compute: with one worker per core,
    2 cores sat 22% idle, and 4 workers ran the default tier in 161 s against 220 s (all
    1,379 tests in 321 s). From eight cores on, one per core. xdist's own
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still wins (None defers to xdist)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(cores, min(2 * cores, 8))


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    # psycopg's async support is asyncio-only; test modules carry `pytestmark = pytest.mark.anyio`.
    return "asyncio"


class Server:
    """Where the test database lives: conninfo for any database on it."""

    def __init__(self, launcher: EmbeddedPostgres | None, url: str | None) -> None:
        self.launcher = launcher
        self.url = url

    def conninfo(self, dbname: str) -> str:
        if self.launcher is not None:
            return self.launcher.conninfo(dbname)
        assert self.url is not None
        return psycopg.conninfo.make_conninfo(self.url, dbname=dbname)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    url = os.environ.get("RUNROW_TEST_DATABASE_URL")
    if url:
        yield Server(None, url)
        return
    if os.environ.get("RUNROW_TEST_SERVER", "") == "stock":
        launcher = EmbeddedPostgres(
            tcp=True, settings={"max_connections": "300"}, bin_dir=require_stock_bin_dir()
        )
    else:
        launcher = EmbeddedPostgres(fast=True, tcp=True, settings={"max_connections": "300"})
    launcher.start()
    try:
        yield Server(launcher, None)
    finally:
        launcher.stop()


@pytest.fixture
def restartable_server() -> Iterator[EmbeddedPostgres]:
    """A server of the test's own, which it may stop, restart or kill (never the session's)."""
    pg = EmbeddedPostgres(fast=True)
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture(scope="session")
def dsn(pg_server: Server) -> Iterator[str]:
    """Conninfo of the session's test database."""
    dbname = f"runrow_test_{uuid.uuid4().hex[:8]}"
    params = psycopg.conninfo.conninfo_to_dict(pg_server.conninfo(dbname))
    janitor = DatabaseJanitor(
        user=str(params.get("user", "postgres")),
        host=str(params.get("host", "localhost")),
        port=str(params.get("port", 5432)),
        password=params.get("password"),  # type: ignore[arg-type]
        dbname=dbname,
    )
    janitor.init()
    try:
        yield pg_server.conninfo(dbname)
    finally:
        janitor.drop()


@pytest.fixture
def schema_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def schema(dsn: str, schema_name: str) -> AsyncIterator[str]:
    """A freshly migrated runrow schema, dropped after the test."""
    await runrow.migrate(dsn, schema=schema_name)
    try:
        yield schema_name
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name))
            )


@pytest.fixture
async def conn(dsn: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """An autocommit connection for the test's own reads and writes."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        yield c
