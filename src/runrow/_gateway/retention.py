"""Retention: trimming the journal (and request snapshot) of runs finished long ago."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .. import _sql
from ._exec import Plan, Query

if TYPE_CHECKING:
    from datetime import datetime


class Trimmed(NamedTuple):
    """One batch of trim: the runs trimmed and the journal rows deleted with them."""

    runs: int
    events: int


def trim(schema: str, *, retention_seconds: float, limit: int, now: datetime | None) -> Plan[Trimmed]:
    """Trims up to ``limit`` runs finished more than ``retention_seconds`` before ``now``."""
    (row,) = yield Query(  # two counts, always one row
        _sql.statement("trim", schema),
        {"retention_seconds": retention_seconds, "limit": limit, "now": now},
    )
    return Trimmed(row[0], row[1])
