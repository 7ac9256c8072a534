"""``runrow check``: before a deploy, replay the runs new code would resume or retry.

Every waiting run (and, if asked, every run that failed recently: a retry replays it) is
replayed against the given agent without side effects: each recorded step returns (or
raises) its record, what the agent emits or writes is dropped, and the replay stops at
the first call with no record (the run would go on from there) or at the input the run
waits for. The rules are the running step book's (``_engine/replay.py``), so a call the
check accepts does not raise :class:`~runrow.StepMismatch` on resume. Nothing is written.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from typing import TYPE_CHECKING, Any

import anyio

from . import _json
from ._db import schema_guard, statement_conn
from ._engine.context import RunContext
from ._engine.replay import MARKER, Recorded, rebuilt
from ._engine.steering import STEERING, Delivery, messages_of
from ._errors import InvalidInput, StepMismatch
from ._gateway import reads, steering
from ._gateway import steps as _gw
from ._gateway._exec import run
from ._names import DEFAULT_SCHEMA, check_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ._db import Database
    from ._gateway.steps import CheckRun
    from ._models import Message, SteeringMessage

__all__ = ["CheckResult", "check_runs"]

_MAX_KEY = 200


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One run's replay against the new code."""

    run_id: uuid.UUID
    conversation_id: str
    status: str
    """``waiting`` (a resume replays it) or ``failed`` (a retry would)."""
    version: str | None
    """The version the run started with."""
    ok: bool
    """False: the resume (or retry) would fail here (``problem`` says why)."""
    stopped: str
    """Where the replay stopped: the call the run would go on from, or how the agent ended."""
    position: int | None = None
    """The call's place in the turn (from 0), when the replay stopped at a call."""
    problem: str | None = None


class _Stop(BaseException):
    """The replay reached a call with no record (or the wait it parked on): where the
    run would go on. A BaseException, so the agent's ``except Exception`` lets it by."""

    def __init__(self, where: str, position: int) -> None:
        super().__init__(where)
        self.where, self.position = where, position


