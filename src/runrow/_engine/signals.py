"""Test signals: named points of the engine a test can wait for, instead of sleeping.

A dispatcher carries none in production (each point costs one ``is None`` test). A
test attaches a :class:`Signals` before it starts the dispatcher
(``runrow.testing.signals(dispatcher)``), then waits for what it needs::

    signals = testing.signals(d)
    async with d:
        run = await enqueue(...)
        await signals.ended.wait(lambda e: e.run_id == run.run_id)

Each signal keeps every value it was fired with, so a wait that starts late still
sees what happened before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

import anyio

from .. import _aio

if TYPE_CHECKING:
    import uuid
    from collections.abc import Callable

T = TypeVar("T")


class Ended(NamedTuple):
    """A run's ending was answered: the status recorded (None: none was)."""

    run_id: uuid.UUID
    recorded: str | None


class Signal(Generic[T]):
    """One named point: fired by the engine, waited for by a test."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[T] = []
        self._changed = _aio.Event()

    def fire(self, value: T) -> None:
        """Called by the engine at this point."""
        self.seen.append(value)
        changed, self._changed = self._changed, _aio.Event()
        changed.set()

    async def wait(self, match: Callable[[T], bool] | None = None, *, timeout: float = 10.0) -> T:
        """The first value fired here (ever) that ``match`` accepts (any, without
        ``match``), waiting up to ``timeout`` seconds for it."""
        checked = 0
        with anyio.fail_after(timeout):
            while True:
                for value in self.seen[checked:]:
                    if match is None or match(value):
                        return value
                checked = len(self.seen)
                await self._changed.wait()

    def __repr__(self) -> str:
        return f"<Signal {self.name}: fired {len(self.seen)} time(s)>"


class Signals:
    """The points a test can wait for: a claim took runs (``claimed``: their ids, one
    value per claim, the loop's or one made with endings), a reaper pass ended runs
    (``reaped``: their ids, one value per pass that ended any), a run's ending was
    answered (``ended``: :class:`Ended`)."""

    def __init__(self) -> None:
        self.claimed: Signal[list[uuid.UUID]] = Signal("claimed")
        self.reaped: Signal[list[uuid.UUID]] = Signal("reaped")
        self.ended: Signal[Ended] = Signal("ended")
