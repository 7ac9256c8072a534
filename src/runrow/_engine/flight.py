"""A run in flight: its record, its life, why runrow cuts it, and what that makes its ending.

The vocabulary every part of the engine shares about one claimed run, written once:

* :class:`ActiveRun` is the run's record in this process. Only the roster writes it
  (``tests/test_layout.py`` holds that); the journal writer, the run's context and its
  step book read the same record rather than each keeping a copy of the run's id and
  claim token.
* Its life is one :data:`Phase`; why runrow cut its agent short is one :data:`Reason`,
  with a precedence (:func:`outranks`).
* :func:`ending_for` maps what the agent did and the reason to the ending written, and
  :func:`terminal_reason` to the reason its terminal event carries.
* :class:`RunHost` is what a run's context and step book need of the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import anyio

if TYPE_CHECKING:
    import uuid
    from collections.abc import Callable

    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    from .._gateway._exec import Plan
    from .._gateway.claims import ClaimedRun
    from .._status import RunStatus
    from .journal_writer import JournalWriter
    from .settings import Settings

Reason = Literal["cancel", "drain", "lost", "deadline", "park"]
"""Why runrow cancelled a run's agent: a stop, a drain, a lost claim, its deadline, or
the agent's own wait for input (it parks)."""

Phase = Literal["running", "finishing", "handed_over", "released"]
"""Where a claimed run is in its life here: its agent is ``running`` (or about to be);
its agent is done and its ending is being made (``finishing``); its ending is with the
ending writer, which lets the run go once it is answered (``handed_over``); it is no
longer this process's (``released``)."""

DEADLINE_ERROR: dict[str, str] = {
    "type": "deadline_exceeded",
    "message": "the run was still running past its deadline",
}
SHUTDOWN_ERROR: dict[str, str] = {
    "type": "worker_shutdown",
    "message": "the worker shut down before the run finished",
}


def outranks(new: Reason, old: Reason | None) -> bool:
    """Whether ``new`` replaces ``old`` as the run's reason.

    A lost claim trumps everything (nothing may be written); a stop trumps a drain and
    a park (the user asked for it: the run ends cancelled); a park trumps a drain (the
    run waits for input whoever holds it: nothing of it is lost)."""
    return (
        old is None
        or new == "lost"
        or (new == "cancel" and old in ("drain", "park"))
        or (new == "park" and old == "drain")
    )


class Ending(NamedTuple):
    """What a run's agent amounted to: the status to record (None: write nothing, the
    claim is lost), its error, and whether a retry policy may retry it."""

    status: RunStatus | None
    error: dict[str, Any] | None
    retry: bool


def ending_for(
    reason: Reason | None,
    status: RunStatus | None,
    error: dict[str, Any] | None,
    retry: bool,
    *,
    cut: bool,
    retry_worker_lost: bool,
) -> Ending:
    """The ending of a run whose agent came back with ``status``/``error`` (None: it
    raised nothing runrow records, or was never called) while runrow's ``reason`` (if
    any) stood; ``cut`` says the run's cancel scope caught runrow's cancellation.
    ``retry`` is whether the policy retries the agent's own error; a drain is retried
    only when the policy retries lost workers (``retry_worker_lost``)."""
    if reason == "lost":
        return Ending(None, None, False)
    if reason == "park":
        # The agent waits for input (its input step is marked): the run parks.
        return Ending("waiting", None, False)
    if reason == "cancel" and status == "failed":
        # The agent failed once a stop had reached it (a write the stop cut short, an
        # error of its own): the stop is what the user asked for, and what they see.
        return Ending("cancelled", None, False)
    if cut or (status is None and reason is not None):
        if reason == "cancel":
            return Ending("cancelled", None, False)
        if reason == "drain":
            return Ending("failed", dict(SHUTDOWN_ERROR), retry_worker_lost)
        if reason == "deadline":
            return Ending("failed", dict(DEADLINE_ERROR), False)
    # (An error raised while a stop or the deadline cut the agent is still theirs.)
    return Ending(status, error, retry and status == "failed" and reason not in ("cancel", "deadline"))


def terminal_reason(reason: Reason | None, status: str) -> str | None:
    """The ``reason`` a run's terminal event carries for ``reason`` (None: none)."""
    if reason == "cancel":
        return "stopped"
    if reason == "deadline" and status == "failed":
        return "deadline_exceeded"
    return None


class Park(NamedTuple):
    """The input a parking run waits for: its key, the agent's request (JSON-able), how
    long the wait may last (None: no limit), and the id the text streamed before it is
    kept under (the same on every attempt of the turn)."""

    key: str
    request: Any
    timeout: float | None
    message_id: uuid.UUID | None = None
    awaiting: tuple[uuid.UUID, ...] | None = None
    """A wait for children (``wait_for_children``): the children still going it waits on."""
    await_any: bool = False
    """With ``awaiting``: the first of them to end is enough."""


class ActiveRun:
    """One claimed run in this process: the record its parts share.

    ``row`` is the claimed row (immutable); everything else is written by the roster
    alone, through its methods (see ``roster.py``)."""

    __slots__ = (
        "id",
        "journal",
        "lease_deadline",
        "park",
        "phase",
        "reason",
        "row",
        "scope",
        "slot_freed",
        "stop_requested",
        "token",
    )

    def __init__(self, row: ClaimedRun, lease_deadline: float) -> None:
        self.row = row
        self.id: uuid.UUID = row.id
        self.token: uuid.UUID = row.claim_token
        self.scope = anyio.CancelScope()
        self.phase: Phase = "running"
        self.reason: Reason | None = None
        self.stop_requested = False  # a stop reached it (whatever its reason now)
        self.lease_deadline = lease_deadline
        self.journal: JournalWriter | None = None
        self.slot_freed = False
        self.park: Park | None = None  # set when the agent parks to wait for input

    @property
    def finishing(self) -> bool:
        """Its agent is done: its ending is being made or written (not cut again)."""
        return self.phase != "running"


class RunHost(Protocol):
    """What a run's context and step book need of the engine (a narrow handle, not the
    Dispatcher)."""

    @property
    def settings(self) -> Settings: ...

    def pool(self) -> AsyncConnectionPool[AsyncConnection]:
        """The dispatcher's pool."""
        ...

    def lost(self, run_id: uuid.UUID) -> None:
        """The run's claim is no longer this worker's: stop its agent."""
        ...

    def db_trouble(self) -> None:
        """A statement failed for want of a connection: have the pool checked."""
        ...

    def park(self, run_id: uuid.UUID, park: Park) -> None:
        """The run's agent waits for input: cut it short, and park the run."""
        ...

    async def write_together(self, plan: Callable[[], Plan[Any]]) -> Any:
        """Writes one fenced statement (made by ``plan()``: a step's write, a transcript
        message), its commit shared with other runs' such writes; what it returned."""
        ...

    def hand_over_together(
        self, plan: Callable[[], Plan[Any]], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """Queues a statement as :meth:`write_together` does, without waiting: the writer
        calls ``done(result, None)`` or ``done(None, error)`` when its batch has ended.
        Writes queued later land in the same batch or a later one."""
        ...
