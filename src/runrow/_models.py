"""Plain records runrow hands back to the host."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

RunStatus = Literal["queued", "running", "waiting", "completed", "failed", "cancelled", "expired"]
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled", "expired"})


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
    interrupted: StopResult | None = None
    """With ``on_busy="interrupt"``: what the interrupt stopped (queued turns cancelled,
    their drafts, the running turn asked to stop); None otherwise."""


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
    priority: int = 0
    not_before: datetime | None = None
    deadline_at: datetime | None = None
    attempt: int = 1
    """Which attempt of its turn this run is: 1, then one more per retry."""
    lineage_id: uuid.UUID | None = None
    """The turn's first run, on a retry (None on the first attempt); steps replay across it."""
    resumes: int = 0
    """How many times input resumed the run after it waited (see ``wait_for_input``)."""
    input_deadline_at: datetime | None = None
    """While the run is ``waiting``: when its wait ends if no input comes (None: never)."""

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
    """What a stop did: queued and waiting turns cancelled (the queued ones' drafts),
    running turns asked to stop.

    ``noop`` is True when there was nothing active to stop (already finished)."""

    cancelled: list[uuid.UUID] = field(default_factory=list)
    cancel_requested: list[uuid.UUID] = field(default_factory=list)
    drafts: list[Draft] = field(default_factory=list)

    @property
    def noop(self) -> bool:
        return not self.cancelled and not self.cancel_requested


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """A tenant's share of the fair claim. ``tenant_id`` None is the default tenant (runs
    enqueued without a tenant). ``weight`` (1 by default) scales its share of running
    runs; ``max_running`` caps its running runs (None: no cap)."""

    tenant_id: str | None
    weight: int = 1
    max_running: int | None = None


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """Where a run stands (see :func:`runrow.queue_position`).

    For a queued run, ``position`` is 1-based under the fair claim order (1: the next
    claim takes it, if a slot and its conversation allow), ``rank_in_tenant`` its place
    among its own tenant's queued runs, and ``estimated_wait_seconds`` the position
    divided by recent throughput (None when nothing finished recently), at least the
    time until its ``not_before``. For any other status all three are None.
    ``exact`` is False when ``position`` (and perhaps ``rank_in_tenant``) is an estimate:
    the runs ahead are counted one by one only up to about a thousand.
    """

    run_id: uuid.UUID
    status: RunStatus
    position: int | None
    rank_in_tenant: int | None
    estimated_wait_seconds: float | None
    throughput_per_minute: float
    exact: bool = True
