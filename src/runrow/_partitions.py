"""The journal's partitions: made ahead by every worker and by ``migrate``, listed for
operators, and dropped whole by :func:`runrow.trim` (see migrations 18-20).

A run's events live in the partition of the interval its run was made in (run ids are
time-ordered), so retention drops a partition once every run made in it (and every
later retry of their lineages, every run of their trees) finished before the cutoff:
it retires the partition's range of creation times, which trims all of its runs at
once (migration 28), then drops it. No per-run write, no ``DELETE`` on the journal, no
dead tuples on the live partitions, next to no WAL: O(partitions) writes a pass.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from ._db import Database, schema_guard, statement_conn
from ._gateway import partitions as _gw
from ._gateway._exec import run
from ._names import DEFAULT_SCHEMA, check_schema

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["JournalPartition", "ensure_journal_partitions", "journal_partitions"]

log = logging.getLogger("runrow.retention")


@dataclass(frozen=True, slots=True)
class JournalPartition:
    """One partition of the journal: the runs made in ``[starts, ends)`` keep their
    events in it. ``starts`` and ``ends`` are None for the legacy partition (the events
    of runs made before schema version 20). ``rows_estimate`` is PostgreSQL's estimate,
    as of the partition's last ANALYZE."""

    name: str
    starts: datetime | None
    ends: datetime | None
    rows_estimate: int


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


async def journal_partitions(db: Database, *, schema: str = DEFAULT_SCHEMA) -> list[JournalPartition]:
    """The journal's partitions, oldest first (the legacy one, if any, before all)."""
    check_schema(schema)
    async with schema_guard(db, schema), statement_conn(db) as conn:
        rows = await run(conn, _gw.partitions(schema))
    return [JournalPartition(r.name, _time(r.lo), _time(r.hi), r.rows_estimate) for r in rows]


async def ensure_journal_partitions(
    db: Database, *, schema: str = DEFAULT_SCHEMA, at: datetime | None = None
) -> int:
    """Makes the journal's partitions up to ``journal_settings.premake`` intervals past
    ``at`` (default: the database's now) and returns how many it made. Every worker
    does this in the background and ``migrate`` does it too; call it where neither runs
    (say, before a bulk load of runs)."""
    check_schema(schema)
    async with schema_guard(db, schema), statement_conn(db) as conn:
        return await run(conn, _gw.ensure(schema, at=at))


@asynccontextmanager
async def _ddl_conn(db: Database) -> AsyncIterator[tuple[AsyncConnection, bool]]:
    """A connection for detaching, and whether it may detach concurrently (only outside
    a transaction block; a caller's connection inside its own transaction may not)."""
    if isinstance(db, str):
        async with await AsyncConnection.connect(db, autocommit=True) as conn:
            yield conn, True
    elif isinstance(db, AsyncConnectionPool):
        async with db.connection() as conn, _autocommit(conn):
            yield conn, True
    elif db.info.transaction_status == TransactionStatus.IDLE:
        async with _autocommit(db):
            yield db, True
    else:
        yield db, False


@asynccontextmanager
async def _autocommit(conn: AsyncConnection) -> AsyncIterator[None]:
    """``conn`` in autocommit for the block, then as it was."""
    was = conn.autocommit
    await conn.set_autocommit(True)
    try:
        yield
    finally:
        await conn.set_autocommit(was)


async def drop_expired_partitions(
    db: Database, *, schema: str, retention_seconds: float, now: datetime | None
) -> tuple[int, int]:
    """Retires every journal partition nobody needs (writes its range, deletes its step
    records and tree streams: migration 28), then detaches and drops it, and any a
    detach left half done. A partition still needed holds only itself. Returns how many
    it dropped and how many runs it trimmed that were not marked trimmed before."""
    dropped = trimmed = 0
    async with schema_guard(db, schema), _ddl_conn(db) as (conn, concurrently):
        for name in await run(conn, _gw.detach_pending(schema)):
            await run(conn, _gw.finish_detach(schema, name))  # (left half done before)
            await run(conn, _gw.drop(schema, name))
            dropped += 1
        retired = await run(conn, _gw.retired(schema))
        for part in await run(conn, _gw.partitions(schema)):
            lo, hi = part.lo, part.hi
            if lo is None or hi is None or lo < 1 or part.detach_pending:
                continue  # (the legacy partition: its runs are trimmed one by one)
            if not any(a <= lo and hi <= b for a, b in retired):  # (else an earlier trim's)
                async with conn.transaction():
                    await run(conn, _gw.lock_retiring(schema))
                    done = await run(
                        conn, _gw.retire(schema, lo=lo, hi=hi, retention_seconds=retention_seconds, now=now)
                    )
                if done is None:
                    continue  # (still needed)
                trimmed += done[1]
            await run(conn, _gw.detach(schema, part.name, concurrently=concurrently))
            await run(conn, _gw.drop(schema, part.name))
            log.info(
                "dropped journal partition %s.%s (about %d events)", schema, part.name, part.rows_estimate
            )
            dropped += 1
    return dropped, trimmed
