"""Human in the loop: record a person's input for a waiting run (``provide_input``), and
list what waiting runs wait for (``waiting_inputs``), in ``sql/steps.sql``.

Every function here is a plan (see :mod:`._exec`), run on an async or a sync connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from .. import _sql
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

    from .._names import Channels


class Provided(NamedTuple):
    """What ``provide_input`` found: the run's status (None: no such run), whether this
    call recorded the value, and whether that very value was already recorded."""

    status: str | None
    recorded: bool
    same: bool


class PendingInput(NamedTuple):
    """An input a waiting run waits for (see :func:`runrow.waiting_inputs`)."""

    run_id: uuid.UUID
    conversation_id: str
    user_id: str
    tenant_id: str | None
    key: str
    request: Any
    """What the agent asked with (its ``wait_for_input`` request)."""
    since: datetime
    """When the run started waiting."""
    expires_at: datetime | None
    """When the wait ends if no input comes (its timeout, or the run's deadline)."""


def provide_input(
    schema: str, *, run_id: uuid.UUID, key: str, value: str, channels: Channels
) -> Plan[Provided]:
    """Records ``value`` (JSON text) for the run's waiting input ``key`` and queues the run."""
    rows = yield Query(
        _sql.statement("provide_input", schema),
        {
            "run_id": run_id,
            "key": key,
            "value": value,
            "wake_channel": channels.wake,
            "events_prefix": channels.events_prefix,
        },
    )
    if not rows:
        return Provided(None, False, False)
    status, recorded, same = rows[0][:3]
    return Provided(status, bool(recorded), bool(same))


def waiting_inputs(
    schema: str, *, run_id: uuid.UUID | None, conversation_id: str | None, limit: int
) -> Plan[list[PendingInput]]:
    """The inputs waiting runs wait for, newest first."""
    rows = yield Query(
        _sql.statement("waiting_inputs", schema),
        {"run_id": run_id, "conversation_id": conversation_id, "limit": limit},
    )
    return [PendingInput(*r) for r in rows]