class _Replay(RunContext):
    """A RunContext whose calls answer from the lineage's records and write nothing."""

    def __init__(self, info: CheckRun, book: Recorded, db: Database, schema: str) -> None:
        # (Not RunContext.__init__: no claim, no host, no journal.)
        self.run_id, self.conversation_id = info.id, info.conversation_id
        self.user_id, self.tenant_id = info.user_id, info.tenant_id
        self.request, self.content = info.request, info.content
        self.user_message_id, self.worker_id = info.user_message_id, "runrow-check"
        self.started_at = info.started_at or info.created_at
        self.attempt, self.resumes = info.attempt, info.resumes
        self._lineage = info.lineage_id or info.id
        self._book_of, self._db, self._schema = book, db, schema
        self._messages, self._next_position = 0, 0
        self._occurrences: dict[str, int] = {}
        self._markers: dict[str, bool] = {}
        self._delivered: set[uuid.UUID] = set()  # steering messages the replay passed
        self.stop: _Stop | None = None  # the first stop (kept should the agent swallow it)

    @property
    def cancel_requested(self) -> bool:
        return False

    async def emit(self, event: Mapping[str, Any]) -> None:
        return None

    async def text(self, delta: str, *, stream: str | None = None) -> None:
        return None

    async def flush(self) -> None:
        return None

    async def write_message(self, content: Any, *, role: str = "assistant") -> uuid.UUID:
        self._messages += 1
        return self._message_id(self._messages - 1)

    def _message_id(self, n: int) -> uuid.UUID:
        return uuid.uuid5(self._lineage, f"message:{n}")

    async def step(self, key: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return self._replayed_step(key)

    async def idempotent_step(self, key: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return self._replayed_step(key)

    def _number(self, key: str) -> tuple[int, int]:
        position, occurrence = self._next_position, self._occurrences.get(key, 0)
        self._next_position += 1
        self._occurrences[key] = occurrence + 1
        return position, occurrence

    def _stopped(self, where: str, position: int) -> _Stop:
        if self.stop is None:
            self.stop = _Stop(where, position)
        return self.stop

    def _replayed_step(self, key: str) -> Any:
        _json.check_id(key, "key", max_len=_MAX_KEY)
        position, occurrence = self._number(key)
        prior = self._book_of.match(key, occurrence, position)
        if prior is not None and prior.input:
            raise StepMismatch(self.run_id, position, key, f"{prior.key} (an input, not a step)")
        if prior is None:
            raise self._stopped(f"step {key!r}: not recorded, the run goes on from it", position)
        if prior.status == "recorded":
            return prior.result
        if prior.status == "failed":
            assert prior.error is not None
            raise rebuilt(key, prior.error)
        raise self._stopped(f"step {key!r}: begun, its outcome unknown", position)

    async def wait_for_input(self, key: str, request: Any = None, *, timeout: float | None = None) -> Any:
        _json.check_id(key, "key", max_len=_MAX_KEY)
        if self._occurrences.get(key):
            raise InvalidInput(
                "key", f"{key!r} was already used in this turn; each wait needs a key of its own"
            )
        position, _ = self._number(key)
        prior = self._book_of.match(key, 0, position)
        if prior is not None and not prior.input:
            raise StepMismatch(self.run_id, position, key, f"{prior.key} (a step, not an input)")
        if prior is None:
            raise self._stopped(f"input {key!r}: not asked yet, the run goes on from it", position)
        if prior.status == "recorded":
            return prior.result
        raise self._stopped(f"input {key!r}: the run waits for it", position)

    def steering(self) -> Delivery:
        return Delivery(self._steered)

    async def _steered(self) -> list[SteeringMessage]:
        position, occurrence = self._number(STEERING)
        prior = self._book_of.match(STEERING, occurrence, position)
        if prior is not None and prior.input:
            raise StepMismatch(self.run_id, position, STEERING, f"{prior.key} (an input, not a delivery)")
        if prior is None:
            raise self._stopped("steering: not read yet, the run goes on from it", position)
        async with statement_conn(self._db) as conn:
            found = messages_of(await run(conn, steering.read(self._schema, ids=prior.result)))
        self._delivered |= {m.message_id for m in found}
        return found

    async def changed(self, name: str) -> bool:
        _json.check_id(name, "name", max_len=_MAX_KEY - len(MARKER))
        key = MARKER + name
        if (known := self._markers.get(key)) is not None:
            return known
        answer = self._book_of.marker(key, self._next_position)
        if answer is None:
            raise self._stopped(
                f"change {name!r}: not asked yet, the run goes on from it", self._next_position
            )
        if answer:
            self._number(key)
        self._markers[key] = answer
        return answer

    async def transcript(self) -> list[Message]:
        async with statement_conn(self._db) as conn:
            found = await run(
                conn, reads.transcript(self._schema, conversation_id=self.conversation_id, run_id=self.run_id)
            )
        # As a replay reads it: without what this run wrote after this point.
        written = (
            {self._message_id(i) for i in range(self._messages)} | {self.user_message_id} | self._delivered
        )
        return [m for m in found if m.run_id != self.run_id or m.id in written]


async def check_runs(
    db: Database,
    agent: Callable[[RunContext], Any],
    *,
    failed_since: float | None = None,
    timeout: float = 30.0,
    schema: str = DEFAULT_SCHEMA,
) -> list[CheckResult]:
    """Replays every waiting run (and those failed in the last ``failed_since`` seconds)
    against ``agent`` without side effects; one result per run, oldest first."""
    check_schema(schema)
    async with schema_guard(db, schema), statement_conn(db) as conn:
        infos = await run(conn, _gw.check_runs(schema, failed_since=failed_since))
    results = []
    for info in infos:
        async with statement_conn(db) as conn:
            records = await run(conn, _gw.load(schema, run_id=info.id))
        results.append(await _replay(info, Recorded(info.id, records), agent, db, schema, timeout))
    return results


async def _replay(
    info: CheckRun,
    book: Recorded,
    agent: Callable[[RunContext], Any],
    db: Database,
    schema: str,
    timeout: float,
) -> CheckResult:
    ctx = _Replay(info, book, db, schema)
    result = functools.partial(CheckResult, info.id, info.conversation_id, info.status, info.version)
    error: BaseException | None = None
    try:
        with anyio.fail_after(timeout):
            await agent(ctx)
    except TimeoutError:
        return result(False, "timed out", problem=f"the replay did not stop within {timeout:g}s")
    except BaseException as exc:  # (the agent's own errors are the report)
        error = _first(exc)
        if isinstance(error, KeyboardInterrupt | anyio.get_cancelled_exc_class()):
            raise  # (not the replay's: the check itself is being stopped)
    if isinstance(error, StepMismatch):
        return result(False, "step mismatch", position=error.position, problem=str(error))
    if ctx.stop is not None:
        return result(True, ctx.stop.where, position=ctx.stop.position)
    if error is None:
        return result(True, "the agent returned")
    where = f"the agent raised {type(error).__name__}: {error}"
    if info.status == "failed":
        return result(True, where)  # (a retry replays its recorded failure so)
    return result(False, where, problem=f"a resume would fail: {where}")


def _first(exc: BaseException) -> BaseException:
    """The error that decides the report: a mismatch anywhere in a group (parallel steps),
    else the first other error, else a stop."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for inner in e.exceptions:
                walk(inner)
        else:
            leaves.append(e)

    walk(exc)
    for kind in (StepMismatch, Exception):
        for leaf in leaves:
            if isinstance(leaf, kind):
                return leaf
    return leaves[0]
