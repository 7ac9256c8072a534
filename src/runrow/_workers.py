"""The worker registry, read: the live dispatchers, and draining a version (deploys)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from . import _json
from ._db import Database, schema_guard, statement_conn
from ._errors import InvalidInput
from ._gateway import workers as _gw
from ._gateway._exec import run
from ._names import DEFAULT_SCHEMA, check_schema

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._gateway.workers import StrandedRun, UnservedKey, WorkerRow

__all__ = ["list_workers", "running_of_version", "stranded_runs", "unserved_runs", "wait_version_drained"]


async def list_workers(db: Database, *, schema: str = DEFAULT_SCHEMA) -> list[WorkerRow]:
    """The registered dispatchers (a dead one stays until a reaper removes it: lease + grace)."""
    check_schema(schema)
    async with schema_guard(db, schema), statement_conn(db) as conn:
        return await run(conn, _gw.list_workers(schema))


async def stranded_runs(
    db: Database, *, older_than: float = 60.0, schema: str = DEFAULT_SCHEMA
) -> list[StrandedRun]:
    """Runs a deploy stranded: queued for more than ``older_than`` seconds with recorded
    steps, for a version no live worker has (``resume_policy="same_version"`` workers of
    other versions never claim them). Oldest first."""
    check_schema(schema)
    if isinstance(older_than, bool) or not isinstance(older_than, int | float) or not older_than >= 0:
        raise InvalidInput("older_than", "must be a number of seconds, 0 or more")
    async with schema_guard(db, schema), statement_conn(db) as conn:
        return await run(conn, _gw.stranded(schema, older_than=float(older_than)))


async def unserved_runs(db: Database, *, schema: str = DEFAULT_SCHEMA) -> list[UnservedKey]:
    """Queued runs that no live worker serves, by agent key ('' for the default agent):
    no registered dispatcher whose lease holds has the key (``Dispatcher(agents=...)``),
    so nothing will claim them until one starts. Empty when every queued run is served."""
    check_schema(schema)
    async with schema_guard(db, schema), statement_conn(db) as conn:
        return await run(conn, _gw.unserved(schema))


async def running_of_version(db: Database, version: str, *, schema: str = DEFAULT_SCHEMA) -> int:
    """How many runs that a worker of ``version`` claimed are running now."""
    check_schema(schema)
    _json.check_id(version, "version")
    async with schema_guard(db, schema), statement_conn(db) as conn:
        return await run(conn, _gw.running_of_version(schema, version))


async def wait_version_drained(
    db: Database,
    version: str,
    *,
    timeout: float | None = None,
    interval: float = 1.0,
    schema: str = DEFAULT_SCHEMA,
    progress: Callable[[int], object] | None = None,
) -> bool:
    """Waits until no run claimed by a worker of ``version`` is running; False if
    ``timeout`` seconds passed first. Polls every ``interval`` s (the row is the truth:
    a run of that version still running is an old worker at work, or one the reaper has
    yet to end); ``progress(n)`` hears each count that is not zero."""
    if timeout is not None and not timeout >= 0:
        raise InvalidInput("timeout", "must be 0 or more seconds")
    if not interval > 0:
        raise InvalidInput("interval", "must be above 0 seconds")
    with anyio.move_on_after(timeout if timeout is not None else float("inf")):
        while True:
            left = await running_of_version(db, version, schema=schema)
            if not left:
                return True
            if progress is not None:
                progress(left)
            await anyio.sleep(interval)
    return False
