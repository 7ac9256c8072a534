"""tail(): read a run's journal from a cursor, live, from any process."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from functools import partial
from typing import TYPE_CHECKING

import anyio
import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from . import _aio
from ._db import MISSING_SCHEMA, Database, describe, out_of_date, statement_conn
from ._errors import InvalidInput, RunNotFound
from ._events import KEEPALIVE, TERMINAL_EVENT, Event
from ._gateway import tail as _gw
from ._gateway._exec import configure_own, run
from ._json import parse_run_id
from ._names import DEFAULT_SCHEMA, Channels, check_schema
from ._replica import ReplicaReader
from ._status import TERMINAL
from ._tailbatch import batcher
from ._tailtree import tail_tree

if TYPE_CHECKING:
    import uuid
    from collections.abc import AsyncIterator

    from ._gateway._exec import Plan
    from ._hub import NotifyHub

__all__ = ["check_tail", "read_plan", "settle", "tail"]

log = logging.getLogger("runrow.journal")


async def tail(
    db: Database,
    run_id: uuid.UUID | str,
    *,
    from_seq: int = 0,
    hub: NotifyHub | None = None,
    keepalive: float = 15.0,
    poll: float = 0.5,
    schema: str = DEFAULT_SCHEMA,
    batch: int = 500,
    prepared_statements: bool = True,
    tree: bool = False,
    read_from: Database | None = None,
    replica_lag_budget: float = 2.0,
) -> AsyncIterator[Event]:
    """Yields the run's events after ``from_seq``, live, until its terminal event.

    Any process can serve a tail. It subscribes before its catch-up read (so no event
    can slip between the two), yields every event with its ``seq`` (pass the last one
    back as ``from_seq`` to resume: no gap, no duplicate), yields a keepalive after
    ``keepalive`` idle seconds, and ends after the terminal event. If the run ended
    without a journaled terminal event, one is synthesised from the run row. Without
    a hub (or while it is down) it polls every ``poll`` seconds. With one, an idle tail
    waits for a notification, reading again at most every ``keepalive`` seconds; once a
    read finds rows that came without a notification (a hub behind a transaction
    pooler, a dispatcher whose flushes announce nothing), it polls every ``poll`` seconds
    until rows come announced again. A ``from_seq`` past the last event of the run's journal raises
    :class:`InvalidInput` (a trimmed journal ends with a synthesised event instead).
    Given an ``AsyncConnectionPool``, the tails of a process that wake together share
    one read (one statement for all of them). Given a conninfo string, it keeps one
    connection of its own;
    ``prepared_statements=False`` is for a conninfo that points at a
    transaction-pooling pgbouncer.

    ``tree=True`` reads the tree of a root turn instead: the root's events and those of
    every run it spawned, at any depth, in one stream with positions of its own (each
    event's ``seq``, gap-free from 1: pass the last one back as ``from_seq`` to resume),
    each event tagged with its run (``run_id``) and its seq there (``run_seq``). The
    stream ends after the root's ending, which comes once every run of the tree has
    ended. A child's id is refused (tail its root's tree); a root's retry reads its
    root's tree. Reading a tree writes its order down (see ``runrow._tailtree``): it
    needs the primary: ``read_from`` with ``tree=True`` is refused (:class:`InvalidInput`).

    ``read_from`` (a conninfo, pool or connection of a hot standby of ``db``) serves the
    events and the run's ending from the standby; ``db`` stays the primary, for the hub
    and for the reads the standby cannot serve. A tail's first read, and a read a
    notification asked for, go to the standby once it has replayed what the primary had
    then, or, past ``replica_lag_budget`` seconds, to the primary; a standby that cannot be
    reached sends the reads to the primary until it is back. A lagging standby only makes
    events late: none is skipped or repeated (see ``runrow._replica``).
    """
    rid = check_tail(run_id, from_seq=from_seq, keepalive=keepalive, poll=poll, schema=schema)
    if read_from is not None and tree:
        raise InvalidInput("read_from", "a tree's tail writes its order down: it reads the primary only")
    if replica_lag_budget < 0:
        raise InvalidInput("replica_lag_budget", "must be zero or more seconds")
    if tree:
        async for event in tail_tree(
            db,
            rid,
            from_seq=from_seq,
            hub=hub,
            keepalive=keepalive,
            poll=poll,
            schema=schema,
            batch=batch,
            prepared_statements=prepared_statements,
        ):
            yield event
        return
    cursor = from_seq
    async with AsyncExitStack() as stack:
        own = isinstance(db, str)  # then the tail keeps one connection of its own
        conn_box: list[AsyncConnection] = []
        sub = None
        if hub is not None and hub.running:
            sub = await stack.enter_async_context(hub.subscribe(Channels.for_schema(schema).events(rid)))
        stack.push_async_callback(_close_all, conn_box)
        replica = None
        if read_from is not None:
            replica = ReplicaReader(db, read_from, schema, replica_lag_budget, prepared_statements, read_plan)
            stack.push_async_callback(replica.close)
        idle_since = _aio.now()
        backoff = poll
        # A connected hub's hints are trusted (an idle tail then waits for one, up to
        # the keepalive: a thousand tails of queued runs cost a read each per keepalive)
        # until a read finds rows that came without one, the evidence of a hub that
        # hears nothing for this run (unannounced flushes, a hub behind pgbouncer):
        # then the tail polls, until rows come announced again.
        trusted = True
        caught_up = False  # rows of the first read predate the subscription: no evidence
        heard = 0  # the subscription's notification count at the previous read
        more = False  # the previous read filled a batch: this one is its continuation
        while True:
            hints = sub.notified if sub is not None else 0
            read = False
            try:
                # (schema_guard's work, without a context manager per read: see _db.)
                if replica is None:
                    rows, state = await _read(
                        db, conn_box, own, schema, rid, cursor, batch, prepared_statements
                    )
                else:
                    # A first read, or one after a notification (a continuation's too:
                    # the hint is consumed by this read), must see what the primary had
                    # then; any other may be late (see _replica).
                    synced = not caught_up or hints != heard
                    rows, state = await replica.read(
                        rid,
                        cursor,
                        batch,
                        woken_at=_aio.now() if synced else None,
                        primary=partial(
                            _read, db, conn_box, own, schema, rid, cursor, batch, prepared_statements
                        ),
                    )
                read = True
            except MISSING_SCHEMA as exc:
                raise await out_of_date(db, schema) from exc
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                # The database is unreachable for now: a tail waits it out (keepalives
                # continue), reconnecting as needed. A dropped read only costs latency.
                log.info(
                    "tail of run %s cannot read (%s); retrying",
                    rid,
                    describe(exc),
                    extra={"run_id": str(rid)},
                )
                await _close_all(conn_box)  # (a pool's batcher checks the pool itself)
                rows, state = [], None
                backoff = min(backoff * 2, keepalive)
            if rows and not more and caught_up:
                trusted = hints != heard  # a hint came since the last read: announced
            heard, more = hints, len(rows) == batch
            if read:
                caught_up = True
                backoff = poll
            for event in rows:
                cursor = event.seq
                yield event
                if event.type == TERMINAL_EVENT:
                    return
            if rows:
                idle_since = _aio.now()
                if len(rows) == batch:
                    continue
            elif state is not None and (ending := settle(state, cursor, rid)) is not None:
                for event in ending:
                    yield event
                return
            now = _aio.now()
            if now - idle_since >= keepalive:
                yield Event(cursor, KEEPALIVE)
                idle_since = now
            wait = max(0.0, idle_since + keepalive - now)
            # A read that failed retries on its backoff: a hint may have come and gone
            # with it (the reads of a batch fail together, so this is not one tail's wait).
            if not read or sub is None or hub is None or not hub.connected or not trusted:
                wait = min(wait, backoff)
            if sub is not None:
                await sub.wait(wait)
            else:
                await anyio.sleep(wait)


async def _read(
    db: Database,
    conn_box: list[AsyncConnection],
    own: bool,
    schema: str,
    rid: uuid.UUID,
    cursor: int,
    batch: int,
    prepared_statements: bool = True,
) -> tuple[list[Event], _gw.RunEnd | None]:
    """Events after ``cursor``; when there are none, the run's ending as well."""
    if own:
        if not conn_box or conn_box[0].closed:
            assert isinstance(db, str)
            conn = await AsyncConnection.connect(
                db, autocommit=True, prepare_threshold=5 if prepared_statements else None
            )
            conn_box[:] = [conn]
            if prepared_statements:  # a direct connection (see configure_own)
                await configure_own(conn)
        source: Database = conn_box[0]
    elif isinstance(db, AsyncConnectionPool):
        # The tails on a pool that wake together share one read (see _tailbatch).
        return await batcher(db, schema).read(rid, cursor, batch)
    else:
        source = db
    async with statement_conn(source) as conn:
        return await run(conn, read_plan(schema, rid, cursor, batch))


