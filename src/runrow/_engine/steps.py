"""Durable steps: one attempt's memoised calls, and what earlier attempts recorded.

A step is identified by its key and occurrence (the n-th call with that key in the
attempt) and has a position (its place among the attempt's step calls). A step that is
not idempotent is marked begun before it runs, and its result is returned at once, its
record landing before anything the run writes after it (handed_records.py); an error,
and an idempotent step's result, are recorded before the agent sees them. Every write
is fenced by the claim. A retry is a new run in the same lineage: its agent runs from
the top, and each step an earlier attempt recorded returns (or raises) what was
recorded, without running.
A wait for input parks the run only once the steps in flight beside it have recorded
their outcomes (bounded by half the lease); no step begins while it waits.
"""

from __future__ import annotations

import collections
import contextvars
import inspect
import logging
import uuid
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from .. import _json
from .._db import statement_conn
from .._errors import InvalidInput, LeaseLost, StepMismatch, StepUncertain
from .._gateway import steps as _gw
from .._gateway._exec import Plan, run
from .flight import Park
from .handed_records import HandedRecords
from .replay import MARKER, Recorded, rebuilt
from .step_writer import retrying
from .tree import CHILDREN, Children

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._gateway.steps import StepRecord
    from .flight import ActiveRun, RunHost
    from .journal_writer import JournalWriter

log = logging.getLogger("runrow.run")

MAX_STEP_BYTES = 1 << 20
"""The largest step result (JSON), or recorded error, a step may keep."""

_MAX_KEY = 200
T = TypeVar("T")
# The steps whose fn the current code runs inside (their tokens): a wait called from
# within a step does not wait for that step to settle before it parks (it never would).
_ENCLOSING: contextvars.ContextVar[tuple[object, ...]] = contextvars.ContextVar(
    "runrow_enclosing_steps", default=()
)


