"""One shape for every long-lived loop of a dispatcher.

A service is an ``async def loop(*, task_status)`` that calls ``task_status.started()``
once it is ready (a LISTEN established, say) and then runs until cancelled. The
:class:`Services` owner starts each in the dispatcher's task group under a name and
its own cancel scope, and stops them by cancelling those scopes: never the task
group's, which belongs to the host's task and only ``__aexit__`` may leave. Per-run
work is the only other kind of task (see ``TaskSet`` in ``runrow._aio``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import anyio

if TYPE_CHECKING:
    from anyio.abc import TaskGroup, TaskStatus


class Loop(Protocol):
    """A service's body."""

    async def __call__(self, *, task_status: TaskStatus[None]) -> None: ...


@dataclass(slots=True)
class _Running:
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)


class Services:
    """The named services of one dispatcher, started and stopped the same way."""

    def __init__(self) -> None:
        self._running: dict[str, _Running] = {}

    @property
    def names(self) -> list[str]:
        """The services started, in start order."""
        return list(self._running)

    async def start(self, tg: TaskGroup, name: str, loop: Loop) -> None:
        """Starts ``loop`` as service ``name`` and returns once it reports ready."""
        if name in self._running:
            raise RuntimeError(f"service {name!r} is already running")
        running = self._running[name] = _Running()
        await tg.start(self._run, running, loop, name=f"runrow:{name}")

    @staticmethod
    async def _run(running: _Running, loop: Loop, *, task_status: TaskStatus[None]) -> None:
        try:
            with running.scope:
                await loop(task_status=task_status)
        finally:
            running.done.set()

    async def stop(self, *names: str, timeout: float) -> bool:
        """Cancels the named services (all, if none are named) and waits up to
        ``timeout`` for them to end; False if any had not."""
        chosen = (
            [self._running[n] for n in names if n in self._running] if names else list(self._running.values())
        )
        for running in chosen:
            running.scope.cancel()
        with anyio.move_on_after(timeout):
            for running in chosen:
                await running.done.wait()
            return True
        return False
