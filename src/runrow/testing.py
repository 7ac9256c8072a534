"""Helpers for testing an agent against a real database: run it, read what it did.

* ``run_agent`` runs one agent on one message in this process (no worker process): it
  enqueues the turn, runs a short-lived :class:`~runrow.Dispatcher` until the run ends,
  and returns an ``AgentResult``: the run's final row, its journal (every event, in
  order) and the conversation's transcript. ``inputs=`` scripts the answers to an agent
  that waits for a person (``run.wait_for_input``), ``children=`` the sub-agents it
  spawns (``run.spawn``).
* ``ScriptedModel`` stands in for a model client: each call to its ``stream`` plays the
  next scripted response, chunk by chunk (text deltas, ``ToolCall`` objects, or any
  object you script).
* ``create_test_schema`` and ``drop_test_schema`` make and remove a freshly migrated
  schema with a random name, so tests do not share state.

The pytest plugin (``runrow.pytest_plugin``) wraps these in fixtures. This module does
not import pytest: the helpers work from any test runner, or a script.
"""

from __future__ import annotations

import copy
import inspect
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from psycopg import AsyncConnection

from ._engine.dispatcher import Dispatcher
from ._enqueue import enqueue
from ._errors import InvalidInput
from ._events import CONTENT_DELTA, INPUT_REQUESTED, Event
from ._gateway import schema as _schema
from ._gateway._exec import run
from ._inputs import provide_input, waiting_inputs
from ._migrate import migrate
from ._names import DEFAULT_SCHEMA
from ._queries import get_run, list_runs, transcript
from ._tail import tail

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from ._engine.context import Agent, RunContext
    from ._engine.signals import Signals
    from ._models import Message, RunInfo
    from ._status import RunStatus

__all__ = [
    "TEST_SCHEMA_PREFIX",
    "AgentResult",
    "InputNotScripted",
    "ScriptExhausted",
    "ScriptedModel",
    "ToolCall",
    "create_test_schema",
    "drop_test_schema",
    "run_agent",
    "signals",
]

TEST_SCHEMA_PREFIX = "runrow_test_"
"""Every schema :func:`~runrow.testing.create_test_schema` makes starts so;
:func:`~runrow.testing.drop_test_schema` drops no other."""


# -- signals ---------------------------------------------------------------------------


def signals(dispatcher: Dispatcher) -> Signals:
    """Named points of ``dispatcher``'s engine a test can wait for instead of sleeping
    or polling: ``claimed`` (the ids each claim took), ``reaped`` (the ids each reaper
    pass ended) and ``ended`` (each run's ending once answered: its id and the status
    recorded, None if none was). Call before the dispatcher starts::

        sig = runrow.testing.signals(d)
        async with d:
            run = await runrow.enqueue(...)
            ended = await sig.ended.wait(lambda e: e.run_id == run.id)
            assert ended.recorded == "completed"

    ``wait(match, timeout=10)`` returns the first value ever fired that ``match``
    accepts, so a wait that starts late still sees it. A dispatcher carries no signals
    unless a test asks for them."""
    from ._engine.signals import Signals

    made = Signals()
    dispatcher._use_signals(made)
    return made


# -- schemas -----------------------------------------------------------------------------


async def create_test_schema(db: str) -> str:
    """Creates a schema with a fresh random name, migrates it, and returns its name."""
    name = f"{TEST_SCHEMA_PREFIX}{uuid.uuid4().hex[:12]}"
    await migrate(db, schema=name)
    return name


async def drop_test_schema(db: str, schema: str) -> None:
    """Drops a schema made by :func:`~runrow.testing.create_test_schema`, with everything in it.

    Raises :class:`~runrow.InvalidInput` for a name that does not start with
    :data:`~runrow.testing.TEST_SCHEMA_PREFIX`: this helper never drops a schema it did not make.
    """
    if not schema.startswith(TEST_SCHEMA_PREFIX):
        raise InvalidInput("schema", f"drop_test_schema drops only schemas named {TEST_SCHEMA_PREFIX}...")
    async with await AsyncConnection.connect(db, autocommit=True) as conn:
        await run(conn, _schema.drop(schema))


