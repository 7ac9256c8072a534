"""Sub-agents (#41): a run's spawn of child runs and its wait for them.

A spawn is an idempotent step of the parent (``spawn:<key>``): its function enqueues the
children in one transaction, fenced by the parent's claim, each under an idempotency key
made from the parent's turn and the step's place in it. A replay gets the recorded ids
back; an attempt that died after the enqueue committed but before the step was recorded
enqueues again and finds the same children (``created=False``): never a second one.

A wait for children is a wait for input (``Steps.wait``) whose input is the children's
outcomes: recorded at once if they have ended, else the run parks ``waiting`` with the
children it waits on stamped on its row, and each child's ending (finalize, reap, a stop)
queues it again once they have (the SQL fragment ``woke_parents``).
"""

from __future__ import annotations

import collections
import dataclasses
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import _json
from .._db import atomic, statement_conn
from .._enqueue import enqueue_in
from .._enqueue_options import DEFAULT_MAX_CONTENT_BYTES, EnqueueOptions
from .._errors import InvalidInput, LeaseLost, RunrowError, SpawnLimitExceeded
from .._gateway import tree as _gw
from .._gateway._exec import Plan, run
from .._models import ChildResult
from .._status import TERMINAL

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from .flight import ActiveRun, RunHost

CHILDREN = "runrow.children:"
"""The key prefix of a wait for children (``runrow.children:<n>``, the n-th of the turn)."""


class Children:
    """One wait for children: which (by first run), whether the first to end is enough,
    and, once :meth:`ready` has read them, those still going."""

    __slots__ = ("_read", "first", "ids", "pending")

    def __init__(
        self,
        ids: Sequence[uuid.UUID],
        first: bool,
        read: Callable[[Sequence[uuid.UUID]], Awaitable[list[_gw.ChildOutcome]]],
    ) -> None:
        self.ids = tuple(ids)
        self.first = first
        self.pending: tuple[uuid.UUID, ...] = self.ids
        self._read = read

    async def ready(self) -> str | None:
        """The outcomes as the step records them (JSON text) if the wait is over; else
        None, with :attr:`pending` the children still going."""
        found = {o.id: o for o in await self._read(self.ids)}
        if missing := [str(i) for i in self.ids if i not in found]:
            raise InvalidInput("children", f"not children of this run: {', '.join(missing)}")
        self.pending = tuple(i for i in self.ids if found[i].status not in TERMINAL)
        if self.pending and not (self.first and len(self.pending) < len(self.ids)):
            return None
        return _json.dumps(
            [
                {
                    "run_id": str(i),
                    "status": found[i].status,
                    "answer": found[i].answer,
                    "error": found[i].error,
                }
                for i in self.ids
            ],
            "children's outcomes",
        )


def results(recorded: Any) -> list[ChildResult]:
    """The recorded outcomes as ChildResults, in the order waited on."""
    return [
        ChildResult(uuid.UUID(o["run_id"]), o["status"], o.get("answer"), o.get("error")) for o in recorded
    ]


def child_ids(children: object) -> list[uuid.UUID]:
    """The children a wait names (ids, or their text), once each; InvalidInput if none."""
    if isinstance(children, str | uuid.UUID) or not isinstance(children, Iterable):
        raise InvalidInput("children", "must be a list of child run ids (as spawn returned them)")
    ids: list[uuid.UUID] = []
    for c in children:
        try:
            each = c if isinstance(c, uuid.UUID) else uuid.UUID(str(c))
        except ValueError:
            raise InvalidInput("children", f"{c!r} is not a run id") from None
        if each not in ids:
            ids.append(each)
    if not ids:
        raise InvalidInput("children", "must name at least one child run")
    return ids