def check_tail(
    run_id: uuid.UUID | str, *, from_seq: int, keepalive: float, poll: float, schema: str
) -> uuid.UUID:
    """The checks of a tail's arguments (async and sync); the run's id."""
    check_schema(schema)
    rid = parse_run_id(run_id)
    if not isinstance(from_seq, int) or isinstance(from_seq, bool) or from_seq < 0:
        raise InvalidInput("from_seq", "must be a non-negative integer")
    if keepalive <= 0 or poll <= 0:
        raise InvalidInput("keepalive", "keepalive and poll must be positive")
    return rid


def read_plan(
    schema: str, rid: uuid.UUID, cursor: int, batch: int
) -> Plan[tuple[list[Event], _gw.RunEnd | None]]:
    """Events after ``cursor``; when there are none, the run's ending as well."""
    rows = yield from _gw.read_events(schema, run_id=rid, after=cursor, limit=batch)
    if rows:
        return rows, None
    state = yield from _gw.run_terminal_state(schema, run_id=rid)
    if state is None:
        raise RunNotFound(rid)
    if state.status in TERMINAL:
        # The ending commits the status with its event: read once more.
        rows = yield from _gw.read_events(schema, run_id=rid, after=cursor, limit=batch)
    return rows, state


def settle(state: _gw.RunEnd, cursor: int, rid: uuid.UUID) -> list[Event] | None:
    """After a read that found nothing past ``cursor``: None to keep waiting, or the
    tail's last events (none, or a synthesised ending) before it ends."""
    if state.last_seq is not None and cursor > state.last_seq:
        # Seq is gap-free and a tail yields only committed events: this cursor is
        # not from this run's stream. Waiting would skip the events up to it
        # silently, or end with nothing; the client should resume from its last
        # seq (or 0) instead.
        raise InvalidInput(
            "from_seq",
            f"{cursor} is past the end of run {rid}'s journal (its last seq is {state.last_seq})",
        )
    if state.status not in TERMINAL:
        return None
    if state.journaled_end:
        return []  # resumed past the journaled ending: nothing is left to send
    # Terminal without a journaled ending (e.g. a trimmed journal): say so.
    return [
        Event(cursor + 1, TERMINAL_EVENT, {"status": state.status, "error": state.error, "synthesized": True})
    ]


async def _close_all(conn_box: list[AsyncConnection]) -> None:
    for c in conn_box:
        with anyio.CancelScope(shield=True):
            await c.close()
    conn_box.clear()
