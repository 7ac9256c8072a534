"""tail(..., tree=True): one resumable stream for a tree of runs (a root turn and every
run it spawned, at any depth).

The tree's stream has positions of its own, gap-free from 1: the reader's pass appends
the events its runs have committed since the last pass to the tree's log (``tree_log``,
under the tree's lock), and every reader of the tree, in any process, reads the same
log. A client resumes from its last position as it resumes a run from its seq. Each
event carries its run (``Event.run_id``) and its seq in that run's journal
(``Event.run_seq``). The root's ending is logged only after every other run of the tree
has ended: it is the stream's last event. Reading a tree writes to the database (the
log), so a tree tail needs the primary, not a replica.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import psycopg
from psycopg import AsyncConnection, Connection

from . import _aio, _syncdb
from ._db import MISSING_SCHEMA, Database, atomic, describe, out_of_date, statement_conn
from ._errors import InvalidInput, RunNotFound
from ._events import KEEPALIVE, Event
from ._gateway import tree as _gw
from ._gateway._exec import configure_own, configure_own_sync, own_transaction, run, run_sync
from ._hub import wait_any
from ._names import Channels

if TYPE_CHECKING:
    import uuid
    from collections.abc import AsyncIterator, Iterator

    from ._gateway._exec import Plan
    from ._hub import NotifyHub, Subscription
    from ._syncdb import SyncDatabase

T = TypeVar("T")

__all__ = ["tail_tree", "tail_tree_sync"]

log = logging.getLogger("runrow.journal")


async def tail_tree(
    db: Database,
    rid: uuid.UUID,
    *,
    from_seq: int,
    hub: NotifyHub | None,
    keepalive: float,
    poll: float,
    schema: str,
    batch: int,
    prepared_statements: bool,
) -> AsyncIterator[Event]:
    """The tree tail's loop (its arguments checked by ``tail``)."""
    channels = Channels.for_schema(schema)
    async with AsyncExitStack() as stack:
        conn_box: list[AsyncConnection] = []
        stack.push_async_callback(_close_all, conn_box)
        root = _root(
            rid, await _with_conn(db, conn_box, prepared_statements, _gw.tree_root(schema, run_id=rid))
        )
        subs: dict[uuid.UUID, Subscription] = {}
        scopes: dict[uuid.UUID, AsyncExitStack] = {}

        async def listen(run_id: uuid.UUID) -> None:
            if hub is None or not hub.running or run_id in subs:
                return
            scope = AsyncExitStack()
            subs[run_id] = await scope.enter_async_context(hub.subscribe(channels.events(run_id)))
            scopes[run_id] = scope

        async def unlisten_all() -> None:
            for scope in scopes.values():
                await scope.aclose()

        stack.push_async_callback(unlisten_all)
        # Before the first read: a spawn announces itself on the root's channel.
        await listen(root)
        cursor = from_seq
        idle_since = _aio.now()
        backoff = poll
        trusted = True  # as in a run's tail: until rows come that no hint announced
        heard = -1  # the hints counted at the previous pass (-1: before the first)
        while True:
            hints = sum(s.notified for s in subs.values())
            try:
                step = await _with_conn(
                    db,
                    conn_box,
                    prepared_statements,
                    _gw.tree_pass(schema, root=root, after=cursor, limit=batch),
                    transaction=True,
                )
            except MISSING_SCHEMA as exc:
                raise await out_of_date(db, schema) from exc
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                log.info(
                    "tail of tree %s cannot read (%s); retrying",
                    root,
                    describe(exc),
                    extra={"run_id": str(root)},
                )
                await _close_all(conn_box)
                backoff = min(backoff * 2, keepalive)
                await anyio.sleep(backoff)
                continue
            backoff = poll
            _check_pass(step, cursor, root)
            # Listen for every live run's journal, then read once more before waiting:
            # what a new run wrote before its LISTEN landed is read, not waited for.
            fresh = [r for r in step.live if r not in subs]
            for r in fresh:
                await listen(r)
            for r in [r for r in subs if r != root and r not in step.live]:
                await scopes.pop(r).aclose()
                del subs[r]
            if step.events and heard >= 0 and not fresh:
                trusted = hints != heard
            heard = hints
            for event in _marked(step):
                cursor = event.seq
                yield event
            if step.ended and cursor >= step.total:
                return
            if step.events:
                idle_since = _aio.now()
            if fresh or len(step.events) == batch:
                continue  # a new run to read once more, or the rest of a full batch
            now = _aio.now()
            if now - idle_since >= keepalive:
                yield Event(cursor, KEEPALIVE)
                idle_since = now
            wait = max(0.0, idle_since + keepalive - now)
            if not subs or hub is None or not hub.connected or not trusted:
                wait = min(wait, poll)
            if subs and hub is not None and hub.running:
                await wait_any(subs.values(), wait)
            else:
                await anyio.sleep(wait)


