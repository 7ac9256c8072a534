"""Plain records runrow hands back to the host."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._errors import ChildCancelled, ChildFailed
from ._status import TERMINAL
from ._status import RunStatus as RunStatus  # (the vocabulary lives in _status.py)

if TYPE_CHECKING:
    import uuid
    from datetime import datetime


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
    """The worker running the run, or the last one that ran it once it ended; None while
    it is queued or waiting (a worker that parked a run let go of it: the row keeps that
    worker's id, but it holds nothing and may be long gone)."""
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
    version: str | None = None
    """The code version the run started with (its first claim's ``Dispatcher(version=)``;
    a retry keeps its turn's). None: never claimed, or by an unversioned worker."""
    worker_version: str | None = None
    """The version of the worker that claimed it last (what ``runrow workers wait`` drains by)."""
    agent_key: str | None = None
    """The agent that runs it (``enqueue(agent_key=...)``, ``RunContext.spawn``); None: the default."""
    parent_run_id: uuid.UUID | None = None
    """A spawned child's parent (the first run of the spawning turn); None for a host's turn."""
    root_run_id: uuid.UUID | None = None
    """A spawned child's tree root (the first run of the root turn); None for a host's turn."""
    steerable: bool = False
    """Enqueued with ``on_busy="steer"``: an earlier turn of its conversation may read its
    message (``RunContext.steering``) instead of it running as a turn of its own."""
    absorbed_into: uuid.UUID | None = None
    """An ``absorbed`` run: the run whose turn read its message."""

    def __post_init__(self) -> None:
        # The column outlives the claim (parking keeps it); what a host shows is who holds it.
        if self.worker_id is not None and holder(self.status, self.worker_id) is None:
            object.__setattr__(self, "worker_id", None)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


_UNHELD = frozenset({"queued", "waiting"})


def holder(status: str, worker_id: str | None) -> str | None:
    """The worker to show for a run in ``status`` whose row names ``worker_id``: none while
    it is queued or waiting, whatever worker parked it."""
    return None if status in _UNHELD else worker_id


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
class SteeringMessage:
    """A steering message delivered into a running turn (:meth:`RunContext.steering`).

    ``message_id`` is the user message (now in the reading turn's transcript, where it was
    read); ``run_id`` the turn it was sent as (``enqueue(on_busy="steer")`` returned it;
    it ended ``absorbed``); ``content`` and ``user_id`` as sent."""

    message_id: uuid.UUID
    run_id: uuid.UUID
    content: Any
    user_id: str | None


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


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule as stored (see :func:`runrow.add_schedule`): when it fires (``cron`` in
    ``timezone``, or every ``interval_seconds``), the turn each tick enqueues, its
    policies, and what its fires have done so far."""

    name: str
    cron: str | None
    interval_seconds: float | None
    timezone: str
    conversation_id: str
    user_id: str
    tenant_id: str | None
    content: Any
    request: Any
    overlap: str
    """``skip`` (a tick while the previous tick's run is live is skipped) or ``queue``."""
    catch_up: str
    """After downtime: ``none``, ``last`` or ``all`` (up to ``catch_up_limit`` ticks)."""
    catch_up_limit: int
    paused: bool
    next_fire_at: datetime
    last_tick_at: datetime | None
    last_run_id: uuid.UUID | None
    fired_ticks: int
    skipped_ticks: int
    last_skipped_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ChildResult:
    """How a child run a parent waited on ended (``RunContext.wait_for_children``).

    ``run_id`` is the child's (its first run's, as ``spawn`` returned it); ``status`` its
    latest attempt's status (``completed``, ``failed``, ``cancelled`` or ``expired``; or a
    live status for a child still going, after a "first of" wait); ``answer`` the content
    of the last message it wrote (``write_message``, or its streamed answer), None if none;
    ``error`` its error record if it failed."""

    run_id: uuid.UUID
    status: RunStatus
    answer: Any = None
    error: dict[str, Any] | None = None

    @property
    def ended(self) -> bool:
        """Whether the child has ended (its status is terminal)."""
        return self.status in TERMINAL

    def get(self) -> Any:
        """The child's answer; raises :class:`~runrow.ChildCancelled` if it was cancelled,
        :class:`~runrow.ChildFailed` if it failed or expired (or has not ended)."""
        if self.status == "completed":
            return self.answer
        if self.status == "cancelled":
            raise ChildCancelled(self.run_id, self.status, self.error)
        raise ChildFailed(self.run_id, self.status, self.error)


@dataclass(frozen=True, slots=True)
class UsageTotal:
    """Usage summed per tenant and agent key (see :func:`runrow.usage_totals`).

    ``tenant_id`` / ``agent_key`` None are the default tenant / agent. Tokens and cost
    are what the runs' ``RunContext.record_usage`` calls reported, over the period
    asked for (in whole UTC hours); ``records`` is how many calls that was.
    """

    tenant_id: str | None
    agent_key: str | None
    input_tokens: int
    output_tokens: int
    cost: float
    records: int

    @property
    def tokens(self) -> int:
        """Input and output tokens together (what a token budget counts)."""
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class RunUsage:
    """One run's usage: the sum of the ``usage`` events in its journal (all zero once its
    journal is trimmed; the tenant's rollup keeps it)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    records: int = 0


@dataclass(frozen=True, slots=True)
class UsageBudget:
    """A tenant's usage budget per period (see :func:`runrow.set_usage_budget`).

    ``tokens`` (input plus output) and ``cost`` are the limits (None: not limited);
    ``period_seconds`` the period (86400: the UTC day; windows aligned to the Unix
    epoch). ``spent_tokens``, ``spent_cost`` and ``period_ends_at`` are what the tenant has
    recorded in the current period when it was read, and when that period ends.
    """

    tenant_id: str | None
    tokens: int | None
    cost: float | None
    period_seconds: int
    spent_tokens: int = 0
    spent_cost: float = 0.0
    period_ends_at: datetime | None = None

    @property
    def spent(self) -> bool:
        """Whether the current period's usage has reached a limit (enqueue refuses then)."""
        return (self.tokens is not None and self.spent_tokens >= self.tokens) or (
            self.cost is not None and self.spent_cost >= self.cost
        )


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A key's rate limit and gate (see :func:`runrow.set_rate_limit`).

    ``runs`` starts are allowed per window of ``per_seconds`` (both None: the key has only a
    gate); ``window_start`` and ``used`` are the open window and the starts counted in it;
    ``gate_until`` is when a shut gate (:class:`runrow.RetryLater` with a key) opens."""

    key: str
    runs: int | None
    per_seconds: float | None
    window_start: datetime | None = None
    used: int = 0
    gate_until: datetime | None = None
