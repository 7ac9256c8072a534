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
    """What a trim did: ``runs`` finished runs trimmed (request snapshot nulled, step
    records and tree stream gone, marked trimmed); ``events`` journal rows deleted one by
    one (only the legacy partition's: events of runs made before schema version 20);
    ``partitions`` whole journal partitions dropped, every run made in them trimmed."""

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
) -> TrimResult:
    """Trims runs finished more than ``retention`` ago: nulls their request snapshot (it
    may hold personal data) and marks them trimmed, in batches of ``batch`` runs (each its
    own transaction) until nothing is left; then drops every journal partition whose runs
    are all trimmed, with their events (detached concurrently unless ``db`` is a
    connection inside a transaction). Messages are kept. A run's events therefore stay
    until its partition goes: at most ``retention`` plus one partition interval after
    the last run made in that interval ends."""
    check_schema(schema)
    if retention < timedelta(0):
        raise InvalidInput("retention", "must not be negative")
    if batch < 1:
        raise InvalidInput("batch", "must be at least 1")
    runs, events = await trim_runs(
        db, schema=schema, retention_seconds=retention.total_seconds(), batch=batch, now=now
    )
    partitions = await drop_expired_partitions(
        db, schema=schema, retention_seconds=retention.total_seconds(), now=now
    )
    return TrimResult(runs, events, partitions)


async def trim_runs(
    db: Database, *, schema: str, retention_seconds: float, batch: int, now: datetime | None
) -> tuple[int, int]:
    """Trim's per-run pass (runs trimmed, legacy events deleted), in batches of ``batch``,
    each its own transaction, each going on from where the previous one ended (the
    benchmark times it alone: bench/retention.py)."""
    runs = events = 0
    after = None
    while True:
        async with schema_guard(db, schema), statement_conn(db) as conn:
            done = await run(
                conn,
                _gw.trim(schema, retention_seconds=retention_seconds, limit=batch, now=now, after=after),
            )
        runs += done.runs
        events += done.events
        after = done.last_finished
        if done.runs < batch:
            return runs, events
