"""RunContext: what the host's agent callable gets for one claimed run."""

from __future__ import annotations

import functools
import logging
import uuid
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, overload

import anyio

from .. import _json
from .._db import statement_conn
from .._errors import InvalidInput, LeaseLost
from .._events import CONTENT_DELTA
from .._gateway import messages, reads
from .._gateway._exec import run
from .._usage_check import usage_payload
from .message_write import write_resolving
from .steering import Delivery, Steering
from .steps import Steps
from .tree import Family

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence
    from datetime import datetime

    from .._gateway.journal import Appended
    from .._models import ChildResult, Message
    from .flight import ActiveRun, RunHost
    from .journal_writer import JournalWriter

__all__ = ["Agent", "RunContext"]

log = logging.getLogger("runrow.run")

P = ParamSpec("P")
T = TypeVar("T")


class RunContext:
    """The agent's handle on its run: identity, input, journal and transcript.

    Every write through it is fenced by the claim: once the run is reaped, stopped
    or otherwise no longer this worker's, writes raise :class:`LeaseLost` and the
    dispatcher stops the agent. Cancellation (a stop, a drain) arrives as anyio
    cancellation at the agent's next ``await``; ``cancel_requested`` tells why.
    """

    def __init__(self, host: RunHost, run: ActiveRun, journal: JournalWriter) -> None:
        self._host = host
        self._run = run
        self._journal = journal
        row = run.row
        self.run_id: uuid.UUID = row.id
        self.conversation_id: str = row.conversation_id
        self.user_id: str = row.user_id
        self.tenant_id: str | None = row.tenant_id
        self.request: Any = row.request
        """The request snapshot given to ``enqueue`` (None once trimmed)."""
        self.content: Any = row.content
        """The user message this turn answers."""
        self.user_message_id: uuid.UUID = row.user_message_id
        self.started_at: datetime = row.started_at
        self.worker_id: str = host.settings.worker_id
        self.attempt: int = row.attempt
        """Which attempt of its turn this run is: 1, then one more per retry."""
        self.resumes: int = row.resumes
        """How many times input resumed this run (0 until it has waited for input)."""
        # (Made at once for a resumed run: its journal is muted until its replay passes its pause.)
        self._steps: Steps | None = Steps(host, run, journal) if row.resumes else None
        self._messages = 0  # write_message calls: the n-th call's id is fixed (see there)
        self._tree: Family | None = None  # (made at its first spawn or wait)
        self._steering: Steering | None = None  # (made at its first delivery)

    @property
    def cancel_requested(self) -> bool:
        """True once a stop was requested for this run (the agent is being cancelled)."""
        return self._run.stop_requested

    def __repr__(self) -> str:
        return f"<RunContext run_id={self.run_id} conversation_id={self.conversation_id!r}>"

    async def emit(self, event: Mapping[str, Any]) -> None:
        """Journals an event (a mapping with a string ``type``).

        ``content_delta`` events (``{"type": "content_delta", "delta": "..."}``, plus an
        optional ``stream``) are merged and flushed on the dispatcher's flush clock;
        any other type flushes pending text and is written at once. A type is an
        identifier (an ASCII letter, then ASCII letters, digits, ``_``, ``.``, ``:`` or
        ``-``; at most 64 characters). Raises :class:`InvalidInput` for events that are
        not JSON, have any other type or use a reserved one; nothing is written then.
        """
        await self._journal.emit(event)

    async def text(self, delta: str, *, stream: str | None = None) -> None:
        """Shorthand for emitting a ``content_delta``."""
        event: dict[str, Any] = {"type": CONTENT_DELTA, "delta": delta}
        await self._journal.emit(event if stream is None else {**event, "stream": stream})

    async def flush(self) -> None:
        """Writes merged text (and recorded usage) now instead of waiting for the flush clock."""
        await self._journal.flush()

    def record_usage(self, *, input_tokens: int = 0, output_tokens: int = 0, cost: float = 0.0) -> None:
        """Records a model call's usage: a ``usage`` event riding the run's next journal write
        (docs/howto/usage.md). :class:`InvalidInput` names a negative, non-finite or absurd field."""
        self._journal.record_usage(usage_payload(input_tokens, output_tokens, cost))

    async def write_message(self, content: Any, *, role: str = "assistant") -> uuid.UUID:
        """Appends a message to the conversation's durable transcript (fenced).

        Text streamed so far counts as written: it will not also be saved as a
        partial answer if the run is then cut short. A stop arriving meanwhile takes
        effect at the agent's next ``await``, once the write is known to have landed
        or not. If the connection fails without an answer, the write is read back
        (its id is made here) and retried only if it did not land; a write whose
        outcome stays unknown past the retry budget (half the lease) raises the
        connection error.
        """
        if role not in ("assistant", "tool", "system"):
            raise InvalidInput("role", "must be 'assistant', 'tool' or 'system'")
        body = _json.dumps(content, "content", self._host.settings.max_event_bytes)
        # The n-th message of the turn has the same id on every pass and every attempt: a
        # resumed run's replay gets back the id of the message it wrote before it paused,
        # and a retry whose earlier attempt wrote it before dying finds it written (the
        # turn's answer is in the transcript once).
        message_id = self._message_id(self._messages)
        self._messages += 1
        if self._journal.muted:
            return message_id
        if (steps := self._steps) is not None and steps.records.failed:
            await steps.records.flushed()  # (a step's record to send again goes first)
        mark = self._journal.answer_mark()
        params: dict[str, Any] = {
            "message_id": message_id,
            "run_id": self.run_id,
            "claim_token": self._run.token,
            "role": role,
            "content": body,
        }
        s = self._host.settings

        def write(pending: Appended) -> Awaitable[bool]:
            # The text streamed before it rides the message's statement (one commit).
            if not pending.events:
                return write_resolving(self._host, self._run, params)
            with_text = functools.partial(
                messages.write_after_events,
                s.schema,
                pending,
                channels=s.channels,
                notify=s.journal_notify,
                message=params,
            )
            read_back = functools.partial(
                messages.rows_landed,
                s.schema,
                run_id=self.run_id,
                claim_token=self._run.token,
                seqs=[row[0] for row in pending.events],
            )
            return write_resolving(self._host, self._run, params, with_text, read_back)

        # Shielded: a stop cutting the write short would leave its outcome unknown, and
        # the ending would then save the streamed text again as a partial answer.
        with anyio.CancelScope(shield=True):
            landed = await self._journal.riding(write)
            if landed:
                self._journal.answer_taken(mark)
        if not landed:
            self._host.lost(self.run_id)
            raise LeaseLost(self.run_id)
        return message_id

    @overload
    async def step(
        self, key: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...
    @overload
    async def step(self, key: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...
    async def step(self, key: str, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Runs ``fn(*args, **kwargs)`` (sync or async) at most once per turn, and
        returns its result, whose record (fenced by the claim) commits before anything
        the run writes after this call: with the next step's begun marker or earlier,
        and before any later event, message or ending (see the guarantees page). A
        claim lost meanwhile stops the agent at its next ``await``.

        On a retry of the turn (:func:`runrow.retry_run`, or a ``RetryPolicy``'s) the
        agent runs from the top and each step the earlier attempts recorded returns its
        recorded result without calling ``fn``; a step that raised raises the same error
        type and message again (or :class:`~runrow.StepFailed`). A step is named by
        ``key`` and by how many calls with that key came before it in the turn, so steps
        in a loop can share a key; steps running at the same time need keys of their
        own. The code between steps must be deterministic: a retry that calls its steps
        in another order raises :class:`~runrow.StepMismatch`.

        The step is marked begun before ``fn`` runs. If its worker dies before the
        outcome is recorded, the step is uncertain: a retry raises
        :class:`~runrow.StepUncertain` rather than run it twice (use
        :meth:`idempotent_step` for calls that are safe to repeat). The result must be
        JSON-serialisable, at most 1 MiB; the value returned is the result as PostgreSQL's
        jsonb keeps it (a tuple comes back a list; object keys in jsonb's order), on the
        first attempt as on a replay.
        """
        return await self._book().run(key, fn, args, kwargs, idempotent=False)

    @overload
    async def idempotent_step(
        self, key: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...
    @overload
    async def idempotent_step(
        self, key: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...
    async def idempotent_step(
        self, key: str, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> Any:
        """:meth:`step` for a call that is safe to repeat (a read, a model call, a write
        keyed by an idempotency key): it is not marked begun before it runs (one write,
        not two); if its worker dies before it is recorded, or it raises (the error is
        not recorded), a retry calls it again."""
        return await self._book().run(key, fn, args, kwargs, idempotent=True)

    async def wait_for_input(self, key: str, request: Any = None, *, timeout: float | None = None) -> Any:
        """Waits for a person's input (an approval, an answer) and returns it: the value
        a host recorded with :func:`runrow.provide_input` for this run and ``key``.

        The first time, the input is marked waiting (fenced by the claim), and the run
        parks: once the turn's steps running beside this call (parallel tool calls) have
        recorded their outcomes (at most half the lease; no step begins meanwhile, and
        other waits are marked waiting too), the agent is cancelled here (let the
        cancellation propagate), text it streamed so far is kept as a message, an
        ``input_requested`` event with
        ``request`` (any JSON value, for the host's page) ends its journal for now, and
        the run's status becomes ``waiting``. It holds no slot and no lease, and its
        conversation's later turns wait behind it. ``provide_input`` queues it again;
        a worker (any process, after any restart) claims it and calls the agent from
        the top: steps recorded before return their results, what the agent emits or
        writes before this call is dropped (it is in the journal already), and this
        call returns the value; the journal goes on from the next seq.

        ``key`` names the input within the turn: one key per question (e.g. a tool
        call's id); a second wait under a key already used (by a wait or a step) in the
        turn raises :class:`~runrow.InvalidInput`. ``timeout`` (seconds)
        ends the wait: the run is then ``expired``. A stop cancels a waiting run at once.
        The code before the call must be deterministic (as between steps).
        """
        return await self._book().wait(key, request, timeout)

    async def changed(self, name: str) -> bool:
        """Did this run start after change ``name`` was deployed? Branch on it to change
        the steps of an agent that has runs in flight (waiting, or to be retried).

        The first time a turn asks, the answer is recorded like a step (key
        ``changed:<name>``): True for a fresh run, and a replay of that run gets True
        again. A run whose earlier passes recorded calls past this point without the
        marker (old code parked or failed it) gets False, takes no step position, and
        so replays its recorded steps on the old path without a
        :class:`~runrow.StepMismatch`. A run whose recorded calls end before this point
        gets True: nothing it recorded depends on the old path. Asked again in the
        turn, the same answer. Ask it from the turn's main line, not while steps start
        beside it. Remove the call (keeping the new path) once no run that asked it can
        still be resumed or retried.
        """
        return await self._book().changed(name)

    async def spawn(
        self, agent_key: str | None, content: Any, *, request: Any = None, key: str | None = None
    ) -> uuid.UUID:
        """Starts a child run of agent ``agent_key`` (one this Dispatcher serves; None: its
        default agent) on ``content`` and returns its id.

        The child runs in a conversation of its own (siblings run in parallel) with this
        run's user, tenant, priority and deadline, and carries ``parent_run_id`` and
        ``root_run_id``. The spawn is a step (key ``spawn:<key>``, ``key`` defaulting to
        the agent key): a replay or a retry of this turn gets the same child back, never a
        second one. Raises :class:`~runrow.InvalidInput` for a key not served,
        :class:`~runrow.SpawnLimitExceeded` past ``max_spawn_depth`` / ``max_children``,
        :class:`LeaseLost` if this run's claim is gone.
        """
        found = await self._family().spawn_many(
            [(agent_key, content, request)], key or agent_key or "default"
        )
        return found[0]

    async def spawn_many(
        self, children: Sequence[tuple[Any, ...]], *, key: str = "children"
    ) -> list[uuid.UUID]:
        """Starts several children in one transaction and one step (see :meth:`spawn`):
        ``children`` are ``(agent_key, content)`` or ``(agent_key, content, request)``
        tuples; returns their ids, in that order."""
        return await self._family().spawn_many(children, key)

    async def wait_for_children(
        self, children: Sequence[uuid.UUID | str], *, first: bool = False
    ) -> list[ChildResult]:
        """Waits until the children named (ids :meth:`spawn` returned) have ended (with
        ``first``, until one has) and returns how each stands, in that order: read
        ``ChildResult.get()`` for a child's answer, or its failure as
        :class:`~runrow.ChildFailed` / :class:`~runrow.ChildCancelled`.

        If they have not ended, the run parks as :meth:`wait_for_input` does (no slot, no
        lease; the agent is cancelled here), journaling ``children_awaited``; the ending
        that completes the wait queues it again, in its own transaction, and the resumed
        run replays to here. The outcomes are recorded as a step: a replay gets the same.
        """
        return await self._family().wait(children, first)

    async def wait_for_child(self, child: uuid.UUID | str) -> Any:
        """Waits for one child (see :meth:`wait_for_children`) and returns its answer, or
        raises :class:`~runrow.ChildFailed` / :class:`~runrow.ChildCancelled`."""
        (result,) = await self._family().wait([child], False)
        return result.get()

    def steering(self) -> Delivery:
        """Delivers the steering messages sent to this conversation since the turn began
        (``enqueue(on_busy="steer")``) that no delivery took yet, in the order they were
        sent: ``for msg in await run.steering()`` or ``async for msg in run.steering()``
        (:class:`~runrow.SteeringMessage`). Call it where the agent can take them in (a
        step boundary: between model calls, after a tool call).

        Each call is one delivery, a step of the turn (fenced by the claim, one statement):
        the messages' turns end ``absorbed`` into this run, their messages move into this
        turn's transcript at this point, each is journaled as ``steering_delivered``, and
        the delivery is recorded. A replay (a resumed run, a retry) gets the same messages
        at the same call, and absorbs nothing there; an empty delivery is recorded too. A
        steering message no delivery took runs as a turn of its own when this one ends.
        Raises :class:`LeaseLost` if this run's claim is gone."""
        if self._steering is None:
            self._steering = Steering(self._host, self._run, self._journal, self._book)
        return Delivery(self._steering.take)

    def _family(self) -> Family:
        if self._tree is None:
            self._tree = Family(self._host, self._run, self._book)
        return self._tree

    def handing_steps(self) -> Steps | None:
        """The step book, if a step's record may still be on its way: the executor
        waits for it before the ending (see HandedRecords.flushed)."""
        steps = self._steps
        return steps if steps is not None and steps.records.handing else None

    def _book(self) -> Steps:
        if self._steps is None:
            self._steps = Steps(self._host, self._run, self._journal)
        return self._steps

    async def transcript(self) -> list[Message]:
        """The conversation up to and including this run's turn (drafts excluded), in turn order.

        Each earlier turn's question is followed by its answers, whenever they were
        written; turns enqueued after this one are not included (they are not this
        run's to answer). A retry reads the conversation as of the turn it retries. A
        resumed run, replaying up to the input it paused on, reads it without the
        messages it wrote (or the text it streamed) after that point of its first pass.
        """
        async with statement_conn(
            self._host.pool(), idle_seconds=self._host.settings.tx_idle_seconds
        ) as conn:
            found = await run(
                conn,
                reads.transcript(
                    self._host.settings.schema, conversation_id=self.conversation_id, run_id=self.run_id
                ),
            )
        if not self._journal.muted:
            return found
        # A resumed run's replay reads the transcript as its first pass did at this point:
        # without what this run wrote later (before it paused), whatever is there now.
        written = {self._message_id(i) for i in range(self._messages)}
        written.add(self.user_message_id)
        written |= self._steering.delivered if self._steering is not None else set()
        return [m for m in found if m.run_id != self.run_id or m.id in written]

    def _message_id(self, n: int) -> uuid.UUID:
        """The id of the turn's n-th message: the same on every pass of a resumed run and
        on every attempt of a retried turn (named after its first attempt's id)."""
        return uuid.uuid5(self._run.row.lineage_id or self.run_id, f"message:{n}")


class Agent(Protocol):
    """The host's agent loop: ``async def agent(run: RunContext) -> None``.

    Returning means ``completed``; raising means ``failed`` (the error's type and
    message are stored and journaled); being cancelled by a stop means ``cancelled``.
    """

    def __call__(self, run: RunContext, /) -> Awaitable[None]: ...
