"""Retention: the journal is a delivery buffer, not history; the transcript stays."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ._db import Database, schema_guard, statement_conn
from ._errors import InvalidInput
from ._gateway import retention as _gw
from ._gateway._exec import run
from ._names import DEFAULT_SCHEMA, check_schema
from ._partitions import drop_expired_partitions

__all__ = ["TrimResult", "trim"]


@dataclass(frozen=True, slots=True)
class TrimResult:
    """What a trim did: ``runs`` finished runs trimmed (journal, step records and tree
    stream gone; request snapshot nulled for those the per-run pass took); ``events``
    journal rows deleted one by one (only the legacy partition's: events of runs made
    before schema version 20); ``partitions`` whole journal partitions dropped, every
    run made in them trimmed."""

    runs: int
    events: int
    partitions: int = 0


async def trim(
    db: Database,
    *,
    retention: timedelta = timedelta(hours=24),
    schema: str = DEFAULT_SCHEMA,
    batch: int = 1000,
    now: datetime | None = None,
    erase_requests: bool = False,
) -> TrimResult:
    """Trims the journal of runs finished more than ``retention`` ago, a partition at a
    time: once every run made in a journal partition's interval (and every later retry of
    their lineages, every run of their trees) finished before the cutoff, the partition's
    runs are trimmed together (one write retires its range of creation times; they cannot
    be retried from then on), their step records and tree streams are deleted, and the
    partition is dropped with their events (detached concurrently unless ``db`` is a
    connection inside a transaction). O(partitions) writes, whatever the runs' number;
    no dead tuple on the live partitions. A run's events therefore stay until its
    partition goes: at most ``retention`` plus one partition interval after the last run
    made in that interval ends. Messages are kept.

    The request snapshot (the ``request`` the host enqueued, which may hold personal
    data) stays on the run's row unless ``erase_requests``: then a per-run pass first
    nulls the snapshot of every run finished before the cutoff and marks it trimmed, in
    batches of ``batch`` runs (each its own transaction): one row write per run. Runs
    made before schema version 20 (the legacy partition) always go through that pass."""
    check_schema(schema)
    if retention < timedelta(0):
        raise InvalidInput("retention", "must not be negative")
    if batch < 1:
        raise InvalidInput("batch", "must be at least 1")
    runs, events = await trim_runs(
        db,
        schema=schema,
        retention_seconds=retention.total_seconds(),
        batch=batch,
        now=now,
        erase_requests=erase_requests,
    )
    partitions, retired = await drop_expired_partitions(
        db, schema=schema, retention_seconds=retention.total_seconds(), now=now
    )
    return TrimResult(runs + retired, events, partitions)


async def trim_runs(
    db: Database,
    *,
    schema: str,
    retention_seconds: float,
    batch: int,
    now: datetime | None,
    erase_requests: bool,
) -> tuple[int, int]:
    """Trim's per-run pass (runs trimmed, legacy events deleted), in batches of ``batch``,
    each its own transaction, each going on from where the previous one ended; without
    ``erase_requests`` only over the legacy partition's runs, and only while it holds
    any (the benchmark times it alone: bench/retention.py)."""
    runs = events = 0
    after = None
    if not erase_requests:
        async with schema_guard(db, schema), statement_conn(db) as conn:
            if not await run(conn, _gw.legacy_left(schema)):
                return 0, 0
    while True:
        async with schema_guard(db, schema), statement_conn(db) as conn:
            done = await run(
                conn,
                _gw.trim(
                    schema,
                    retention_seconds=retention_seconds,
                    limit=batch,
                    now=now,
                    after=after,
                    legacy_only=not erase_requests,
                ),
            )
        runs += done.runs
        events += done.events
        after = done.last_finished
        if done.runs < batch:
            return runs, events
