"""runrow: durable AI-agent runs on plain PostgreSQL. A run is not a request; it is a row."""

from __future__ import annotations

import contextlib

from ._engine.context import Agent, RunContext
from ._engine.dispatcher import Dispatcher, DrainReport
from ._engine.view import RunView
from ._enqueue import enqueue
from ._errors import (
    ChildCancelled,
    ChildFailed,
    ConfigurationError,
    ConversationBusy,
    DeadlinePassed,
    IdempotencyConflict,
    InvalidInput,
    JournalPartitionMissing,
    LeaseLost,
    NotWaitingForInput,
    Overloaded,
    RunNotFound,
    RunrowError,
    RunTrimmed,
    SchemaOutOfDate,
    SpawnLimitExceeded,
    StepFailed,
    StepMismatch,
    StepUncertain,
)
from ._events import Event
from ._hub import NotifyHub
from ._inputs import PendingInput, provide_input, waiting_inputs
from ._limits import list_rate_limits, remove_rate_limit, set_rate_limit
from ._migrate import latest_version, migrate
from ._models import (
    ChildResult,
    Draft,
    Message,
    QueuePosition,
    RateLimit,
    Run,
    RunInfo,
    RunUsage,
    Schedule,
    SteeringMessage,
    StopResult,
    TenantPolicy,
    UsageBudget,
    UsageTotal,
)
from ._observe import Observer
from ._partitions import JournalPartition, ensure_journal_partitions, journal_partitions
from ._queries import QueueStats, get_run, list_runs, queue_stats, transcript
from ._retention import TrimResult, trim
from ._retry import RetryPolicy
from ._retry_later import RetryLater, retry_later_from
from ._retry_run import retry_run
from ._schedules import (
    add_schedule,
    list_schedules,
    next_fires,
    pause_schedule,
    remove_schedule,
    resume_schedule,
)
from ._status import RunStatus
from ._stop import cancel_run, stop_conversation
from ._tail import tail
from ._tenants import queue_position, set_tenant_policy, tenant_policies
from ._usage import get_usage_budget, remove_usage_budget, run_usage, set_usage_budget, usage_totals
from ._webhook_models import Webhook, WebhookDelivery
from ._webhooks import (
    add_webhook,
    list_webhooks,
    redeliver,
    remove_webhook,
    send_test_webhook,
    webhook_deliveries,
)

__all__ = [
    "Agent",
    "ChildCancelled",
    "ChildFailed",
    "ChildResult",
    "ConfigurationError",
    "ConversationBusy",
    "DeadlinePassed",
    "Dispatcher",
    "Draft",
    "DrainReport",
    "Event",
    "IdempotencyConflict",
    "InvalidInput",
    "JournalPartition",
    "JournalPartitionMissing",
    "LeaseLost",
    "Message",
    "NotWaitingForInput",
    "NotifyHub",
    "Observer",
    "Overloaded",
    "PendingInput",
    "QueuePosition",
    "QueueStats",
    "RateLimit",
    "RetryLater",
    "RetryPolicy",
    "Run",
    "RunContext",
    "RunInfo",
    "RunNotFound",
    "RunStatus",
    "RunTrimmed",
    "RunUsage",
    "RunView",
    "RunrowError",
    "Schedule",
    "SchemaOutOfDate",
    "SpawnLimitExceeded",
    "SteeringMessage",
    "StepFailed",
    "StepMismatch",
    "StepUncertain",
    "StopResult",
    "TenantPolicy",
    "TrimResult",
    "UsageBudget",
    "UsageTotal",
    "Webhook",
    "WebhookDelivery",
    "add_schedule",
    "add_webhook",
    "cancel_run",
    "enqueue",
    "ensure_journal_partitions",
    "get_run",
    "get_usage_budget",
    "journal_partitions",
    "latest_version",
    "list_rate_limits",
    "list_runs",
    "list_schedules",
    "list_webhooks",
    "migrate",
    "next_fires",
    "pause_schedule",
    "provide_input",
    "queue_position",
    "queue_stats",
    "redeliver",
    "remove_rate_limit",
    "remove_schedule",
    "remove_usage_budget",
    "remove_webhook",
    "resume_schedule",
    "retry_later_from",
    "retry_run",
    "run_usage",
    "send_test_webhook",
    "set_rate_limit",
    "set_tenant_policy",
    "set_usage_budget",
    "stop_conversation",
    "tail",
    "tenant_policies",
    "transcript",
    "trim",
    "usage_totals",
    "waiting_inputs",
    "webhook_deliveries",
]

__version__ = "0.1.0.dev0"

# Public names report the package, not the private module that defines them.
for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and getattr(_obj, "__module__", "").startswith("runrow."):
        with contextlib.suppress(AttributeError, TypeError):
            _obj.__module__ = "runrow"
del _name, _obj
