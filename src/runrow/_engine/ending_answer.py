"""What the ending writer keeps per ending: the once-only answer to the run, and the
hand-over record (see ``ending.py``)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import psycopg

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from .._gateway.endings import Ending
    from .flight import ActiveRun

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
    writer, a retry, or the budget clock; later answers are ignored. ``deadline`` is
    when the budget ends (loop time); ``sent`` is true while an attempt is with the
    server and not yet answered; ``recorded`` is the status the database recorded (the
    one asked for, unless a stop turned a failure or a park into ``cancelled``);
    ``run`` is the run, until it is answered."""

    __slots__ = ("answered", "deadline", "done", "recorded", "run", "sent")

    def __init__(
        self, done: Callable[[str | None], None], deadline: float, status: str, run: ActiveRun
    ) -> None:
        self.done: Callable[[str | None], None] | None = done
        self.deadline = deadline
        self.recorded = status
        self.answered = False
        self.sent = False
        self.run: ActiveRun | None = run

    def __call__(self, landed: bool) -> None:
        """Answers the run: ``done(status recorded)``, or ``done(None)`` if it did not land."""
        if not self.answered:
            self.answered = True
            done, self.done, self.run = self.done, None, None  # (kept by the clock a while)
            assert done is not None
            done(self.recorded if landed else None)


class BudgetClock:
    """Answers the endings whose budget ran out, with one loop timer for all of them.

    Every ending has the same budget and the loop's clock only moves forward, so
    deadlines come in hand-over order: the clock keeps the endings in that order and
    its one timer is set for the oldest unanswered one. An ending answered in time
    (nearly all) costs an append and, later, a pop; a loop timer per ending cost a
    timer and its cancellation per run."""

    def __init__(self, expire: Callable[[Answer], None]) -> None:
        self._expire = expire
        self._queue: deque[Answer] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, loop: asyncio.AbstractEventLoop, answer: Answer) -> None:
        """Watches ``answer``'s deadline (later than every one added before it)."""
        queue = self._queue
        while queue and queue[0].answered:
            queue.popleft()
        queue.append(answer)
        if self._timer is None:
            self._timer = loop.call_at(queue[0].deadline, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        queue, now = self._queue, loop.time()
        while queue and (queue[0].answered or queue[0].deadline <= now):
            answer = queue.popleft()
            if not answer.answered:
                self._expire(answer)
        while queue and queue[0].answered:
            queue.popleft()
        if queue:
            self._timer = loop.call_at(queue[0].deadline, self._fire, loop)


class Handed:
    """An ending with the writer, and who to answer; ``slot`` is the run whose slot rides
    with it until its first attempt is sent (then it is claimed for, or freed)."""

    __slots__ = ("answer", "ending", "slot")

    def __init__(self, ending: Ending, answer: Answer, slot: ActiveRun | None) -> None:
        self.ending = ending
        self.answer = answer
        self.slot = slot
