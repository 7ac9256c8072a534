"""Steering (#41 point 6): a running turn's fenced delivery of the steering messages sent
to its conversation, and a replay's read of one (``sql/steering.sql``).

Every function here is a plan (see :mod:`._exec`), run on an async or a sync connection.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .. import _sql
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid

    from .._names import Channels


def deliver(
    schema: str,
    *,
    run_id: uuid.UUID,
    claim_token: uuid.UUID,
    key: str,
    occurrence: int,
    position: int,
    limit: int,
    channels: Channels,
) -> Plan[list[dict[str, Any]] | None]:
    """Absorbs the steerable turns that follow the run and records the delivery as its
    step; the messages delivered (``message_id``, ``run_id``, ``content``, ``user_id``),
    in order, or None if the fence matched nothing (the claim is gone)."""
    rows = yield Query(
        _sql.statement("steer_deliver", schema),
        {
            "run_id": run_id,
            "claim_token": claim_token,
            "key": key,
            "occurrence": occurrence,
            "position": position,
            "limit": limit,
            "schema": schema,
            "events_prefix": channels.events_prefix,
        },
    )
    if not rows:
        return None
    found: list[dict[str, Any]] = rows[0][0]
    return found


def read(schema: str, *, ids: Any) -> Plan[list[dict[str, Any]]]:
    """The messages a recorded delivery (its step's result) delivered, in order."""
    rows = yield Query(_sql.statement("steer_read", schema), {"ids": json.dumps(ids)})
    found: list[dict[str, Any]] = rows[0][0]
    return found
