"""Retention: the journal is a delivery buffer, not history; the transcript stays."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ._db import Database, schema_guard, statement_conn
from ._errors import InvalidInput
from ._gateway import retention as _gw
from ._gateway._exec import run
from ._names import DEFAULT_SCHEMA, check_schema

__all__ = ["TrimResult", "trim"]


@dataclass(frozen=True, slots=True)
class TrimResult:
    """How many finished runs were trimmed and how many journal rows went with them."""

    runs: int
    events: int


async def trim(
    db: Database,
    *,
    retention: timedelta = timedelta(hours=24),
    schema: str = DEFAULT_SCHEMA,
    batch: int = 1000,
    now: datetime | None = None,
) -> TrimResult:
    """Deletes the journal of runs finished more than ``retention`` ago and nulls their
    request snapshot (it may hold personal data). Messages are kept. Works in batches
    of ``batch`` runs (each its own transaction) until nothing is left to trim."""
    check_schema(schema)
    if retention < timedelta(0):
        raise InvalidInput("retention", "must not be negative")
    if batch < 1:
        raise InvalidInput("batch", "must be at least 1")
    runs = events = 0
    while True:
        async with schema_guard(db, schema), statement_conn(db) as conn:
            done = await run(
                conn, _gw.trim(schema, retention_seconds=retention.total_seconds(), limit=batch, now=now)
            )
        runs += done.runs
        events += done.events
        if done.runs < batch:
            return TrimResult(runs, events)