class Steps:
    """The step book of one attempt (one claimed run)."""

    def __init__(self, host: RunHost, run: ActiveRun, journal: JournalWriter | None = None) -> None:
        self._host = host
        self._run = run  # its id and claim token fence every step write
        row = run.row
        self._run_id = row.id  # (read on every step: kept at hand)
        self._lineage = row.lineage_id or row.id
        # A first attempt, never parked, has nothing to replay: no read until a retry or
        # a resumed run needs one.
        replays = row.lineage_id is not None or row.resumes > 0
        self._recorded: Recorded | None = None if replays else Recorded(row.id, ())
        # A resumed run replays what it journaled before it parked: its journal stays
        # muted until the replay passes the input it parked on (the resume point).
        self._journal = journal
        self._resume_at: int | None = None
        if row.resumes > 0 and journal is not None:
            journal.muted = True
        self._markers: dict[str, bool] = {}  # change markers asked in this turn
        self._loading: anyio.Lock = anyio.Lock()
        self._occurrences: collections.Counter[str] = collections.Counter()
        self._next_position = 0
        self._in_flight: set[str] = set()
        # What a park waits for before it cuts the agent: steps begun and not yet
        # recorded, and inputs being marked waiting (token -> key).
        self._active: dict[object, str] = {}
        self._changed: anyio.Event | None = None
        # While a wait parks the run (it waits for the work in flight first): an event set
        # only if that wait is cut before the park (the agent's own task group cancelled
        # it), when the turn goes on. The waits marked, by position: the park is the
        # lowest position's, whichever write came back first.
        self._parking: anyio.Event | None = None
        self._marked: dict[int, tuple[str, Any, float | None, Children | None]] = {}
        # Results whose records went to the step writer without a wait.
        self.records = HandedRecords(host, run, journal, self._write, self.settled)

    async def run(
        self,
        key: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        idempotent: bool,
    ) -> Any:
        _json.check_id(key, "key", max_len=_MAX_KEY)
        if not callable(fn):
            raise InvalidInput("fn", "must be callable")
        if not isinstance(idempotent, bool):
            raise InvalidInput("idempotent", "must be True or False")
        if key in self._in_flight:
            # Two calls of one key at once would be numbered in whatever order they
            # arrived, and a replay could hand each the other's result.
            raise InvalidInput(
                "key",
                f"step {key!r} is already running in this turn; concurrent steps need keys of their own",
            )
        # Numbered before the first await: concurrent steps take their call order.
        position, occurrence = self.number(key)
        self._in_flight.add(key)
        try:
            return await self._step(key, occurrence, position, fn, args, kwargs, idempotent)
        finally:
            self._in_flight.discard(key)

    async def _step(
        self,
        key: str,
        occurrence: int,
        position: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        idempotent: bool,
    ) -> Any:
        prior = await self.replayed(key, occurrence, position)
        if prior is not None:
            if prior.status == "recorded":
                return prior.result
            if prior.status == "failed":
                assert prior.error is not None
                raise rebuilt(key, prior.error)
            if not idempotent:
                raise StepUncertain(self._run_id, key, occurrence)
        # (The turn parking: a step not begun yet is not begun now (the park cuts it in
        # begin, unmarked), and the resumed run begins it.)
        token = await self.begin(key)  # in flight until recorded: a park waits for it
        try:
            where = {"key": key, "occurrence": occurrence, "position": position}
            if not idempotent:
                await self._write(_gw.start, **where)
            try:
                inside = _ENCLOSING.set((*_ENCLOSING.get(), token))
                try:
                    value = fn(*args, **kwargs)
                    if inspect.isawaitable(value):
                        value = await value
                finally:
                    _ENCLOSING.reset(inside)
                text = _json.dumps(value, f"step {key!r} result", MAX_STEP_BYTES)
            except Exception as exc:
                if idempotent:
                    raise  # not recorded: a retry calls it again (it may succeed then)
                # Recorded like a result: its effect may have happened, so a replay raises
                # the error again instead of calling a second time.
                error = {
                    **_json.error_of(exc, 64 * 1024),
                    "type": type(exc).__qualname__,
                    "module": type(exc).__module__,
                }
                body = _json.dumps(error, "step error")
                await self._write(_gw.record, **where, idempotent=idempotent, result=None, error=body)
                raise
            if idempotent:  # (no begun marker to share a commit with: its fence is felt here)
                recorded = await self._write(_gw.record, **where, idempotent=True, result=text, error=None)
                return recorded.result  # as the database keeps it: what a replay returns too
            value = _json.as_stored(text)  # as jsonb keeps it, the same
            self.records.hand_over(token, where, text)
            token = None  # (settled once the record has landed or failed)
            return value
        finally:
            if token is not None:
                self.settled(token)

    def number(self, key: str) -> tuple[int, int]:
        """The next call's place: its position in the turn and its occurrence of ``key``."""
        position, occurrence = self._next_position, self._occurrences[key]
        self._next_position += 1
        self._occurrences[key] += 1
        return position, occurrence

    async def replayed(self, key: str, occurrence: int, position: int) -> StepRecord | None:
        """What an earlier attempt left for this step (None: nothing), or StepMismatch
        (also for an input there)."""
        prior = (await self._book()).match(key, occurrence, position)
        if prior is not None and prior.input:
            raise StepMismatch(self._run_id, position, key, f"{prior.key} (an input, not a step)")
        return prior

    async def begin(self, key: str) -> object:
        """A write about to begin: once no park is under way, counted in flight (a park
        waits for it) until :meth:`settled` with the token returned."""
        while (parking := self._parking) is not None:
            await parking.wait()
        token = object()
        self._active[token] = key
        return token

    async def _book(self) -> Recorded:
        if self._recorded is None:
            async with self._loading:
                if self._recorded is None:
                    await self._load()
        assert self._recorded is not None
        return self._recorded

    async def changed(self, name: str) -> bool:
        """``RunContext.changed``: True for a run that started after change ``name``
        (recorded, taking a position, the first time), False for one whose recorded
        calls go past this point without the marker (they keep their positions)."""
        _json.check_id(name, "name", max_len=_MAX_KEY - len(MARKER))
        key = MARKER + name
        if (known := self._markers.get(key)) is not None:
            return known  # asked again in the turn: the same answer, no position
        before = self._next_position
        book = await self._book()
        if self._next_position != before:
            # A step numbered while the book loaded: the marker's place would depend on timing.
            raise InvalidInput("name", "changed() must not be asked while steps start beside it")
        answer = book.marker(key, before)
        if answer is False:
            self._markers[key] = False
            return False
        self._next_position += 1
        self._occurrences[key] += 1
        if answer is None:
            token = await self.begin(key)
            try:
                where = {"key": key, "occurrence": 0, "position": before}
                await self._write(_gw.record, **where, idempotent=True, result="true", error=None)
            finally:
                self.settled(token)
        self._markers[key] = True
        return True

    async def _load(self) -> None:
        records = await self.retrying(self._read_book)
        self._recorded = Recorded(self._run_id, records)
        # (A wait for children is recorded once the run resumes: it is where it parked.)
        answered = [
            r.position
            for r in records
            if r.input
            and r.run_id == self._run_id
            and (r.status == "recorded" or (r.status == "waiting" and r.key.startswith(CHILDREN)))
        ]
        self._resume_at = max(answered, default=None)
        if self._resume_at is None:
            self._unmute()

    async def _read_book(self) -> list[StepRecord]:
        s = self._host.settings
        async with statement_conn(self._host.pool(), idle_seconds=s.tx_idle_seconds) as conn:
            return await run(conn, _gw.load(s.schema, run_id=self._run_id))

    def _unmute(self) -> None:
        if self._journal is not None:
            self._journal.muted = False

    async def wait(
        self, key: str, request: Any, timeout: float | None, children: Children | None = None
    ) -> Any:
        """An input a person records (``RunContext.wait_for_input``): its value if it was
        provided; else the input is marked waiting and the run parks (this never
        returns then: the agent is cancelled). With ``children`` (``wait_for_children``),
        the input is the children's outcomes: recorded as soon as they are ready."""
        _json.check_id(key, "key", max_len=_MAX_KEY)
        text = _json.dumps(request, "request", self._host.settings.max_event_bytes)
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < 1e9
        ):
            raise InvalidInput("timeout", "must be None or a positive number of seconds")
        if self._occurrences[key]:
            # One key, one question: provide_input names the wait by its key, so a
            # client's repeated answer can never become the answer to a later question.
            raise InvalidInput(
                "key", f"{key!r} was already used in this turn; each wait needs a key of its own"
            )
        # (Its key is then taken for the turn: no second call, concurrent or later, has it.)
        position, _ = self.number(key)
        prior = (await self._book()).match(key, 0, position)
        if prior is not None and not prior.input:
            raise StepMismatch(self._run_id, position, key, f"{prior.key} (a step, not an input)")
        if prior is not None and prior.status == "recorded":
            if position == self._resume_at:
                self._unmute()  # the replay has reached where the run paused
            elif self._journal is not None and not self._journal.muted:
                # A retry passing a wait an earlier attempt parked on: that park kept the
                # text streamed before the wait as the wait's message; it is not this
                # attempt's answer to save again.
                self._journal.answer_taken()
            return prior.result
        if children is not None and (outcomes := await children.ready()) is not None:
            where = {"key": key, "occurrence": 0, "position": position, "request": text}
            if prior is not None and prior.run_id != self._run_id:  # an earlier attempt's park
                await self._write(_gw.wait, **where)
            got = await self._write(_gw.record, **where, idempotent=True, result=outcomes, error=None)
            if position == self._resume_at:
                self._unmute()
            return got.result
        token = await self.begin(key)
        try:
            await self._write(_gw.wait, key=key, occurrence=0, position=position, request=text)
        finally:
            self.settled(token)
        self._marked[position] = (key, request, timeout, children)
        try:
            while True:
                if (parking := self._parking) is None:
                    await self._park(position)  # the agent is cancelled once it has parked
                else:
                    await parking.wait()  # another wait parks the run, unless it is cut first
        finally:
            self._marked.pop(position, None)

    async def _park(self, position: int) -> None:
        """Parks the run once the turn's work in flight has settled; any other (parallel)
        wait is marked too, and asked as well. The park is the first marked wait's (by
        position, the same on every attempt): the text streamed before it is kept under
        that wait's own message id, so an attempt parking there again writes it once."""
        self._parking = parking = anyio.Event()
        try:
            await self._settle(self._marked[position][0])
        except BaseException:
            # Cut before the park (a task group of the agent's cancelled this wait): the
            # turn goes on, its steps may begin, and another wait may park it.
            self._parking = None
            parking.set()
            raise
        key, request, timeout, children = self._marked[min(self._marked)]
        message_id = uuid.uuid5(self._lineage, f"input:{key}")
        awaiting = None if children is None else children.pending
        first = children is not None and children.first
        self._host.park(self._run_id, Park(key, request, timeout, message_id, awaiting, first))

    def settled(self, token: object) -> None:
        self._active.pop(token, None)
        if self._changed is not None:
            self._changed.set()

    async def _settle(self, key: str) -> None:
        """Waits until no step of the turn is in flight (begun, not recorded) and no other
        input is being marked, at most half the lease: a park must not cut a step runrow
        began, which would leave it uncertain. No step begins meanwhile. A step still
        running past the bound is cut by the park: its effect may have happened, so a
        step marked begun stays uncertain, as after a crash, and the log says so."""
        await self.records.flushed()  # (records handed over are not steps in flight)
        mine = set(_ENCLOSING.get())  # steps this wait runs inside: they cannot settle first

        def others() -> list[str]:
            return [k for t, k in self._active.items() if t not in mine]

        bound = self._host.settings.lease / 2
        with anyio.move_on_after(bound):
            while others():
                self._changed = changed = anyio.Event()
                await changed.wait()
        if left := others():
            log.warning(
                "run %s parks for input %r with step(s) %s still running after %gs: the park "
                "cuts them, and a step marked begun stays uncertain",
                self._run_id,
                key,
                ", ".join(repr(k) for k in sorted(left)),
                bound,
                extra={"run_id": str(self._run_id)},
            )

    async def _write(self, statement: Callable[..., Plan[T | None]], **params: Any) -> T:
        """A fenced step write; what it returned. Shielded: a stop cutting it short would
        leave the step's state unknown to this attempt; the stop lands at the agent's
        next await."""
        schema = self._host.settings.schema
        with anyio.CancelScope(shield=True):
            done = await self.retrying(
                lambda: self._host.write_together(
                    lambda: statement(schema, run_id=self._run_id, claim_token=self._run.token, **params)
                )
            )
        if done is None or done is False:
            self._host.lost(self._run_id)
            raise LeaseLost(self._run_id)
        return done  # type: ignore[no-any-return]

    async def retrying(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """Runs ``call``, sending it again after a transient failure (see step_writer.retrying)."""
        return await retrying(self._host, self._run_id, call)
