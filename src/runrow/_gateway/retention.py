"""Retention: trimming the journal (and request snapshot) of runs finished long ago."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .. import _sql
from ._exec import execute

if TYPE_CHECKING:
    from datetime import datetime

    from psycopg import AsyncConnection


class Trimmed(NamedTuple):
    """One batch of trim: the runs trimmed and the journal rows deleted with them."""

    runs: int
    events: int


async def trim(
    conn: AsyncConnection, schema: str, *, retention_seconds: float, limit: int, now: datetime | None
) -> Trimmed:
    """Trims up to ``limit`` runs finished more than ``retention_seconds`` before ``now``."""
    cur = await execute(
        conn,
        _sql.statement("trim", schema),
        {"retention_seconds": retention_seconds, "limit": limit, "now": now},
    )
    row = await cur.fetchone()
    assert row is not None  # two counts, always one row
    return Trimmed(row[0], row[1])
