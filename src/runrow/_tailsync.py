"""The synchronous tail's loop (``runrow.sync.tail``): the async tail's reads, cursor and
endings, polling, without a notification hub; optionally on a hot standby."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool

from . import _syncdb
from ._db import describe
from ._errors import RunNotFound
from ._events import KEEPALIVE, TERMINAL_EVENT, Event
from ._gateway._exec import configure_own_sync, run_sync
from ._replica import RETRY as REPLICA_RETRY
from ._tail import read_plan, settle

if TYPE_CHECKING:
    import uuid
    from collections.abc import Iterator

    from ._syncdb import SyncDatabase

__all__ = ["tail_sync"]

log = logging.getLogger("runrow.journal")


def tail_sync(
    db: SyncDatabase,
    rid: uuid.UUID,
    from_seq: int,
    keepalive: float,
    poll: float,
    schema: str,
    batch: int,
    prepared_statements: bool,
    read_from: SyncDatabase | None = None,
) -> Iterator[Event]:
    """:func:`runrow.sync.tail`'s loop (its arguments checked), polling ``db`` or, given
    ``read_from``, a standby of it."""
    cursor, backoff, idle_since = from_seq, poll, time.monotonic()
    own: list[Connection[Any]] = []  # (the connection of a conninfo, per source)
    replica: list[Connection[Any]] = []
    replica_down_until = 0.0

    def read(source: SyncDatabase, box: list[Connection[Any]]) -> tuple[list[Event], Any]:
        if isinstance(source, str) and (not box or box[0].closed):
            box[:] = [
                Connection.connect(
                    source, autocommit=True, prepare_threshold=5 if prepared_statements else None
                )
            ]
            if prepared_statements:  # a direct connection (see configure_own)
                configure_own_sync(box[0])
        with _syncdb.schema_guard(source, schema), _syncdb.statement_conn(box[0] if box else source) as conn:
            return run_sync(conn, read_plan(schema, rid, cursor, batch))

    try:
        while True:
            try:
                if read_from is not None and time.monotonic() >= replica_down_until:
                    try:
                        try:
                            rows, state = read(read_from, replica)
                        except RunNotFound:  # (made on the primary, not replayed here yet)
                            rows, state = read(db, own)
                        if (
                            not rows
                            and state is not None
                            and state.last_seq is not None
                            and cursor > state.last_seq
                        ):
                            state = None  # the standby is behind this tail's cursor: nothing yet
                    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                        log.warning(
                            "tail of run %s cannot read the replica (%s); reading the primary",
                            rid,
                            describe(exc),
                        )
                        for c in replica:
                            c.close()
                        replica_down_until = time.monotonic() + REPLICA_RETRY
                        rows, state = read(db, own)
                else:
                    rows, state = read(db, own)
                backoff = poll
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                # As the async tail: wait the database out, reconnecting as needed.
                log.info(
                    "tail of run %s cannot read (%s); retrying",
                    rid,
                    describe(exc),
                    extra={"run_id": str(rid)},
                )
                for c in own:
                    c.close()
                if isinstance(db, ConnectionPool):
                    db.check()  # weed out the pool's dead connections
                rows, state, backoff = [], None, min(backoff * 2, keepalive)
            for event in rows:
                cursor = event.seq
                yield event
                if event.type == TERMINAL_EVENT:
                    return
            now = time.monotonic()
            if rows:
                idle_since = now
                if len(rows) == batch:
                    continue
            elif state is not None and (ending := settle(state, cursor, rid)) is not None:
                yield from ending
                return
            if now - idle_since >= keepalive:
                yield Event(cursor, KEEPALIVE)
                idle_since = now
            time.sleep(min(backoff, max(0.0, idle_since + keepalive - now)))
    finally:
        for c in own + replica:
            c.close()
