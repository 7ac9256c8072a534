"""The public API is exactly __all__; a name appearing or vanishing is a decision, not an accident."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import runrow

EXPECTED = {
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
    "UsageBudget",
    "UsageTotal",
    "RunUsage",
    "TrimResult",
    "add_schedule",
    "cancel_run",
    "enqueue",
    "ensure_journal_partitions",
    "get_run",
    "latest_version",
    "list_rate_limits",
    "list_runs",
    "list_schedules",
    "migrate",
    "next_fires",
    "pause_schedule",
    "provide_input",
    "queue_position",
    "queue_stats",
    "remove_rate_limit",
    "remove_schedule",
    "resume_schedule",
    "retry_later_from",
    "retry_run",
    "set_rate_limit",
    "set_tenant_policy",
    "get_usage_budget",
    "journal_partitions",
    "remove_usage_budget",
    "run_usage",
    "set_usage_budget",
    "usage_totals",
    "stop_conversation",
    "tail",
    "tenant_policies",
    "transcript",
    "trim",
    "waiting_inputs",
    # webhooks (#42)
    "Webhook",
    "WebhookDelivery",
    "add_webhook",
    "list_webhooks",
    "redeliver",
    "remove_webhook",
    "send_test_webhook",
    "webhook_deliveries",
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
        "JournalPartitionMissing",
        "LeaseLost",
        "NotWaitingForInput",
        "Overloaded",
        "RunNotFound",
        "RunTrimmed",
        "SchemaOutOfDate",
        "SpawnLimitExceeded",
        "ChildFailed",
        "ChildCancelled",
        "StepFailed",
        "StepMismatch",
        "StepUncertain",
    ):
        assert issubclass(getattr(runrow, name), runrow.RunrowError)


def test_the_sync_module_is_the_expected_api() -> None:
    """runrow.sync: the async API's calls a synchronous request handler makes, no more."""
    from runrow import sync

    assert set(sync.__all__) == {
        "list_rate_limits",
        "remove_rate_limit",
        "set_rate_limit",
        "add_schedule",
        "list_schedules",
        "next_fires",
        "pause_schedule",
        "remove_schedule",
        "resume_schedule",
        "cancel_run",
        "enqueue",
        "get_run",
        "provide_input",
        "queue_position",
        "retry_run",
        "stop_conversation",
        "tail",
        "waiting_inputs",
        "get_usage_budget",
        "remove_usage_budget",
        "run_usage",
        "set_usage_budget",
        "usage_totals",
        "add_webhook",
        "list_webhooks",
        "redeliver",
        "remove_webhook",
        "send_test_webhook",
        "webhook_deliveries",
    }
    assert (sync.__doc__ or "").strip()
    for name in sync.__all__:
        assert (getattr(sync, name).__doc__ or "").strip(), f"sync.{name} has no docstring"


# `name(..., keyword=...)` as messages, docstrings and docs write a call's keyword.
_KEYWORD_CALL = re.compile(r"\b(?:run\.|runrow\.)?([A-Za-z_]+)\(\.\.\., *([a-z_]+)=")


def _runrow_callable(name: str) -> Any:
    """The runrow function or RunContext method ``name`` (None: not runrow's, e.g. an SDK's)."""
    import runrow.admin
    import runrow.http

    for home in (runrow, runrow.RunContext, runrow.sync, runrow.admin, runrow.http):
        found = getattr(home, name, None)
        if callable(found):
            return found
    return None


def test_every_call_a_message_or_doc_advises_takes_that_keyword() -> None:
    """A keyword an error message or a doc tells the reader to pass is a parameter of the
    call it names, not something its ``**kwargs`` would hand on (StepUncertain once advised
    ``step(..., idempotent=True)``: the keyword went to the step's own function)."""
    root = Path(__file__).resolve().parents[1]
    files = [*root.glob("docs/**/*.md"), root / "README.md", *(root / "src" / "runrow").rglob("*.py")]
    checked = 0
    for path in files:
        for name, keyword in _KEYWORD_CALL.findall(path.read_text()):
            fn = _runrow_callable(name)
            if fn is None:
                continue
            params = inspect.signature(fn).parameters
            assert keyword in params, f"{path.relative_to(root)}: {name}(..., {keyword}=) is not a parameter"
            assert params[keyword].kind is not inspect.Parameter.VAR_KEYWORD
            checked += 1
    assert checked >= 3  # (the pattern still finds what it is for)


def test_step_uncertain_advises_the_idempotent_step_that_exists() -> None:
    message = str(runrow.StepUncertain("r", "charge", 0))
    assert "run.idempotent_step" in message and "idempotent=True" not in message
    assert callable(runrow.RunContext.idempotent_step)
