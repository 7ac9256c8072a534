"""Runs one bound statement on a connection, with JIT off (see sql/session.sql).

The gateway's modules call :func:`execute`; nothing else in runrow runs SQL text.
"""

from __future__ import annotations

import weakref
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from psycopg.pq import TransactionStatus

from .. import _sql

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from psycopg import AsyncConnection, AsyncCursor

# -- JIT: no runrow statement is ever compiled (see sql/session.sql) --------------------

# Connections whose session runrow itself set to jit = off (its own, direct connections).
_JIT_OFF: weakref.WeakSet[AsyncConnection] = weakref.WeakSet()

# Connections to a server that cannot compile at all (no JIT provider: built without
# LLVM, like the embedded wheel's), and to one that can. Asked once per connection
# (see _no_jit); a connection in neither set has not been asked yet.
_NO_JIT: weakref.WeakSet[AsyncConnection] = weakref.WeakSet()
_CAN_JIT: weakref.WeakSet[AsyncConnection] = weakref.WeakSet()

# Connections inside a transaction runrow opened itself (see own_transaction), and
# whether JIT is already off in it: once it is, the rest of the transaction runs plainly.
_OWN_TX: weakref.WeakKeyDictionary[AsyncConnection, bool] = weakref.WeakKeyDictionary()


async def configure_own(conn: AsyncConnection) -> None:
    """Turns JIT off for the session of a connection runrow opened and keeps to itself.

    One statement per connection, none per statement afterwards. Only for direct
    connections: behind a transaction pooler the next statement may run on another
    server session, so those connections take the per-statement guard of :func:`execute`.
    """
    await conn.execute(_sql.statement("jit_off_session", "public"))
    _JIT_OFF.add(conn)


async def _no_jit(conn: AsyncConnection) -> bool:
    """Whether ``conn``'s server cannot JIT-compile anything, so needs no guard.

    Asked once per connection, and only of an idle autocommit connection, where the
    probe is its own implicit transaction: on any other it would open or join a
    transaction of the host's, so that connection keeps the guard until it is idle.
    """
    if conn in _NO_JIT:
        return True
    if conn in _CAN_JIT or not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    cur = await conn.execute(_sql.statement("jit_provider_available", "public"))
    row = await cur.fetchone()
    (_CAN_JIT if row is not None and row[0] else _NO_JIT).add(conn)
    return conn in _NO_JIT


def jit_off_session(conn: AsyncConnection) -> bool:
    """Whether ``conn`` is one of runrow's own direct connections (see :func:`configure_own`)."""
    return conn in _JIT_OFF


async def execute(
    conn: AsyncConnection,
    query: bytes,
    params: Mapping[str, Any] | Sequence[Any] | None = None,
    *,
    cursor: AsyncCursor[Any] | None = None,
) -> AsyncCursor[Any]:
    """Runs one statement on ``conn`` with JIT off, and returns its cursor, results read.

    On a connection runrow configured itself, or to a server that cannot compile at all
    (no JIT provider, asked once per connection), this is a plain ``execute``. On any other
    (the host's pool or connection) the statement is pipelined behind a transaction-local
    ``jit = off``: one round trip still, and nothing of the host's session changes. In
    a transaction runrow opened on such a connection (:func:`own_transaction`) only its
    first statement takes that guard: the setting lasts until the transaction ends, and
    the later statements run plainly. In the host's own transaction every statement
    takes it, and the host's setting is put back in the same round trip.
    """
    cur = cursor if cursor is not None else conn.cursor()
    if conn in _JIT_OFF or await _no_jit(conn):
        await cur.execute(query, params)
        return cur
    joined = conn.info.transaction_status == TransactionStatus.INTRANS
    own = _OWN_TX.get(conn)
    if own is not None and joined:
        if own:
            await cur.execute(query, params)
        else:
            async with conn.pipeline():
                await conn.execute(_sql.statement("jit_off_local", "public"))
                await cur.execute(query, params)
            _OWN_TX[conn] = True
        return cur
    async with conn.pipeline():
        if joined:
            await conn.execute(_sql.statement("jit_save_off_local", "public"))
        else:
            await conn.execute(_sql.statement("jit_off_local", "public"))
        await cur.execute(query, params)
        if joined:
            await conn.execute(_sql.statement("jit_restore_local", "public"))
    return cur


@asynccontextmanager
async def own_transaction(conn: AsyncConnection) -> AsyncIterator[AsyncConnection]:
    """``conn.transaction()``, opened by runrow on a connection that was not inside one:
    :func:`execute` turns JIT off once for all of it (it ends with the transaction).

    Nothing inside may open a savepoint before the first statement: a savepoint rolled
    back would take the setting with it. runrow's own blocks open none.
    """
    if conn.autocommit:
        await _no_jit(conn)  # (asked while still idle: inside the transaction it cannot be)
    async with conn.transaction():
        if conn in _JIT_OFF or conn in _NO_JIT:
            yield conn
            return
        _OWN_TX[conn] = False
        try:
            yield conn
        finally:
            _OWN_TX.pop(conn, None)
