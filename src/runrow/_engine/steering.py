"""Steering (#41 point 6): a running turn reads the messages sent to its conversation with
``enqueue(on_busy="steer")``, at a point of its choosing (``RunContext.steering``).

A delivery is a step of the run (key ``runrow.steering``, numbered like any step): one
fenced statement (``steer_deliver``) absorbs the steerable turns that follow the running
one, moves their messages into its turn and records which it delivered. A replay (a run
resumed after a wait, a retry of the turn) gets the recorded delivery back at the same
place and absorbs nothing there; a steerable turn no delivery took runs as a turn of its
own. Each delivered message is journaled as ``steering_delivered`` (not again by a
resumed run's replay: its journal is muted up to where it paused).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import anyio

from .._db import statement_conn
from .._errors import LeaseLost
from .._events import STEERING_DELIVERED
from .._gateway import steering as _gw
from .._gateway._exec import Plan, run
from .._models import SteeringMessage

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Generator

    from .flight import ActiveRun, RunHost
    from .journal_writer import JournalWriter
    from .steps import Steps

STEERING = "runrow.steering"
"""The step key of a delivery (its n-th occurrence: the turn's n-th ``steering()``)."""

MAX_PER_DELIVERY = 100
"""The most messages one delivery takes; the rest wait for the next (or run as a turn)."""


class Steering:
    """A run's deliveries: the messages they delivered (a resumed run's transcript keeps
    them in its replay) and the fenced statement that makes each."""

    def __init__(self, host: RunHost, run: ActiveRun, journal: JournalWriter, book: Callable[[], Steps]):
        self._host = host
        self._run = run
        self._journal = journal
        self._book = book
        self.delivered: set[uuid.UUID] = set()

    async def take(self) -> list[SteeringMessage]:
        """One delivery: the messages it delivered (on a replay, the recorded ones)."""
        book = self._book()
        position, occurrence = book.number(STEERING)
        prior = await book.replayed(STEERING, occurrence, position)
        if prior is not None:
            found = await book.retrying(lambda: self._alone(_gw.read(self._schema, ids=prior.result)))
        else:
            await book.records.flushed()  # (its own transaction: after the records handed over)
            token = await book.begin(STEERING)
            try:
                # Shielded: a stop cutting it short would leave unknown what it absorbed;
                # sent again after a lost answer, it returns the delivery it recorded.
                with anyio.CancelScope(shield=True):
                    found = await book.retrying(lambda: self._alone(self._deliver(occurrence, position)))
            finally:
                book.settled(token)
            if found is None:
                self._host.lost(self._run.id)
                raise LeaseLost(self._run.id)
        messages = messages_of(found)
        for m in messages:
            self.delivered.add(m.message_id)
            await self._journal.journal(
                STEERING_DELIVERED,
                {
                    "message_id": str(m.message_id),
                    "run_id": str(m.run_id),
                    "content": m.content,
                    "user_id": m.user_id,
                },
            )
        return messages

    @property
    def _schema(self) -> str:
        return self._host.settings.schema

    def _deliver(self, occurrence: int, position: int) -> Plan[list[dict[str, Any]] | None]:
        return _gw.deliver(
            self._schema,
            run_id=self._run.id,
            claim_token=self._run.token,
            key=STEERING,
            occurrence=occurrence,
            position=position,
            limit=MAX_PER_DELIVERY,
            channels=self._host.settings.channels,
        )

    async def _alone(self, plan: Plan[Any]) -> Any:
        # (Its own transaction, not the step writer's shared one: it locks the run's row
        # and the turns it absorbs, and a stop holding them must delay no other run's writes.)
        async with statement_conn(
            self._host.pool(), idle_seconds=self._host.settings.tx_idle_seconds
        ) as conn:
            return await run(conn, plan)


def messages_of(found: list[dict[str, Any]]) -> list[SteeringMessage]:
    """A delivery's messages as its statement answers them (JSON), in order."""
    return [
        SteeringMessage(uuid.UUID(m["message_id"]), uuid.UUID(m["run_id"]), m["content"], m["user_id"])
        for m in found
    ]


class Delivery:
    """What ``RunContext.steering()`` returns: await it for the list of messages, or
    iterate it (``async for``). Either way it makes one delivery, once."""

    __slots__ = ("_result", "_take")

    def __init__(self, take: Callable[[], Any]) -> None:
        self._take = take
        self._result: list[SteeringMessage] | None = None

    async def _messages(self) -> list[SteeringMessage]:
        if self._result is None:
            self._result = await self._take()
        return self._result

    def __await__(self) -> Generator[Any, None, list[SteeringMessage]]:
        return self._messages().__await__()

    async def __aiter__(self) -> AsyncIterator[SteeringMessage]:
        for message in await self._messages():
            yield message