class Spawner:
    """A run's spawns: the children's options, and the fenced transaction that enqueues them."""

    def __init__(self, host: RunHost, run: ActiveRun) -> None:
        self._host = host
        self._run = run
        row = run.row
        self._lineage = row.lineage_id or row.id
        self._root = row.root_run_id or self._lineage

    def check_key(self, agent_key: str | None) -> None:
        """InvalidInput unless the spawning Dispatcher serves ``agent_key``."""
        s = self._host.settings
        if agent_key is None:
            if not s.serves_default:
                raise InvalidInput("agent_key", "this Dispatcher has no default agent: name an agent key")
            return
        _json.check_id(agent_key, "agent_key", max_len=200)
        if agent_key not in s.agent_keys:
            served = ", ".join(repr(k) for k in s.agent_keys) or "none"
            raise InvalidInput(
                "agent_key", f"{agent_key!r} is not an agent this Dispatcher serves ({served})"
            )

    def options(self, base: str, i: int, agent_key: str | None, content: Any, request: Any) -> EnqueueOptions:
        """The i-th child of spawn step ``base``: its own conversation and idempotency key
        (the same on every attempt of the parent's turn), the parent's user, tenant,
        priority and deadline, and its place in the tree."""
        row = self._run.row
        name = uuid.uuid5(self._lineage, f"{base}:{i}")
        options = EnqueueOptions.checked(
            conversation_id=f"child:{name}",
            user_id=row.user_id,
            content=content,
            tenant_id=row.tenant_id,
            idempotency_key=f"spawn:{name}",
            request=request,
            priority=row.priority,
            not_before=None,
            deadline=row.deadline_at,  # (a child cannot outlive its parent's deadline)
            on_busy="enqueue",
            max_queued_per_tenant=None,
            max_queued_per_conversation=None,
            schema=self._host.settings.schema,
            max_content_bytes=DEFAULT_MAX_CONTENT_BYTES,
            agent_key=agent_key,
        )
        return dataclasses.replace(options, parent_run_id=self._lineage, root_run_id=self._root)

    async def enqueue(self, children: Sequence[EnqueueOptions]) -> list[str]:
        """Enqueues ``children`` in one transaction fenced by the parent's claim; their ids."""
        s = self._host.settings
        async with atomic(self._host.pool(), idle_seconds=s.tx_idle_seconds) as conn:
            ids = await run(conn, self._plan(s.schema, children, s.max_spawn_depth, s.max_children))
        if ids is None:
            self._host.lost(self._run.id)
            raise LeaseLost(self._run.id)
        return ids

    def _plan(
        self, schema: str, children: Sequence[EnqueueOptions], max_depth: int, max_children: int
    ) -> Plan[list[str] | None]:
        parent = yield from _gw.spawn_parent(
            schema, run_id=self._run.id, claim_token=self._run.token, max_depth=max_depth
        )
        if parent is None:
            return None
        if parent.cancel_requested:
            raise RunrowError(f"run {self._run.id} is being stopped: it spawns nothing")
        if parent.depth + 1 > max_depth:
            raise SpawnLimitExceeded(
                "max_spawn_depth", max_depth, f"run {self._run.id} is at depth {parent.depth}"
            )
        spawned = yield from _gw.tree_spawned(schema, root=parent.root)
        ids, created = [], 0
        for options in children:
            child = yield from enqueue_in(options)
            ids.append(str(child.id))
            created += child.created
        if created and spawned + created > max_children:  # (raised: the transaction rolls back)
            raise SpawnLimitExceeded(
                "max_children", max_children, f"the tree of run {parent.root} has spawned {spawned}"
            )
        return ids


class Family:
    """A run's spawns and waits for children (``RunContext.spawn``, ``wait_for_children``):
    their keys, numbered in call order (the same on every attempt), and the step book
    (``book()``, the run's ``Steps``) that records them."""

    def __init__(self, host: RunHost, run: ActiveRun, book: Callable[[], Any]) -> None:
        self._host = host
        self._run = run
        self._book = book
        self._spawner = Spawner(host, run)
        self._spawns: collections.Counter[str] = collections.Counter()
        self._waits = 0

    async def spawn_many(self, children: Sequence[tuple[Any, ...]], key: str) -> list[uuid.UUID]:
        """``RunContext.spawn_many``."""
        _json.check_id(key, "key", max_len=150)
        if isinstance(children, str | bytes) or not isinstance(children, Iterable):
            raise InvalidInput("children", "must be a list of (agent_key, content[, request]) tuples")
        specs = [tuple(c) + (None,) * (3 - len(c)) if isinstance(c, tuple) else () for c in children]
        if not specs or any(len(c) != 3 for c in specs):
            raise InvalidInput(
                "children", "must be (agent_key, content) or (agent_key, content, request) tuples"
            )
        for agent_key, _, _ in specs:
            self._spawner.check_key(agent_key)
        step = f"spawn:{key}"
        base = f"{step}:{self._spawns[step]}"  # (the n-th spawn under this key: its step's occurrence)
        self._spawns[step] += 1
        options = [self._spawner.options(base, i, *spec) for i, spec in enumerate(specs)]
        book = self._book()

        async def enqueue(options: Sequence[EnqueueOptions]) -> list[str]:
            await book.records.flushed()  # (its own transaction: after the records handed over)
            return await self._spawner.enqueue(options)

        ids = await book.run(step, enqueue, (options,), {}, idempotent=True)
        return [uuid.UUID(i) for i in ids]

    async def wait(self, children: object, first: bool) -> list[ChildResult]:
        """``RunContext.wait_for_children``."""
        if not isinstance(first, bool):
            raise InvalidInput("first", "must be True or False")
        ids = child_ids(children)
        key = f"{CHILDREN}{self._waits}"
        self._waits += 1
        asked = {"children": [str(i) for i in ids], "first": first}
        return results(await self._book().wait(key, asked, None, Children(ids, first, self._outcomes)))

    async def _outcomes(self, ids: Sequence[uuid.UUID]) -> list[_gw.ChildOutcome]:
        lineage = self._run.row.lineage_id or self._run.id
        async with statement_conn(
            self._host.pool(), idle_seconds=self._host.settings.tx_idle_seconds
        ) as conn:
            return await run(conn, _gw.child_outcomes(self._host.settings.schema, parent=lineage, ids=ids))