# -- running one turn --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentResult:
    """What one run of an agent left in the database (see
    :func:`~runrow.testing.run_agent`)."""

    run: RunInfo
    """The run's row once it ended (``status``, ``error``, timestamps, ...)."""
    events: list[Event]
    """The run's journal, in ``seq`` order: ``user_message_created`` and ``run_queued``
    (written by the enqueue), what the agent emitted, and the terminal ``complete``."""
    transcript: list[Message]
    """The conversation's durable transcript (all its turns so far), in turn order."""
    children: list[RunInfo] = field(default_factory=list)
    """The child runs the agent spawned (``run.spawn``), in spawn order, as they ended."""

    @property
    def status(self) -> RunStatus:
        """How the run ended: ``completed``, ``failed`` or ``cancelled``."""
        return self.run.status

    @property
    def error(self) -> dict[str, Any] | None:
        """A failed run's error (``{"type": ..., "message": ...}``), else None. Its
        traceback is :attr:`traceback` (the row's ``run.error`` holds both)."""
        if self.run.error is None:
            return None
        return {k: v for k, v in self.run.error.items() if k != "traceback"}

    @property
    def traceback(self) -> str | None:
        """The agent's traceback if it raised (the run failed), else None. A failing
        test shows it too: the worker's log line carries it, and pytest prints the
        captured log of a failed test."""
        traceback = (self.run.error or {}).get("traceback")
        return traceback if isinstance(traceback, str) else None

    @property
    def event_types(self) -> list[str]:
        """The journal's event types, in order."""
        return [e.type for e in self.events]

    @property
    def text(self) -> str:
        """The text the agent streamed on the default stream (all its ``content_delta``
        events without a ``stream`` key, joined)."""
        return "".join(
            e.payload["delta"] for e in self.events if e.type == CONTENT_DELTA and "stream" not in e.payload
        )

    def payloads(self, event_type: str) -> list[dict[str, Any]]:
        """The payloads of the journal's events of one type, in order."""
        return [e.payload for e in self.events if e.type == event_type]


class InputNotScripted(AssertionError):
    """The agent waits for an input that ``run_agent``'s ``inputs=`` does not answer.

    ``key`` and ``request`` are the wait's (as ``run.wait_for_input(key, request)`` gave
    them); ``result`` is what the run left so far (its status ``waiting``, its journal
    ending with the ``input_requested`` event)."""

    def __init__(self, key: str, request: Any, result: AgentResult) -> None:
        super().__init__(
            f"run {result.run.id} waits for input {key!r} (request: {request!r}), which inputs= "
            f"does not answer; pass inputs={{{key!r}: ...}} to script the answer"
        )
        self.key = key
        self.request = request
        self.result = result


async def run_agent(
    db: str,
    agent: Agent,
    content: Any,
    *,
    schema: str = DEFAULT_SCHEMA,
    conversation_id: str | None = None,
    user_id: str = "test-user",
    tenant_id: str | None = None,
    request: Any = None,
    inputs: Mapping[str, Any] | None = None,
    children: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
    **dispatcher_options: Any,
) -> AgentResult:
    """Runs ``agent`` on one user message, in this process, and returns what it left.

    It starts a :class:`~runrow.Dispatcher` (one slot) on ``schema``, enqueues
    ``content`` as a turn of ``conversation_id`` (default: a new conversation; pass an
    earlier result's ``run.conversation_id`` for a follow-up turn), reads the run's
    journal until its terminal event, stops the dispatcher and reads the run's row and
    the transcript. A run that fails or is cancelled is returned, not raised: check
    :attr:`~runrow.testing.AgentResult.status` and :attr:`~runrow.testing.AgentResult.error`.

    ``inputs`` scripts a person's answers, by key: each time the run parks waiting for
    an input (``run.wait_for_input(key, request)``), the answer under its key is given
    with :func:`runrow.provide_input`, as a host would, and the run resumes (waits made
    at once are answered one at a time). A wait for a key not in ``inputs`` raises
    :class:`~runrow.testing.InputNotScripted` at once, naming the key; the run is left
    waiting.

    ``children`` scripts sub-agents, by agent key: a child the agent spawns
    (``run.spawn``) under a scripted key runs as a real child run that answers at once
    with its script, and the parent's :meth:`~runrow.ChildResult.get` returns that. A
    script is the answer itself (any JSON value), a callable taking the child's content
    and returning the answer (or an awaitable of it), or an exception (an instance or a
    class) that the child raises, which the parent sees as :class:`~runrow.ChildFailed`.
    Keys given as real agents in ``dispatcher_options["agents"]`` run those agents. The
    children are in :attr:`~runrow.testing.AgentResult.children`.

    ``dispatcher_options`` go to the dispatcher. Unless given, ``flush_interval`` is 60 s,
    so the journal does not depend on timing: consecutive text deltas become one
    ``content_delta`` event, which ends where the agent emits any other event or writes
    a message. Raises :class:`TimeoutError` if the run has not ended after ``timeout``
    seconds; the agent is then cancelled, and the run ends ``failed``
    (``worker_shutdown``), or stays ``queued`` if it was never claimed.
    """
    conversation = conversation_id or f"test-{uuid.uuid4().hex[:12]}"
    options: dict[str, Any] = {"concurrency": 1, "poll": 0.5, "flush_interval": 60.0, **dispatcher_options}
    if children:
        scripted = {key: _scripted_child(key, script) for key, script in children.items()}
        options["agents"] = {**scripted, **(options.get("agents") or {})}
    events: list[Event] = []
    async with Dispatcher(db, agent, schema=schema, **options) as dispatcher:
        run = await enqueue(
            db,
            schema=schema,
            conversation_id=conversation,
            user_id=user_id,
            content=content,
            tenant_id=tenant_id,
            request=request,
        )
        unscripted: tuple[str, Any] | None = None
        with anyio.move_on_after(timeout) as waited:
            async for event in tail(db, run.id, schema=schema, hub=dispatcher.hub, poll=0.05):
                if not event.keepalive:
                    events.append(event)
                if event.type == INPUT_REQUESTED:
                    unscripted = await _answer(db, run.id, schema, inputs or {})
                    if unscripted is not None:
                        break
        if waited.cancelled_caught:
            now = await get_run(db, run.id, schema=schema)
            await dispatcher.stop(drain_timeout=0)  # cancel the agent now: no drain to wait for
            raise TimeoutError(
                f"run {run.id} did not end within {timeout:g}s (it was {now.status}, with "
                f"{len(events)} journal events); pass a longer timeout= if the agent needs it"
            )
    spawned = await list_runs(db, parent_run_id=run.id, limit=10_000, schema=schema)
    result = AgentResult(
        run=await get_run(db, run.id, schema=schema),
        events=events,
        transcript=await transcript(db, conversation, schema=schema),
        children=spawned[::-1],
    )
    if unscripted is not None:
        raise InputNotScripted(*unscripted, result)
    return result


