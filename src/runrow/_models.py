"""Plain records runrow hands back to the host."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

RunStatus = Literal["queued", "running", "completed", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class Run:
    """A run as it was when runrow last read it. ``created`` is False when an
    idempotency key (or a repeated retry) returned an existing run instead of a new one."""

    id: uuid.UUID
    status: RunStatus
    conversation_id: str
    user_message_id: uuid.UUID
    created_at: datetime
    created: bool = True


@dataclass(frozen=True, slots=True)
class RunInfo:
    """Every column of a run a host may want to show (see :func:`runrow.get_run`)."""

    id: uuid.UUID
    conversation_id: str
    user_id: str
    tenant_id: str | None
    status: RunStatus
    request: Any
    idempotency_key: str | None
    retry_of: uuid.UUID | None
    worker_id: str | None
    cancel_requested: bool
    error: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    last_heartbeat_at: datetime | None
    finished_at: datetime | None
    claim_expires_at: datetime | None
    user_message_id: uuid.UUID

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True, slots=True)
class Message:
    """One transcript entry."""

    id: uuid.UUID
    role: str
    content: Any
    status: str
    run_id: uuid.UUID | None
    user_id: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Draft:
    """A user message handed back by a stop, for the composer."""

    run_id: uuid.UUID
    message_id: uuid.UUID
    content: Any


@dataclass(frozen=True, slots=True)
class StopResult:
    """What a stop did: queued turns cancelled (their drafts), running turns asked to stop.

    ``noop`` is True when there was nothing active to stop (already finished)."""

    cancelled: list[uuid.UUID] = field(default_factory=list)
    cancel_requested: list[uuid.UUID] = field(default_factory=list)
    drafts: list[Draft] = field(default_factory=list)

    @property
    def noop(self) -> bool:
        return not self.cancelled and not self.cancel_requested
