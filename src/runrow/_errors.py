"""The errors runrow raises. Every one is a :class:`RunrowError`."""

from __future__ import annotations

from typing import Any

__all__ = [
    "ChildCancelled",
    "ChildFailed",
    "ConfigurationError",
    "ConversationBusy",
    "IdempotencyConflict",
    "InvalidInput",
    "JournalPartitionMissing",
    "LeaseLost",
    "NotWaitingForInput",
    "Overloaded",
    "RunNotFound",
    "RunTrimmed",
    "RunrowError",
    "SchemaOutOfDate",
    "SpawnLimitExceeded",
    "StepFailed",
    "StepMismatch",
    "StepUncertain",
]


class RunrowError(Exception):
    """Base class of every error runrow raises on purpose."""


class InvalidInput(RunrowError, ValueError):
    """An argument was rejected before anything was written.

    ``field`` names the argument at fault.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class ConfigurationError(RunrowError, ValueError):
    """Options that cannot work together, such as a heartbeat no shorter than the lease."""


class JournalPartitionMissing(RunrowError):
    """No journal partition holds the runs being made now: nothing was written.

    Workers and ``runrow migrate`` make partitions ahead of the clock
    (``journal_settings.premake`` intervals); this happens only when neither has run for
    longer than that. The fix: ``runrow migrate``, a worker, or
    :func:`runrow.ensure_journal_partitions`.
    """

    def __init__(self, schema: str) -> None:
        super().__init__(
            f"runrow schema {schema!r} has no journal partition for runs made now: run `runrow migrate` "
            "or start a worker (both make partitions ahead), or call runrow.ensure_journal_partitions()"
        )
        self.schema = schema


def no_journal_partition(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL finding no partition of the journal for a row."""
    primary = getattr(getattr(exc, "diag", None), "message_primary", None) or ""
    return getattr(exc, "sqlstate", None) == "23514" and primary.startswith("no partition of relation")


class SchemaOutOfDate(RunrowError):
    """The database schema is missing, older or newer than this version of runrow expects.

    The message names the fix (usually ``runrow migrate``).
    """

    def __init__(self, schema: str, found: int | None, expected: int) -> None:
        if found is None:
            what = f"runrow schema {schema!r} does not exist in this database"
        elif found < expected:
            what = f"runrow schema {schema!r} is at version {found}, this runrow needs {expected}"
        else:
            what = (
                f"runrow schema {schema!r} is at version {found}, newer than this runrow "
                f"({expected}); upgrade the runrow package"
            )
        fix = (
            ""
            if found is not None and found > expected
            else (f"; run `runrow migrate --schema {schema}` (or `await runrow.migrate(...)`)")
        )
        super().__init__(what + fix)
        self.schema = schema
        self.found = found
        self.expected = expected


class RunNotFound(RunrowError, LookupError):
    """No run has that id (in this schema)."""

    def __init__(self, run_id: object) -> None:
        super().__init__(f"no run with id {run_id!s}")
        self.run_id = run_id


class RunTrimmed(InvalidInput):
    """:func:`runrow.retry_run` refused a run that retention (:func:`runrow.trim`) has
    trimmed: its lineage's step records (and perhaps its request snapshot) are deleted,
    and a retry must not run without them (it would run its steps again). Nothing was
    written. Enqueue the message as a new turn instead.
    """

    def __init__(self, run_id: object) -> None:
        super().__init__(
            "run_id",
            f"{run_id!s} was trimmed by retention, which deleted its step records; "
            "it cannot be retried (enqueue the message as a new turn)",
        )
        self.run_id = run_id


class DeadlinePassed(InvalidInput):
    """:func:`runrow.retry_run` refused to keep a deadline that has already passed: the
    retry would end ``failed`` (``deadline_exceeded``) without its agent being called.
    Nothing was written. Retry with ``deadline=`` a new deadline (a ``timedelta`` from
    now, or a ``datetime``), or ``deadline=None`` for none.
    """

    def __init__(self, run_id: object, deadline_at: object) -> None:
        super().__init__(
            "deadline",
            f"run {run_id!s}'s deadline passed at {deadline_at!s}, so a retry that keeps it "
            "would end at once; pass a new one (retry_run(..., deadline=timedelta(...)), "
            "`runrow runs retry --deadline-seconds N`) or none (deadline=None, --no-deadline)",
        )
        self.run_id = run_id
        self.deadline_at = deadline_at


class LeaseLost(RunrowError):
    """This worker no longer holds the run's claim: it was reaped, stopped or superseded.

    Raised from fenced writes (``emit``, ``write_message``); the dispatcher stops the
    run's agent and writes nothing more for it.
    """

    def __init__(self, run_id: object) -> None:
        super().__init__(f"lost the claim on run {run_id!s}; standing down")
        self.run_id = run_id


