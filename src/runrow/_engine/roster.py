"""The runs one dispatcher holds, its slots, and the wake-up its claimer waits on.

The roster is the only writer of an :class:`~.flight.ActiveRun`: everything that starts,
cuts, hands over or lets go of a run goes through its methods, so a run's phase, its
reason, the slot count, the idle signal and the claimer's wake-up stay in step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from .. import _aio
from .flight import ActiveRun, outranks

if TYPE_CHECKING:
    import uuid

    from .._gateway.claims import ClaimedRun
    from .flight import Park, Reason
    from .journal_writer import JournalWriter


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


class Roster:
    """The runs in flight, by id, and the slots that bound them (the runs' only writer)."""

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

    # -- a run's life, in order ---------------------------------------------------------

    def take(self, claimed: list[ClaimedRun], lease: float) -> list[ActiveRun]:
        """Makes the claimed runs this process's (called right after the claim, with no
        await in between: nothing can run between the claim's answer and this). A run
        stopped before it was claimed is cancelled at once: its agent is never called."""
        if claimed and self._idle.is_set():
            self._idle = anyio.Event()
        deadline = _aio.now() + lease
        taken = []
        for row in claimed:
            active = self.runs[row.id] = ActiveRun(row, deadline)
            if row.cancel_requested:
                self.cancel(active, "cancel")
            taken.append(active)
        return taken

    def attach(self, active: ActiveRun, journal: JournalWriter) -> None:
        """The run's journal writer (made when its task starts)."""
        active.journal = journal

    def finishing(self, active: ActiveRun) -> None:
        """The run's agent is done: its ending is being made (no cut reaches it now)."""
        active.phase = "finishing"

    def handed_over(self, active: ActiveRun) -> None:
        """The run's ending is with the ending writer, which releases the run."""
        active.phase = "handed_over"

    def free_slot(self, active: ActiveRun) -> None:
        """The run's agent is done: its slot can take the next run (idempotent)."""
        if not active.slot_freed:
            active.slot_freed = True
            self.slots.release()
            self.waker.set()

    def pass_slots(self, riders: list[ActiveRun]) -> None:
        """The slots of ``riders`` passed to runs claimed with their endings (the claimer
        gives back those no run took): none is freed again."""
        for active in riders:
            active.slot_freed = True

    def release(self, active: ActiveRun) -> None:
        """The run is done with, ending written or not: forget it (idempotent).

        Only this claim of the run is forgotten: a run that parked for input can be
        resumed and claimed again, by this process too, before its park's answer is
        processed, and the new claim is another ActiveRun under the same id."""
        active.phase = "released"
        if self.runs.get(active.id) is active:
            del self.runs[active.id]
        self.free_slot(active)
        self.waker.set()  # this conversation's next turn may be ready
        if not self.runs:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Returns once no run is in flight."""
        await self._idle.wait()

    # -- cutting a run short ------------------------------------------------------------

    def cancel(self, active: ActiveRun, reason: Reason) -> None:
        """Cancels the run's agent for ``reason`` (see ``flight.outranks`` for which
        reason stands when several arrive)."""
        if outranks(reason, active.reason):
            active.reason = reason
        if reason == "cancel":
            active.stop_requested = True
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

    def renewed(self, active: ActiveRun, deadline: float) -> None:
        """A heartbeat rolled the run's lease: it lives until ``deadline`` (monotonic)."""
        active.lease_deadline = deadline
