"""Replay rules: how a turn's calls match what earlier passes of its lineage recorded.

Shared by the step book of a running attempt and by ``runrow check`` (which replays
waiting runs against new code without writing), so both find the same mismatches.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .._errors import StepFailed, StepMismatch

if TYPE_CHECKING:
    import uuid
    from collections.abc import Iterable

    from .._gateway.steps import StepRecord

MARKER = "changed:"
"""The key prefix of a change marker's record (``RunContext.changed``)."""


class Recorded:
    """A lineage's recorded calls, by position and by (key, occurrence)."""

    def __init__(self, run_id: uuid.UUID, records: Iterable[StepRecord]) -> None:
        self.run_id = run_id
        self.by_position = {r.position: r for r in records}
        self.by_key = {(r.key, r.occurrence): r for r in self.by_position.values()}
        self.last = max(self.by_position, default=-1)

    def match(self, key: str, occurrence: int, position: int) -> StepRecord | None:
        """What an earlier pass left for this call (None: nothing), or StepMismatch."""
        if not self.by_key:
            return None
        there = self.by_position.get(position)
        prior = self.by_key.get((key, occurrence))
        if there is not None and there is not prior:
            raise StepMismatch(self.run_id, position, key, there.key)
        if prior is not None and there is None:
            raise StepMismatch(self.run_id, position, key, None)
        return prior

    def marker(self, key: str, position: int) -> bool | None:
        """A change marker's answer at ``position``: its record (True); False when the
        lineage recorded calls at or past ``position`` without it (the run started before
        the change, and its recorded calls keep their places: the marker takes none);
        None when nothing is recorded there yet (the new path is safe: record it)."""
        if (key, 0) in self.by_key:
            prior = self.match(key, 0, position)
            assert prior is not None
            if prior.input:
                raise StepMismatch(self.run_id, position, key, f"{prior.key} (an input, not a marker)")
            return prior.result is True
        if position <= self.last:
            return False
        return None


def rebuilt(key: str, error: dict[str, Any]) -> Exception:
    """The error a step raised, rebuilt from its record: the same type and message when
    the type is loaded here and takes its message back, else :class:`StepFailed`."""
    message, type_name = str(error.get("message", "")), str(error.get("type", "Exception"))
    # Only from modules already imported: a replay never imports code.
    target: Any = sys.modules.get(str(error.get("module", "")))
    for part in type_name.split("."):
        target = getattr(target, part, None)
    if isinstance(target, type) and issubclass(target, Exception):
        try:
            exc = target(message)
        except Exception:
            exc = None
        if exc is not None and str(exc) == message:
            return exc
    return StepFailed(key, type_name, message)
