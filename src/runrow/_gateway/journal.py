"""The journal writer's statements (``append_events``, ``flush_landed`` in ``sql/journal.sql``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import _sql
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from collections.abc import Iterable, Sequence

    from .._names import Channels

# One event as the writer numbers it: (seq, type, payload as JSON text).
EventRow = tuple[int, str, str]


class Appended(NamedTuple):
    """One run's events for one batched append, behind its claim token."""

    run_id: uuid.UUID
    claim_token: uuid.UUID
    events: Sequence[EventRow]


@dataclass(frozen=True, slots=True)
class FlushState:
    """What a read-back found after a flush of unknown outcome."""

    landed: int
    """How many of the flush's seqs are in the journal."""
    owned: bool
    """Whether the claim is still this worker's."""


def batch_json(rows: Iterable[dict[str, Any]]) -> str:
    """A batch as one JSON array of objects, the shape ``jsonb_to_recordset()`` reads. (The
    values are ids, numbers and text already checked for jsonb; payloads travel as text.)"""
    return json.dumps(list(rows), ensure_ascii=False, separators=(",", ":"))


def append_params(batch: Sequence[Appended], channels: Channels, *, notify: bool = True) -> dict[str, Any]:
    """The ``append_events`` statement's parameters for ``batch`` (the benchmarks' bare
    loops send them too)."""
    events = batch_json(
        {"run_id": str(a.run_id), "token": str(a.claim_token), "seq": seq, "type": etype, "payload": payload}
        for a in batch
        for seq, etype, payload in a.events
    )
    return {"events": events, "events_prefix": channels.events_prefix, "notify": notify}


def append(
    schema: str, batch: Sequence[Appended], *, channels: Channels, notify: bool = True
) -> Plan[set[uuid.UUID]]:
    """Appends every run's events in one statement, each fenced by its claim; returns
    the runs whose events landed (a run missing lost its claim). ``notify=False`` drops
    the per-run NOTIFY (tails then poll); it exists to measure what the NOTIFY costs."""
    usage = any(etype == "usage" for a in batch for _, etype, _ in a.events)
    text = _sql.statement("append_events", schema, _WITH_USAGE if usage else _NO_USAGE)
    rows = yield Query(text, append_params(batch, channels, notify=notify))
    return {row[0] for row in rows}


# A batch without a `usage` event sends append_events without its rollup step (a
# smaller plan: see runrow._sql's variants).
_WITH_USAGE: frozenset[str] = frozenset()
_NO_USAGE = frozenset({"usage_rolled"})


def flush_landed(schema: str, run_id: uuid.UUID, claim_token: uuid.UUID, seqs: list[int]) -> Plan[FlushState]:
    """Reads back how much of a flush landed and whether the claim still holds."""
    (row,) = yield Query(  # two aggregates: always one row
        _sql.statement("flush_landed", schema), {"run_id": run_id, "claim_token": claim_token, "seqs": seqs}
    )
    return FlushState(int(row[0]), bool(row[1]))