class Overloaded(RunrowError):
    """An enqueue was shed. Nothing was written.

    ``reason`` says why: ``"queue_limit"`` (the tenant or the conversation already has as
    many queued runs as the limit passed to :func:`runrow.enqueue` allows; ``scope`` is
    ``"tenant"`` or ``"conversation"`` and ``limit`` the limit that was hit) or
    ``"usage_budget"`` (the tenant's usage budget for the current period is spent, see
    :func:`runrow.set_usage_budget`; ``scope`` is ``"tenant"``, ``limit`` is 0 and
    ``resets_at`` is when the next period starts). ``retry_after`` is a hint in whole
    seconds (at least 1), fit for an HTTP ``Retry-After`` header with a 429.
    """

    def __init__(
        self,
        scope: str,
        key: str | None,
        limit: int,
        retry_after: int,
        *,
        reason: str = "queue_limit",
        resets_at: object = None,
    ) -> None:
        what = "the default tenant" if scope == "tenant" and key is None else f"{scope} {key!r}"
        if reason == "usage_budget":
            message = f"{what} has spent its usage budget for this period; retry in about {retry_after}s"
        else:
            message = f"{what} already has {limit} queued run(s), its limit; retry in about {retry_after}s"
        super().__init__(message)
        self.scope = scope
        self.key = key
        self.limit = limit
        self.retry_after = retry_after
        self.reason = reason
        self.resets_at = resets_at


class ConversationBusy(RunrowError):
    """``enqueue(..., on_busy="reject")`` found a queued or running turn in the
    conversation. Nothing was written."""

    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} already has an active turn")
        self.conversation_id = conversation_id


class IdempotencyConflict(RunrowError):
    """:func:`runrow.enqueue` got an ``idempotency_key`` the user already used for a
    different turn. Nothing was written: the new message is refused, not dropped.

    A repeat is the same turn when its conversation, tenant, content and request equal
    the first's (JSON by value); the scheduling options may differ. ``run_id`` is the run
    the key already names and ``fields`` the arguments that differ (a subset of
    ``"conversation_id"``, ``"tenant_id"``, ``"content"``, ``"request"``). Fit for an
    HTTP 409.
    """

    def __init__(self, idempotency_key: str, run_id: object, fields: tuple[str, ...]) -> None:
        super().__init__(
            f"idempotency key {idempotency_key!r} was already used for run {run_id!s}, "
            f"a different turn ({', '.join(fields)} differ); use a new key for a new message"
        )
        self.idempotency_key = idempotency_key
        self.run_id = run_id
        self.fields = fields


class StepUncertain(RunrowError):
    """A retry reached a step an earlier attempt began and never recorded: its worker
    died (or its claim was lost) while the step ran, so its side effect may or may not
    have happened. It was a ``run.step`` (not a ``run.idempotent_step``), so it is not
    run again, and the turn fails naming it. ``key`` and ``occurrence`` name the step
    (the n-th call with that key in the turn, from 0).
    """

    def __init__(self, run_id: object, key: str, occurrence: int) -> None:
        super().__init__(
            f"step {key!r} (call {occurrence}) of run {run_id!s} was begun by an earlier attempt "
            "and never recorded, so it may have run; it is not idempotent (a call safe to "
            "repeat goes through run.idempotent_step instead of run.step), so the turn fails "
            "rather than run it twice"
        )
        self.run_id = run_id
        self.key = key
        self.occurrence = occurrence


class StepMismatch(RunrowError):
    """A retry called its steps in another order than the attempt it replays: the agent's
    code between steps is not deterministic (it branched on time, randomness or a fresh
    read instead of a step's result). Replay cannot tell which recorded result belongs to
    which call, so the turn fails. ``position`` is the step call's place in the turn (from 0).
    """

    def __init__(self, run_id: object, position: int, called: str, recorded: str | None) -> None:
        there = f"step {recorded!r}" if recorded is not None else "a different place"
        super().__init__(
            f"run {run_id!s}: step call {position} is {called!r}, but the attempt being replayed "
            f"recorded {there} there; code between steps must be deterministic"
        )
        self.run_id = run_id
        self.position = position
        self.called = called
        self.recorded = recorded


class StepFailed(RunrowError):
    """A replayed step had raised an error whose type cannot be rebuilt here (not
    importable, or not constructible from its message). ``type`` is the original type's
    name, and the message is the original message.
    """

    def __init__(self, key: str, type_name: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.type = type_name


class NotWaitingForInput(RunrowError):
    """``provide_input`` found the run not waiting for that input: it waits for another
    key, or is not waiting at all (queued, running, finished), or another value was
    already recorded for the key. ``status`` is the run's status then.
    """

    def __init__(self, run_id: object, key: str, status: str) -> None:
        super().__init__(f"run {run_id!s} is not waiting for input {key!r} (it is {status})")
        self.run_id = run_id
        self.key = key
        self.status = status


class ChildFailed(RunrowError):
    """A child run a parent waited on (``RunContext.wait_for_children``) did not complete:
    it ``failed`` (its error's type and message are here) or ``expired``. ``run_id`` is the
    child's (its first run's) id, ``status`` its status, ``error`` its error record."""

    def __init__(self, run_id: object, status: str, error: dict[str, Any] | None) -> None:
        said = "" if not error else f": {error.get('type')}: {error.get('message')}"
        super().__init__(f"child run {run_id!s} ended {status}{said}")
        self.run_id = run_id
        self.status = status
        self.error = error


class ChildCancelled(ChildFailed):
    """A child run a parent waited on was cancelled (a stop, or ``cancel_run``)."""


class SpawnLimitExceeded(RunrowError):
    """A spawn would take the tree past a Dispatcher's limit: ``limit`` is
    ``"max_spawn_depth"`` or ``"max_children"``, ``value`` its setting. Nothing was spawned."""

    def __init__(self, limit: str, value: int, detail: str) -> None:
        super().__init__(f"{limit} ({value}) reached: {detail}")
        self.limit = limit
        self.value = value
