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
    """One run's events for one batched append, behind its claim token. ``head`` is
    :func:`row_head` of the two, if the caller keeps it (a writer makes it once per run)."""

    run_id: uuid.UUID
    claim_token: uuid.UUID
    events: Sequence[EventRow]
    head: str | None = None


def row_head(run_id: uuid.UUID, claim_token: uuid.UUID) -> str:
    """The start of each of a run's rows in ``append_events``' JSON, up to its seq."""
    return f'{{"run_id":"{run_id}","token":"{claim_token}","seq":'


# A type's JSON string, by type: the few types a worker writes, encoded once each.
_TYPE_JSON: dict[str, str] = {}
_TYPE_JSON_MAX = 1024


@dataclass(frozen=True, slots=True)
class FlushState:
    """What a read-back found after a flush of unknown outcome."""

    landed: int
    """How many of the flush's seqs are in the journal."""
    owned: bool
    """Whether the claim is still this worker's."""


def _type_json(etype: str) -> str:
    found = _TYPE_JSON.get(etype)
    if found is None:
        found = json.dumps(etype, ensure_ascii=False)
        if len(_TYPE_JSON) < _TYPE_JSON_MAX:
            _TYPE_JSON[etype] = found
    return found


def batch_json(rows: Iterable[dict[str, Any]]) -> str:
    """A batch as one JSON array of objects, the shape ``jsonb_to_recordset()`` reads. (The
    values are ids, numbers and text already checked for jsonb; payloads travel as text.)"""
    return json.dumps(list(rows), ensure_ascii=False, separators=(",", ":"))


def events_json(batch: Sequence[Appended]) -> str:
    """``append_events``' rows as one JSON array of objects, written out directly: the
    payloads are JSON text already (checked for jsonb when made), so each goes in as it
    is, a nested value, rather than encoded again as a string for the server to decode
    twice; ids and seqs need no escaping, and a type is encoded once."""
    parts: list[str] = []
    for a in batch:
        head = a.head or row_head(a.run_id, a.claim_token)
        parts.extend(
            f'{head}{seq},"type":{_type_json(etype)},"payload":{payload}}}'
            for seq, etype, payload in a.events
        )
    return "[" + ",".join(parts) + "]"


def append_params(batch: Sequence[Appended], channels: Channels, *, notify: bool = True) -> dict[str, Any]:
    """The ``append_events`` statement's parameters for ``batch`` (the benchmarks' bare
    loops send them too)."""
    return {"events": events_json(batch), "events_prefix": channels.events_prefix, "notify": notify}


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
