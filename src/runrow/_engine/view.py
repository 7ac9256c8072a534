"""RunView: what observers see of a run (read-only; the agent's RunContext stays the agent's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uuid
    from datetime import datetime

    from .._gateway.claims import ClaimedRun

__all__ = ["RunView"]


class RunView:
    """A read-only view of one claimed run, for :class:`~runrow.Observer` hooks: its
    identity and input, as the claim read them. It has no way to write to the run."""

    __slots__ = ("_row", "_worker_id")

    def __init__(self, row: ClaimedRun, worker_id: str) -> None:
        self._row = row
        self._worker_id = worker_id

    def __repr__(self) -> str:
        return f"<RunView run_id={self.run_id} conversation_id={self.conversation_id!r}>"

    @property
    def run_id(self) -> uuid.UUID:
        """The run's id."""
        return self._row.id

    @property
    def conversation_id(self) -> str:
        """The conversation the run answers in."""
        return self._row.conversation_id

    @property
    def user_id(self) -> str:
        """Who asked."""
        return self._row.user_id

    @property
    def tenant_id(self) -> str | None:
        """The run's tenant (None: none)."""
        return self._row.tenant_id

    @property
    def request(self) -> Any:
        """The request snapshot given to ``enqueue``."""
        return self._row.request

    @property
    def content(self) -> Any:
        """The user message the run answers."""
        return self._row.content

    @property
    def user_message_id(self) -> uuid.UUID:
        """The id of that message."""
        return self._row.user_message_id

    @property
    def started_at(self) -> datetime:
        """When the claim took it (the database's clock)."""
        return self._row.started_at

    @property
    def worker_id(self) -> str:
        """The worker running it."""
        return self._worker_id

    @property
    def attempt(self) -> int:
        """Which attempt of its turn it is (1, then one more per retry)."""
        return self._row.attempt

    @property
    def resumes(self) -> int:
        """How many times input resumed it."""
        return self._row.resumes
