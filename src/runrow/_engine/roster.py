"""The runs one dispatcher holds, its slots, and the wake-up its claimer waits on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import anyio

from .. import _aio

if TYPE_CHECKING:
    import uuid

    from .._gateway.claims import ClaimedRun
    from .context import RunContext
    from .journal_writer import JournalWriter

Reason = Literal["cancel", "drain", "lost", "deadline", "park"]
"""Why runrow cancelled a run's agent: a stop, a drain, a lost claim, its deadline, or
the agent's own wait for input (it parks)."""


class Park(NamedTuple):
    """The input a parking run waits for: its key, the agent's request (JSON-able), how
    long the wait may last (None: no limit), and the id the text streamed before it is
    kept under (the same on every attempt of the turn)."""

    key: str
    request: Any
    timeout: float | None
    message_id: uuid.UUID | None = None


class Waker:
    """A level-triggered wake-up: set() from anywhere, wait(timeout) in the claim loop."""

    def __init__(self) -> None:
        self._event = _aio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = _aio.Event()

    async def wait(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self._event.wait()
        self.clear()


class ActiveRun:
    """One claimed run in this process."""

    __slots__ = (
        "ctx",
        "finishing",
        "handed_over",
        "id",
        "journal",
        "lease_deadline",
        "park",
        "reason",
        "scope",
        "slot_freed",
        "token",
    )

    def __init__(self, run_id: uuid.UUID, token: uuid.UUID, lease_deadline: float) -> None:
        self.id = run_id
        self.token = token
        self.scope = anyio.CancelScope()
        self.reason: Reason | None = None
        self.finishing = False  # its agent is done; its ending is being written
        self.handed_over = False  # its ending is with the ending writer, which releases it
        self.lease_deadline = lease_deadline
        self.journal: JournalWriter | None = None
        self.ctx: RunContext | None = None
        self.slot_freed = False
        self.park: Park | None = None  # set when the agent parks to wait for input


class Roster:
    """The runs in flight, by id, and the slots that bound them.

    Everything that starts, cancels or lets go of a run goes through here, so the slot
    count, the idle signal and the claimer's wake-up stay in step.
    """

    def __init__(self, concurrency: int) -> None:
        self.runs: dict[uuid.UUID, ActiveRun] = {}
        # Fast: taking a free slot costs no trip round the event loop (the claim that
        # follows yields anyway).
        self.slots = anyio.Semaphore(concurrency, fast_acquire=True)
        self.waker = Waker()
        self.unrecorded: set[uuid.UUID] = set()
        """Runs whose ending this process could not write (the reaper's to end)."""
        self._idle = anyio.Event()
        self._idle.set()

    def take(self, claimed: list[ClaimedRun], lease: float) -> list[ActiveRun]:
        """Makes the claimed runs this process's (called right after the claim, with no
        await in between: nothing can run between the claim's answer and this). A run
        stopped before it was claimed is cancelled at once: its agent is never called."""
        if claimed and self._idle.is_set():
            self._idle = anyio.Event()
        deadline = _aio.now() + lease
        taken = []
        for row in claimed:
            active = self.runs[row.id] = ActiveRun(row.id, row.claim_token, deadline)
            if row.cancel_requested:
                self.cancel(active, "cancel")
            taken.append(active)
        return taken

    def free_slot(self, active: ActiveRun) -> None:
        """The run's agent is done: its slot can take the next run (idempotent)."""
        if not active.slot_freed:
            active.slot_freed = True
            self.slots.release()
            self.waker.set()

    def release(self, active: ActiveRun) -> None:
        """The run is done with, ending written or not: forget it (idempotent).

        Only this claim of the run is forgotten: a run that parked for input can be
        resumed and claimed again, by this process too, before its park's answer is
        processed, and the new claim is another ActiveRun under the same id."""
        if self.runs.get(active.id) is active:
            del self.runs[active.id]
        self.free_slot(active)
        self.waker.set()  # this conversation's next turn may be ready
        if not self.runs:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Returns once no run is in flight."""
        await self._idle.wait()

    def cancel(self, active: ActiveRun, reason: Reason) -> None:
        """Cancels the run's agent for ``reason``."""
        # A lost claim trumps everything (nothing may be written); a stop trumps a drain
        # and a park (the user asked for it: the run ends cancelled); a park trumps a
        # drain (the run waits for input whoever holds it: nothing of it is lost).
        if (
            active.reason is None
            or reason == "lost"
            or (reason == "cancel" and active.reason in ("drain", "park"))
            or (reason == "park" and active.reason == "drain")
        ):
            active.reason = reason
        if reason == "cancel" and active.ctx is not None:
            active.ctx.cancel_requested = True
        active.scope.cancel()

    def park(self, run_id: uuid.UUID, park: Park) -> None:
        """The run's agent waits for input (its input step is marked): cut it short; its
        ending parks the run ``waiting`` (unless a stop or a lost claim comes first)."""
        active = self.runs.get(run_id)
        if active is not None and not active.finishing:
            active.park = park
            self.cancel(active, "park")

    def lost(self, run_id: uuid.UUID) -> None:
        """The run's claim is no longer ours: stop its agent before it writes again."""
        active = self.runs.get(run_id)
        if active is not None and not active.finishing:
            self.cancel(active, "lost")
