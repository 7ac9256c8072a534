"""What a drain did with the runs in flight (the report of ``Dispatcher.stop``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import uuid

__all__ = ["DrainReport"]


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What :meth:`Dispatcher.stop` did with the runs in flight when it was called."""

    finished: list[uuid.UUID] = field(default_factory=list)
    """Runs that reached a terminal state during the drain budget."""
    interrupted: list[uuid.UUID] = field(default_factory=list)
    """Runs cancelled when the budget ran out and recorded ``failed`` (worker_shutdown)."""
    left_for_reaper: list[uuid.UUID] = field(default_factory=list)
    """Runs whose ending could not be recorded; the reaper fails them after lease + grace."""
