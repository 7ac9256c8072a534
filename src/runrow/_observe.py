"""Hooks for metrics and tracing: subclass :class:`Observer`, pass ``Dispatcher(observers=[...])``.

Every hook is a no-op here. A hook about one run gets a read-only
:class:`~runrow.RunView` of it (never the agent's ``RunContext``). Hooks are called
on the dispatcher's event loop and must be quick and must not raise (an exception is logged and otherwise ignored). ``run_scope``
wraps the agent call, so a tracer can make the run's span current for the agent's own
spans.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._engine.view import RunView

__all__ = ["Observer", "Observers"]

log = logging.getLogger("runrow.dispatcher")


class Observer:
    """Receives what a dispatcher does. Override the hooks you need."""

    def claimed(self, *, count: int, seconds: float) -> None:
        """One claim statement took ``count`` runs in ``seconds``."""

    def run_started(self, run: RunView, *, queue_wait: float) -> None:
        """A claimed run's agent is about to be called; it waited ``queue_wait`` s in the queue."""

    def run_scope(self, run: RunView) -> contextlib.AbstractContextManager[None]:
        """A context manager around the agent call (a tracing span, say)."""
        return contextlib.nullcontext()

    def first_event(self, run: RunView, *, seconds: float) -> None:
        """The run's first journal flush landed ``seconds`` after the agent started."""

    def journal_flush(self, run: RunView, *, rows: int) -> None:
        """A flush wrote ``rows`` journal rows for the run."""

    def run_finished(self, run: RunView, *, status: str, seconds: float, recorded: bool) -> None:
        """The run ended ``status`` after ``seconds``; ``recorded`` is False when its ending
        could not be written (claim lost, or the database was unreachable). Called from
        the worker's ending writer once the write is answered, not from the run's own
        task: context variables set during the run are not visible here."""

    def claim_lost(self, run: RunView) -> None:
        """The worker stood down: someone else ended or took over the run."""

    def heartbeat(self, *, runs: int, lag: float) -> None:
        """A heartbeat renewed ``runs`` leases; ``lag`` is how late it ran past its interval."""

    def reaped(self, *, count: int) -> None:
        """This dispatcher's reaper ended ``count`` runs whose worker was lost."""


class Observers:
    """The dispatcher's observers, called so that none can break a run (internal)."""

    __slots__ = ("_list", "_worker_id")

    def __init__(self, observers: Sequence[Observer], worker_id: str) -> None:
        self._list = list(observers)
        self._worker_id = worker_id

    def __bool__(self) -> bool:
        return bool(self._list)

    def __call__(self, hook: Callable[[Observer], object]) -> None:
        """Calls ``hook`` on each observer; one that raises is logged and skipped."""
        for obs in self._list:
            try:
                hook(obs)
            except Exception:  # an observer must never break a run
                log.exception("observer %r failed", obs, extra={"worker_id": self._worker_id})

    def scopes(self, run: RunView | None) -> contextlib.AbstractContextManager[object]:
        """The observers' scopes around one agent call, entered; none without observers
        (an ExitStack's exit costs measurably per run; ``run`` is None then)."""
        if not self._list or run is None:
            return contextlib.nullcontext()
        scopes = contextlib.ExitStack()
        try:
            for obs in self._list:
                scopes.enter_context(obs.run_scope(run))
        except BaseException:
            scopes.close()
            raise
        return scopes
