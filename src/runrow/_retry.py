"""Automatic retries: opt-in, per dispatcher (``Dispatcher(retry=RetryPolicy(...))``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ._errors import ConfigurationError, StepMismatch, StepUncertain

__all__ = ["RetryPolicy"]

# Failures no retry can mend: replaying the same turn would fail the same way.
_NEVER = (StepUncertain, StepMismatch)
# Bounds that keep the database's backoff arithmetic finite (see finalize's retried).
_MAX_ATTEMPTS = 100
_MAX_BACKOFF = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """When a failed run is retried automatically, as a new run of the same turn.

    The retry is enqueued in the same transaction as the failed run's ending (its
    worker's, or the reaper's), takes the failed run's place at the head of its
    conversation (later turns stay behind it), replays the turn's recorded steps (see
    :meth:`RunContext.step`), and is due ``backoff x 2^(attempt - 1)`` seconds later (at
    most ``max_backoff``). A run is retried when all of these hold:

    * it failed: the agent raised an instance of ``retry_on``, or its worker was lost
      (its lease lapsed, or a drain cut it) and ``worker_lost`` is True; a run that was
      stopped, or ran past its deadline, is not retried;
    * it is not the turn's ``max_attempts``-th attempt;
    * no step of the turn is uncertain (begun and never recorded), since a retry would
      then fail with :class:`~runrow.StepUncertain` anyway; ``StepUncertain`` and
      ``StepMismatch`` themselves are never retried.

    The policy is stamped on each run its dispatcher claims, so that whoever ends the
    run (the worker, or any process's reaper) applies the same one.
    """

    max_attempts: int = 3
    """Attempts in all, the first included (at least 2 to retry at all; at most 100)."""
    backoff: float = 1.0
    """Seconds before the first retry is due; doubled for each further one."""
    max_backoff: float = 60.0
    """The longest wait before a retry is due, in seconds (at most a week)."""
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    """The agent errors that are retried (instances of these types)."""
    worker_lost: bool = True
    """Whether a run whose worker was lost (or cut by a drain) is retried."""

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if not isinstance(attempts, int) or isinstance(attempts, bool) or not 1 <= attempts <= _MAX_ATTEMPTS:
            raise ConfigurationError(
                f"max_attempts must be an integer from 1 to {_MAX_ATTEMPTS}, got {attempts!r}"
            )
        for name in ("backoff", "max_backoff"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or not 0 <= value <= _MAX_BACKOFF
            ):
                raise ConfigurationError(f"{name} must be from 0 to {_MAX_BACKOFF:g} seconds, got {value!r}")
        if not isinstance(self.retry_on, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in self.retry_on
        ):
            raise ConfigurationError("retry_on must be a tuple of exception types")
        if not isinstance(self.worker_lost, bool):
            raise ConfigurationError("worker_lost must be True or False")

    def retries(self, exc: BaseException) -> bool:
        """Whether an agent that raised ``exc`` should be retried (attempts aside)."""
        if isinstance(exc, _NEVER):
            return False
        if isinstance(exc, BaseExceptionGroup) and exc.subgroup(_NEVER) is not None:
            return False  # (a task group's error that holds one)
        return isinstance(exc, self.retry_on)

    def stamp(self) -> str:
        """The policy as the JSON a claim stamps on its runs (what the database applies)."""
        return json.dumps(
            {
                "max_attempts": self.max_attempts,
                "backoff": float(self.backoff),
                "max_backoff": float(self.max_backoff),
                "worker_lost": self.worker_lost,
            }
        )
