"""An enqueue's options as one record: checked and serialised once, where the public
API (``runrow.enqueue``, ``runrow.sync.enqueue``) takes them, then passed down whole to
the operation, its plan and the gateway's statement."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from . import _json
from ._errors import InvalidInput
from ._names import check_schema

if TYPE_CHECKING:
    import uuid

__all__ = ["DEFAULT_MAX_CONTENT_BYTES", "EnqueueOptions", "OnBusy", "when"]

DEFAULT_MAX_CONTENT_BYTES = 256 * 1024
"""Default size limit of a message's content, as serialised JSON."""

OnBusy = Literal["enqueue", "reject", "interrupt", "steer"]
"""What :func:`runrow.enqueue` does when the conversation already has a queued or running turn."""

_MAX_OFFSET_SECONDS = 1000 * 365 * 86400


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """One enqueue, as checked: the turn (ids, and its content and request as JSON text)
    and how it is scheduled and admitted. Build it with :meth:`checked`."""

    schema: str
    conversation_id: str
    user_id: str
    tenant_id: str | None
    idempotency_key: str | None
    content: str
    """The message's content, as JSON text."""
    request: str | None
    """The request snapshot, as JSON text (None: none)."""
    priority: int
    not_before_at: datetime | None
    not_before_in: float | None
    """``not_before`` as the SQL takes it: an absolute time, or seconds from its clock."""
    deadline_at: datetime | None
    deadline_in: float | None
    on_busy: OnBusy
    max_queued_tenant: int | None
    max_queued_conversation: int | None
    agent_key: str | None = None
    """The agent that runs it (None: the default agent)."""
    parent_run_id: uuid.UUID | None = None
    """A spawned child's parent and tree root (``RunContext.spawn`` sets them; never a host)."""
    root_run_id: uuid.UUID | None = None
    limit_key: str | None = None
    """A host-given key the run is rate-limited under (see :func:`runrow.set_rate_limit`)."""

    @property
    def gated(self) -> bool:
        """Whether the enqueue takes the admission locks (a limit, ``reject`` or ``interrupt``;
        ``steer`` only marks the turn, as one statement)."""
        return (
            self.on_busy in ("reject", "interrupt")
            or self.max_queued_tenant is not None
            or self.max_queued_conversation is not None
        )

    @classmethod
    def checked(
        cls,
        *,
        conversation_id: str,
        user_id: str,
        content: Any,
        tenant_id: str | None,
        idempotency_key: str | None,
        request: Any,
        priority: int,
        not_before: datetime | timedelta | None,
        deadline: datetime | timedelta | None,
        on_busy: OnBusy,
        max_queued_per_tenant: int | None,
        max_queued_per_conversation: int | None,
        schema: str,
        max_content_bytes: int,
        agent_key: str | None = None,
        limit_key: str | None = None,
    ) -> EnqueueOptions:
        """The options of :func:`runrow.enqueue`, checked; raises :class:`InvalidInput`."""
        check_schema(schema)
        _json.check_id(conversation_id, "conversation_id")
        _json.check_id(user_id, "user_id")
        _json.check_id(tenant_id, "tenant_id", optional=True)
        _json.check_id(idempotency_key, "idempotency_key", optional=True)
        _json.check_id(agent_key, "agent_key", optional=True, max_len=200)
        _json.check_id(limit_key, "limit_key", optional=True, max_len=200)
        if isinstance(priority, bool) or not isinstance(priority, int) or not -(2**31) <= priority < 2**31:
            raise InvalidInput("priority", "must be an integer that fits in 32 bits")
        if on_busy not in ("enqueue", "reject", "interrupt", "steer"):
            raise InvalidInput("on_busy", "must be 'enqueue', 'reject', 'interrupt' or 'steer'")
        for name, limit in (
            ("max_queued_per_tenant", max_queued_per_tenant),
            ("max_queued_per_conversation", max_queued_per_conversation),
        ):
            if limit is not None and (
                isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit < 2**31
            ):  # (the gate counts in a 32-bit integer)
                raise InvalidInput(name, "must be a non-negative integer below 2**31, or None")
        not_before_at, not_before_in = when(not_before, "not_before")
        deadline_at, deadline_in = when(deadline, "deadline")
        return cls(
            schema=schema,
            conversation_id=conversation_id,
            user_id=user_id,
            tenant_id=tenant_id,
            idempotency_key=idempotency_key,
            content=_json.dumps(content, "content", max_content_bytes),
            request=None if request is None else _json.dumps(request, "request", max_content_bytes),
            priority=priority,
            not_before_at=not_before_at,
            not_before_in=not_before_in,
            deadline_at=deadline_at,
            deadline_in=deadline_in,
            on_busy=on_busy,
            max_queued_tenant=max_queued_per_tenant,
            max_queued_conversation=max_queued_per_conversation,
            agent_key=agent_key,
            limit_key=limit_key,
        )


def when(value: datetime | timedelta | None, field: str) -> tuple[datetime | None, float | None]:
    """An absolute time, or seconds from the database's clock, as the SQL takes them."""
    if value is None:
        return None, None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        if abs(seconds) > _MAX_OFFSET_SECONDS:  # now() + it must stay a timestamp
            raise InvalidInput(field, "a timedelta must be within 1,000 years")
        return None, seconds
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidInput(field, "a datetime must be timezone-aware (or pass a timedelta)")
        return value, None
    raise InvalidInput(field, "must be a datetime, a timedelta or None")
