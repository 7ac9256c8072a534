"""runrow: durable AI-agent runs on plain PostgreSQL. A run is not a request; it is a row."""

from __future__ import annotations

import contextlib

from ._engine.context import Agent, RunContext
from ._engine.dispatcher import Dispatcher, DrainReport
from ._enqueue import enqueue
from ._errors import (
    ConfigurationError,
    ConversationBusy,
    DeadlinePassed,
    IdempotencyConflict,
    InvalidInput,
    LeaseLost,
    NotWaitingForInput,
    Overloaded,
    RunNotFound,
    RunrowError,
    RunTrimmed,
    SchemaOutOfDate,
    StepFailed,
    StepMismatch,
    StepUncertain,
)
from ._events import Event
from ._hub import NotifyHub
from ._inputs import PendingInput, provide_input, waiting_inputs
from ._migrate import latest_version, migrate
from ._models import Draft, Message, QueuePosition, Run, RunInfo, RunStatus, StopResult, TenantPolicy
from ._observe import Observer
from ._queries import QueueStats, get_run, list_runs, queue_stats, transcript
from ._retention import TrimResult, trim
from ._retry import RetryPolicy
from ._retry_run import retry_run
from ._stop import cancel_run, stop_conversation
from ._tail import tail
from ._tenants import queue_position, set_tenant_policy, tenant_policies

__all__ = [
    "Agent",
    "ConfigurationError",
    "ConversationBusy",
    "DeadlinePassed",
    "Dispatcher",
    "Draft",
    "DrainReport",
    "Event",
    "IdempotencyConflict",
    "InvalidInput",
    "LeaseLost",
    "Message",
    "NotWaitingForInput",
    "NotifyHub",
    "Observer",
    "Overloaded",
    "PendingInput",
    "QueuePosition",
    "QueueStats",
    "RetryPolicy",
    "Run",
    "RunContext",
    "RunInfo",
    "RunNotFound",
    "RunStatus",
    "RunTrimmed",
    "RunrowError",
    "SchemaOutOfDate",
    "StepFailed",
    "StepMismatch",
    "StepUncertain",
    "StopResult",
    "TenantPolicy",
    "TrimResult",
    "cancel_run",
    "enqueue",
    "get_run",
    "latest_version",
    "list_runs",
    "migrate",
    "provide_input",
    "queue_position",
    "queue_stats",
    "retry_run",
    "set_tenant_policy",
    "stop_conversation",
    "tail",
    "tenant_policies",
    "transcript",
    "trim",
    "waiting_inputs",
]

__version__ = "0.1.0.dev0"

# Public names report the package, not the private module that defines them.
for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and getattr(_obj, "__module__", "").startswith("runrow."):
        with contextlib.suppress(AttributeError, TypeError):
            _obj.__module__ = "runrow"
del _name, _obj
