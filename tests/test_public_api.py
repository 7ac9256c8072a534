"""The public API is exactly __all__; a name appearing or vanishing is a decision, not an accident."""

from __future__ import annotations

import inspect

import runrow

EXPECTED = {
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
}


def test_all_is_the_expected_api() -> None:
    assert set(runrow.__all__) == EXPECTED
    assert runrow.__all__ == sorted(runrow.__all__)


def test_every_public_name_exists_and_is_documented() -> None:
    for name in runrow.__all__:
        obj = getattr(runrow, name)
        if isinstance(obj, type) or inspect.isfunction(obj) or inspect.isasyncgenfunction(obj):
            assert (obj.__doc__ or "").strip(), f"{name} has no docstring"


def test_errors_share_one_base() -> None:
    for name in (
        "ConfigurationError",
        "ConversationBusy",
        "DeadlinePassed",
        "IdempotencyConflict",
        "InvalidInput",
        "LeaseLost",
        "NotWaitingForInput",
        "Overloaded",
        "RunNotFound",
        "RunTrimmed",
        "SchemaOutOfDate",
        "StepFailed",
        "StepMismatch",
        "StepUncertain",
    ):
        assert issubclass(getattr(runrow, name), runrow.RunrowError)


def test_the_sync_module_is_the_expected_api() -> None:
    """runrow.sync: the async API's calls a synchronous request handler makes, no more."""
    from runrow import sync

    assert set(sync.__all__) == {
        "cancel_run",
        "enqueue",
        "get_run",
        "provide_input",
        "queue_position",
        "retry_run",
        "stop_conversation",
        "tail",
        "waiting_inputs",
    }
    assert (sync.__doc__ or "").strip()
    for name in sync.__all__:
        assert (getattr(sync, name).__doc__ or "").strip(), f"sync.{name} has no docstring"