def _scripted_child(key: str, script: Any) -> Agent:
    """An agent that plays one child's script (see ``run_agent``'s ``children``)."""

    async def child(run: RunContext) -> None:
        if isinstance(script, BaseException):
            raise copy.copy(script)
        if isinstance(script, type) and issubclass(script, BaseException):
            raise script(f"scripted failure of the {key!r} child")
        answer = script(run.content) if callable(script) else script
        if inspect.isawaitable(answer):
            answer = await answer
        await run.write_message(answer)

    return child


async def _answer(
    db: str, run_id: uuid.UUID, schema: str, inputs: Mapping[str, Any]
) -> tuple[str, Any] | None:
    """The run parked (its ``input_requested`` is journaled with the park, in one
    commit): gives one scripted answer, after which it resumes (and parks again for any
    other wait made beside this one). None once answered; else the first wait (oldest)
    nothing in ``inputs`` answers, as ``(key, request)``."""
    pending = sorted(await waiting_inputs(db, run_id=run_id, schema=schema), key=lambda p: (p.since, p.key))
    for p in pending:
        if p.key in inputs:
            await provide_input(db, run_id, p.key, inputs[p.key], schema=schema)
            return None
    if not pending:  # (answered already, by someone else: the run goes on)
        return None
    return pending[0].key, pending[0].request


# -- a scripted model --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call in a scripted model response: the tool's ``name``, its ``arguments``
    and the call's ``id`` (default: ``call_<name>``)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", f"call_{self.name}")


class ScriptExhausted(AssertionError):
    """The agent asked a :class:`~runrow.testing.ScriptedModel` for more responses than
    were scripted."""


class ScriptedModel:
    """A stand-in for a model client that plays scripted responses, in order.

    Each positional argument is one response: a sequence of chunks. Each call to
    :meth:`~runrow.testing.ScriptedModel.stream` plays the next response: a ``str`` chunk
    is a text delta, a :class:`~runrow.testing.ToolCall` a tool call, and any other
    object is yielded as it is (script your own client's chunk types if your agent
    expects them), except an exception instance, which is raised at that point of the
    stream (a model failing mid-answer).
    ``delay`` (seconds) is slept before each chunk, to test a stop mid-stream.

    ``requests`` records what each call was given (a deep copy of its first argument,
    usually the messages), so a test can check what the agent sent the model; a call
    past the script raises :class:`~runrow.testing.ScriptExhausted`.
    """

    def __init__(self, *responses: Sequence[object], delay: float = 0.0) -> None:
        self._responses = [list(r) for r in responses]
        self._delay = delay
        self.requests: list[Any] = []
        """The first argument of each ``stream`` call (deep-copied), in call order."""

    @property
    def remaining(self) -> int:
        """How many scripted responses have not been played yet."""
        return len(self._responses) - len(self.requests)

    def stream(self, messages: Any = None, /, **options: Any) -> AsyncIterator[Any]:
        """Plays the next scripted response as an async iterator of chunks.

        ``options`` (model name, temperature, tools, ...) are accepted and ignored.
        """
        index = len(self.requests)
        try:
            recorded = copy.deepcopy(messages)
        except Exception:  # not copyable: record the object itself
            recorded = messages
        self.requests.append(recorded)
        if index >= len(self._responses):
            raise ScriptExhausted(
                f"the agent asked the scripted model for response {index + 1}, "
                f"but only {len(self._responses)} were scripted"
            )
        return self._play(self._responses[index])

    async def _play(self, chunks: list[object]) -> AsyncIterator[Any]:
        for chunk in chunks:
            if self._delay:
                await anyio.sleep(self._delay)
            else:
                await anyio.lowlevel.checkpoint()  # a real stream yields to the loop, and so can be cancelled
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk
