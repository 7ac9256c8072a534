"""Tenants and the fair queue: weights, concurrency caps, and where a queued run stands.

The claim order (``sql/claims.sql``, statement ``claim``), exactly:

1. Eligible runs: ``queued``; due (``not_before`` is NULL or not after the database's
   ``now()``); the oldest queued turn of their conversation, with no turn of it
   running; and their tenant below its ``max_running`` cap.
2. Within a tenant, eligible runs are ranked k = 1, 2, ... by ``priority`` (higher
   first), then enqueue order.
3. Across tenants, runs are taken by the tenant's share after taking the run,
   ``(running + k - 1) / weight``, lowest first; ties by ``priority`` (higher first),
   then enqueue order (older first). ``running`` is the tenant's running runs in the
   claim's snapshot.

So a tenant with nothing running always goes before one with runs in flight, and a
batch claim interleaves tenants by weight. Runs without a tenant share the default
tenant (``tenant_id=None``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _json
from ._db import Database, atomic, perform, schema_guard, statement_conn
from ._enqueue import THROUGHPUT_WINDOW_SECONDS
from ._errors import InvalidInput, RunNotFound
from ._gateway import reads
from ._gateway import tenants as _gw
from ._gateway._exec import run
from ._json import parse_run_id
from ._models import QueuePosition, TenantPolicy
from ._names import DEFAULT_SCHEMA, check_schema
from ._ops import self_contained

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

    from ._gateway._exec import Plan
    from ._ops import Operation

__all__ = ["queue_position", "queue_position_op", "set_tenant_policy", "tenant_policies"]

# queue_position's walks stop after this many index entries (then it estimates), and each
# other tenant's queue is walked at least _MIN_WALK entries deep.
_POSITION_COUNT_LIMIT = 1000
_MIN_WALK = 16


async def set_tenant_policy(
    db: Database,
    tenant_id: str | None,
    *,
    weight: int = 1,
    max_running: int | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> TenantPolicy:
    """Sets a tenant's weight (an integer, 1 by default) and optional cap on running runs.

    ``tenant_id=None`` is the default tenant. The next claim uses the new values. The
    cap is enforced by each claim against its own snapshot: concurrent claims by
    several dispatchers can overshoot it by what they take at the same moment, never
    for longer than those runs last.
    """
    check_schema(schema)
    _json.check_id(tenant_id, "tenant_id", optional=True)
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 1_000_000:
        raise InvalidInput("weight", "must be an integer between 1 and 1000000")
    if max_running is not None and (
        isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1
    ):
        raise InvalidInput("max_running", "must be a positive integer or None")
    async with schema_guard(db, schema), atomic(db) as conn:
        return await run(
            conn, _gw.set_tenant_policy(schema, tenant_id=tenant_id, weight=weight, max_running=max_running)
        )


async def tenant_policies(db: Database, *, schema: str = DEFAULT_SCHEMA) -> list[TenantPolicy]:
    """Every tenant policy set; tenants without one have weight 1 and no cap."""
    check_schema(schema)
    async with schema_guard(db, schema), statement_conn(db) as conn:
        return await run(conn, _gw.list_tenant_policies(schema))


async def queue_position(
    db: Database,
    run_id: uuid.UUID | str,
    *,
    now: datetime | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> QueuePosition:
    """Where a run stands in the fair queue, and about how long until it starts.

    ``position`` is 1-based: 1 plus the queued runs the fair claim order takes first,
    computed from one snapshot (see the ``queue_position`` statement in
    ``sql/tenants.sql``). It is an approximation in two ways, both stated: it does not
    model conversation order (a queued turn also waits for its conversation's running
    turn) nor the delays and caps of the runs ahead of it. ``estimated_wait_seconds``
    is position / throughput, where throughput is the runs finished in the last five
    minutes; it is None when none did, and never less than the time until the run's
    ``not_before``. Raises :class:`RunNotFound` for an unknown id.

    Its cost does not grow with the depth of the queue: the runs ahead are counted one
    by one only up to 1,000 index entries (the first thousand places, with few tenants,
    are exact). Past that, the count is extrapolated from the
    spacing of the runs it did count and ``exact`` is False: a user interface should
    then say "about". With one tenant and one priority the estimate is within a few
    percent; with many priorities it is a lower bound.
    """
    return await perform(db, schema, queue_position_op(run_id, now=now, schema=schema))


def queue_position_op(
    run_id: uuid.UUID | str, *, now: datetime | None, schema: str
) -> Operation[QueuePosition]:
    """:func:`queue_position` as an operation (see ``_ops.py``)."""
    check_schema(schema)
    rid = parse_run_id(run_id)
    found: tuple[_gw.QueueSpot, reads.Throughput] = yield self_contained(_position(schema, rid, now))
    spot, recent = found
    per_second = recent.finished / THROUGHPUT_WINDOW_SECONDS
    wait: float | None = None
    if spot.position is not None and per_second > 0:
        wait = spot.position / per_second
    if spot.position is not None and spot.due_in is not None and spot.due_in > 0:
        wait = max(wait or 0.0, float(spot.due_in))
    return QueuePosition(
        run_id=rid,
        status=spot.status,
        position=spot.position,
        rank_in_tenant=spot.rank_in_tenant,
        estimated_wait_seconds=wait,
        throughput_per_minute=per_second * 60,
        exact=spot.exact,
    )


def _position(
    schema: str, rid: uuid.UUID, now: datetime | None
) -> Plan[tuple[_gw.QueueSpot, reads.Throughput]]:
    """The run's spot in the fair order, and the recent throughput; :class:`RunNotFound`."""
    spot = yield from _gw.queue_position(
        schema, run_id=rid, now=now, cap=_POSITION_COUNT_LIMIT, min_walk=_MIN_WALK
    )
    if spot is None:
        raise RunNotFound(rid)
    recent = yield from reads.throughput(
        schema, tenant_id=None, window_seconds=THROUGHPUT_WINDOW_SECONDS, now=now
    )
    return spot, recent
