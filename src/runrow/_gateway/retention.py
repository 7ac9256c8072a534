"""Retention: trimming the journal (and request snapshot) of runs finished long ago."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .. import _sql
from ._exec import Plan, Query

if TYPE_CHECKING:
    from datetime import datetime


class Trimmed(NamedTuple):
    """One batch of trim: the runs trimmed, the journal rows deleted with them, and the
    last of the runs' ``finished_at`` (where the pass's next batch starts; None if none)."""

    runs: int
    events: int
    last_finished: datetime | None = None


def trim(
    schema: str,
    *,
    retention_seconds: float,
    limit: int,
    now: datetime | None,
    after: datetime | None = None,
    legacy_only: bool = False,
) -> Plan[Trimmed]:
    """Trims up to ``limit`` runs finished more than ``retention_seconds`` before ``now``,
    and not before ``after`` (a pass's previous batch's ``last_finished``); with
    ``legacy_only``, only runs made before schema version 20."""
    (row,) = yield Query(  # two counts and a time, always one row
        _sql.statement("trim", schema),
        {
            "retention_seconds": retention_seconds,
            "limit": limit,
            "now": now,
            "after": after,
            "legacy_only": legacy_only,
        },
    )
    return Trimmed(row[0], row[1], row[2])


def legacy_left(schema: str) -> Plan[bool]:
    """Whether the legacy partition still holds events (runs left for the per-run pass)."""
    (row,) = yield Query(_sql.statement("trim_legacy_left", schema))
    return bool(row[0])