def tail_tree_sync(
    db: SyncDatabase,
    rid: uuid.UUID,
    *,
    from_seq: int,
    keepalive: float,
    poll: float,
    schema: str,
    batch: int,
    prepared_statements: bool,
) -> Iterator[Event]:
    """:func:`tail_tree` for a synchronous host: the same passes, polling every ``poll``
    seconds while nothing is new (no hub)."""
    own: Connection[Any] | None = None

    def conn_for(plan: Plan[T], *, transaction: bool = False) -> T:
        nonlocal own
        if isinstance(db, str) and (own is None or own.closed):
            own = Connection.connect(
                db, autocommit=True, prepare_threshold=5 if prepared_statements else None
            )
            if prepared_statements:
                configure_own_sync(own)
        source: SyncDatabase = own if own is not None else db
        with _syncdb.schema_guard(db, schema):
            if transaction:
                with _syncdb.atomic(source) as conn:
                    return run_sync(conn, plan)
            with _syncdb.statement_conn(source) as conn:
                return run_sync(conn, plan)

    try:
        root = _root(rid, conn_for(_gw.tree_root(schema, run_id=rid)))
        cursor, backoff, idle_since = from_seq, poll, time.monotonic()
        while True:
            try:
                step = conn_for(_gw.tree_pass(schema, root=root, after=cursor, limit=batch), transaction=True)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                log.info(
                    "tail of tree %s cannot read (%s); retrying",
                    root,
                    describe(exc),
                    extra={"run_id": str(root)},
                )
                if own is not None:
                    own.close()
                backoff = min(backoff * 2, keepalive)
                time.sleep(backoff)
                continue
            backoff = poll
            _check_pass(step, cursor, root)
            for event in _marked(step):
                cursor = event.seq
                yield event
            if step.ended and cursor >= step.total:
                return
            now = time.monotonic()
            if step.events:
                idle_since = now
                if len(step.events) == batch:
                    continue
            if now - idle_since >= keepalive:
                yield Event(cursor, KEEPALIVE)
                idle_since = now
            time.sleep(min(poll, max(0.0, idle_since + keepalive - now)))
    finally:
        if own is not None:
            own.close()


def _root(rid: uuid.UUID, found: tuple[uuid.UUID, uuid.UUID | None] | None) -> uuid.UUID:
    """The tree's root a tail of ``rid`` reads (a root's retry: its root), or the refusal."""
    if found is None:
        raise RunNotFound(rid)
    root, its_root = found
    if its_root is not None:
        raise InvalidInput(
            "run_id", f"run {rid} is a child: tail its tree's root, {its_root}, with tree=True"
        )
    return root


def _check_pass(step: _gw.TreePass, cursor: int, root: uuid.UUID) -> None:
    """A pass found the tree, and the cursor is within its stream (else the refusal)."""
    if step.runs == 0:
        raise RunNotFound(root)
    if cursor > step.total:
        raise InvalidInput(
            "from_seq",
            f"{cursor} is past the end of tree {root}'s stream (its last position is {step.total})",
        )


def _marked(step: _gw.TreePass) -> list[Event]:
    """The pass's events, the stream's last one marked ``final`` once the tree has ended."""
    if not step.ended or not step.events or step.events[-1].seq != step.total:
        return step.events
    return [*step.events[:-1], dataclasses.replace(step.events[-1], final=True)]


async def _with_conn(
    db: Database,
    conn_box: list[AsyncConnection],
    prepared_statements: bool,
    plan: Plan[T],
    *,
    transaction: bool = False,
) -> T:
    """Runs ``plan`` on the tail's connection: its own (a conninfo), the pool's, or the
    caller's; in a transaction of its own when asked (a pass holds the tree's lock)."""
    if isinstance(db, str):
        if not conn_box or conn_box[0].closed:
            conn = await AsyncConnection.connect(
                db, autocommit=True, prepare_threshold=5 if prepared_statements else None
            )
            conn_box[:] = [conn]
            if prepared_statements:
                await configure_own(conn)
        conn = conn_box[0]
        if transaction:
            async with own_transaction(conn):
                return await run(conn, plan)
        return await run(conn, plan)
    if transaction:
        async with atomic(db) as conn:
            return await run(conn, plan)
    async with statement_conn(db) as conn:
        return await run(conn, plan)


async def _close_all(conn_box: list[AsyncConnection]) -> None:
    for c in conn_box:
        with anyio.CancelScope(shield=True):
            await c.close()
    conn_box.clear()
