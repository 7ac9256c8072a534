"""asyncio shortcuts for the dispatcher's per-run path.

runrow runs on anyio's asyncio backend only (psycopg's async API is asyncio-only).
anyio looks its backend up for every primitive it creates and every clock read (a
context-variable and current-task probe, about a microsecond or two each, a dozen
times per run); on the hot path these go to asyncio directly, with the same meaning.
Cancel scopes stay anyio's: cancellation still flows through them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Coroutine

__all__ = ["Event", "TaskSet", "now"]

log = logging.getLogger("runrow.tasks")

# An asyncio.Event is what anyio's Event wraps on this backend; waiting on it inside an
# anyio cancel scope is cancelled like any other await. (Unlike anyio's, waiting on an
# event already set does not yield: no caller here relies on that checkpoint.)
Event = asyncio.Event


def now() -> float:
    """``anyio.current_time()`` on the asyncio backend: the running loop's clock, which
    is also the clock of cancel-scope deadlines."""
    return asyncio.get_running_loop().time()


class TaskSet:
    """Plain asyncio tasks that its owner tracks, cancels and waits for itself.

    For the dispatcher's runs: an anyio task group builds a handle, an event and a
    cancel scope for every task it starts (about four times what a bare task costs), and
    a worker starts one task per run. The runs need none of it: each catches its own
    errors and is cancelled through its own scope; the dispatcher waits for them by its
    own bookkeeping, and :meth:`cancel_and_wait` ends any left over at shutdown.
    """

    __slots__ = ("_tasks", "closed")

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    def start(self, coro: Coroutine[Any, Any, None]) -> None:
        """Starts ``coro`` as a task. Once :meth:`cancel_and_wait` has begun, ``coro`` is
        closed unstarted instead (whatever it was for is abandoned with the owner)."""
        if self.closed:
            coro.close()
            return
        # Held here until done: the loop keeps only a weak reference to a task.
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        # Each task catches its own errors; one that escapes is a bug, said at once
        # rather than as "exception was never retrieved" whenever the task is collected.
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("task %s failed", task.get_name(), exc_info=exc)

    async def cancel_and_wait(self, timeout: float) -> int:
        """Cancels every task still running and waits up to ``timeout`` for them to end;
        returns how many did not. No task can be started afterwards."""
        self.closed = True
        tasks = list(self._tasks)
        if not tasks:
            return 0
        for task in tasks:
            task.cancel()
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        return len(pending)
