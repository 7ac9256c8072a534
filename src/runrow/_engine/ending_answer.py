"""What the ending writer keeps per ending: the once-only answer to the run, and the
hand-over record (see ``ending.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from .._gateway.endings import Ending
    from .roster import ActiveRun

# Failures a finalize retries: the write may or may not have landed; the fence makes a
# second attempt safe either way (and one that matches nothing reads back whose ending
# was recorded).
TRANSIENT = (psycopg.OperationalError, OSError, TimeoutError)


class OutOfTime(Exception):
    """No attempt of an ending landed within its budget."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no attempt landed within finalize_timeout ({seconds}s)")


class Answer:
    """A run's ending is answered once (landed or not), by whichever comes first: the
    writer, a retry, or the budget timer; later answers are ignored. ``deadline`` is
    when the budget ends (loop time); ``sent`` is true while an attempt is with the
    server and not yet answered; ``recorded`` is the status the database recorded (the
    one asked for, unless a stop turned a failure or a park into ``cancelled``)."""

    __slots__ = ("answered", "deadline", "done", "recorded", "sent", "timer")

    def __init__(self, done: Callable[[str | None], None], deadline: float, status: str) -> None:
        self.done = done
        self.deadline = deadline
        self.recorded = status
        self.answered = False
        self.sent = False
        self.timer: asyncio.TimerHandle | None = None

    def __call__(self, landed: bool) -> None:
        """Answers the run: ``done(status recorded)``, or ``done(None)`` if it did not land."""
        if not self.answered:
            self.answered = True
            if self.timer is not None:
                self.timer.cancel()
            self.done(self.recorded if landed else None)


class Handed:
    """An ending with the writer, and who to answer; ``slot`` is the run whose slot rides
    with it until its first attempt is sent (then it is claimed for, or freed)."""

    __slots__ = ("answer", "ending", "slot")

    def __init__(self, ending: Ending, answer: Answer, slot: ActiveRun | None) -> None:
        self.ending = ending
        self.answer = answer
        self.slot = slot
