"""NotifyHub: one LISTEN connection per process, shared by every waiter in it.

Signals are hints, rows are truth. A notification only means "something may have
changed; read the rows". Subscribers hold bounded buffers that drop on overflow (a
pending hint already implies a wake), and every waiter also polls on a timeout, so a
lost hint, a dead listener or a hub that never connected costs latency, never
correctness.

The hub's connection must be a direct, session-long connection to PostgreSQL, never
one from a pool and never through a transaction-pooling pgbouncer: LISTEN belongs to
a server session, and a pooler hands the next statement to another session, which
silently stops the notifications.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import deque
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import psycopg
from psycopg import AsyncConnection, sql

from ._db import describe
from ._errors import InvalidInput
from ._names import MAX_IDENTIFIER_BYTES

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable
    from types import TracebackType

    from anyio.abc import TaskGroup, TaskStatus

__all__ = ["NotifyHub", "Subscription", "wait_any"]

log = logging.getLogger("runrow.hub")

RECONNECTED = "\x00reconnected"
"""Payload a subscriber receives after the hub (re)established LISTEN: re-read the rows."""


class Subscription:
    """A subscriber's view of one channel: a bounded buffer of hints.

    Plain asyncio underneath (a deque and a future to wake on): the hub pushes to a
    thousand of these at once when a thousand runs append together, and each tail
    waits on its own again after every read, so the wake is kept cheap. Waiting is
    cancelled by anyio's scopes like any other await.
    """

    def __init__(self, channel: str, buffer: int) -> None:
        self.channel = channel
        self._buffer = buffer
        self._hints: deque[str] = deque()
        self._waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self.dropped = 0
        self.notified = 0
        """How many notifications reached this subscription (``RECONNECTED`` wakes not
        counted): a waiter can tell whether its channel's writers announce themselves."""

    def _push(self, payload: str) -> None:
        if payload != RECONNECTED:
            self.notified += 1
        if self._closed:
            return
        if len(self._hints) >= self._buffer:
            # Full: a wake is already pending, and the consumer re-reads rows anyway.
            self.dropped += 1
            return
        self._hints.append(payload)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def receive(self) -> str:
        """The next hint's payload (``RECONNECTED`` after a (re)connect); raises
        :class:`anyio.EndOfStream` once the subscription has ended."""
        while not self._hints:
            await self._park(None)
        return self._hints.popleft()

    async def wait(self, timeout: float) -> bool:
        """Waits for a hint for at most ``timeout`` seconds; True if one came."""
        if not self._hints:
            await self._park(timeout)
            if not self._hints:
                return False
        self._hints.popleft()
        return True

    async def _park(self, timeout: float | None) -> None:
        """Until a hint comes, or ``timeout`` seconds pass."""
        if self._closed:
            raise anyio.EndOfStream
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.append(waiter)
        timer = None if timeout is None else loop.call_later(max(0.0, timeout), _wake, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.remove(waiter)
        if self._closed and not self._hints:
            raise anyio.EndOfStream

    def drain(self) -> list[str]:
        """Takes every hint already buffered, without waiting."""
        got = list(self._hints)
        self._hints.clear()
        return got

    def _close(self) -> None:
        self._closed = True
        self._hints.clear()
        for waiter in self._waiters:
            _wake(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def wait_any(subs: Iterable[Subscription], timeout: float) -> bool:
    """Waits for a hint on any of ``subs`` for at most ``timeout`` seconds (a tree's
    tail listens on each of its live runs); True if one came. Takes every hint buffered
    then: the caller reads the rows of all of them at once."""
    open_ = [s for s in subs if not s._closed]
    if not any(s._hints for s in open_):
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        for s in open_:
            s._waiters.append(waiter)
        timer = loop.call_later(max(0.0, timeout), _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            for s in open_:
                s._waiters.remove(waiter)
    came = False
    for s in open_:
        came = bool(s.drain()) or came
    return came


class NotifyHub:
    """Multiplexes every LISTEN channel a process needs over one dedicated connection.

    Use as an async context manager. ``subscribe(channel)`` yields a
    :class:`Subscription`. A single supervisor task owns the connection and every
    LISTEN/UNLISTEN, probes it with ``SELECT 1`` every ``probe_interval`` seconds
    (a half-open TCP connection can look alive for a long time), reconnects with
    capped exponential backoff, re-LISTENs every channel and then wakes every
    subscriber once, since notifications may have been lost meanwhile.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        probe_interval: float = 5.0,
        probe_timeout: float = 5.0,
        connect_timeout: float = 5.0,
        max_backoff: float = 5.0,
        buffer: int = 64,
    ) -> None:
        if buffer < 1:
            raise InvalidInput("buffer", "must be at least 1")
        self.conninfo = conninfo
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.connect_timeout = connect_timeout
        self.max_backoff = max_backoff
        self.buffer = buffer
        self.connected = False
        self.reconnects = 0
        """How many times the connection was re-established after a loss."""
        self.notifications = 0
        self.backend_pid: int | None = None
        self._subs: dict[str, set[Subscription]] = {}
        self._listening: set[str] = set()
        self._dirty = False
        self._closing = False
        self._wait_scope: anyio.CancelScope | None = None
        self._tg: TaskGroup | None = None
        self._tg_cm: TaskGroup | None = None

    # -- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> NotifyHub:
        self._closing = False
        self._tg_cm = anyio.create_task_group()
        self._tg = await self._tg_cm.__aenter__()
        await self._tg.start(self._supervise)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._tg is not None and self._tg_cm is not None
        self._closing = True  # subscribers leaving now need no UNLISTEN: the session ends
        self._tg.cancel_scope.cancel()
        try:
            return await self._tg_cm.__aexit__(exc_type, exc, tb)
        finally:
            self._tg = self._tg_cm = None
            for subs in self._subs.values():
                for s in subs:
                    s._close()
            self._subs.clear()
            self.connected = False

    @property
    def running(self) -> bool:
        return self._tg is not None

    # -- subscribing -----------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        """Listens on ``channel`` for the duration of the block.

        Returns at once; when the LISTEN is in place (and after every reconnect) the
        subscription receives a ``RECONNECTED`` hint, so a consumer that subscribes,
        reads its rows and then waits can never miss a change.
        """
        if not self.running:
            raise RuntimeError("NotifyHub is not running: use it as `async with NotifyHub(...)`")
        check_channel(channel)
        sub = Subscription(channel, self.buffer)
        peers = self._subs.setdefault(channel, set())
        first = not peers
        peers.add(sub)
        # The first subscriber always asks for a sync: the channel may still look
        # listened while its last subscriber's UNLISTEN is in flight (an SSE client
        # reconnecting to the same run), and would then be dropped after the UNLISTEN.
        if first or channel not in self._listening:
            self._kick()
        try:
            yield sub
        finally:
            peers.discard(sub)
            if not peers:
                del self._subs[channel]
                self._kick()
            sub._close()

    def _kick(self) -> None:
        if self._closing:
            return
        self._dirty = True
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    # -- the supervisor --------------------------------------------------------------

    async def _supervise(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        backoff = 0.05
        started = False
        first = True
        while True:
            conn: AsyncConnection | None = None
            try:
                with anyio.fail_after(self.connect_timeout + 1):
                    conn = await AsyncConnection.connect(
                        self.conninfo,
                        autocommit=True,
                        connect_timeout=max(1, math.ceil(self.connect_timeout)),
                        keepalives=1,
                        keepalives_idle=10,
                        keepalives_interval=5,
                        keepalives_count=3,
                    )
                self._listening = set()
                await self._sync(conn, wake_all=True)
                self.connected = True
                self.backend_pid = conn.info.backend_pid
                if not first:
                    self.reconnects += 1
                    log.info("notify hub reconnected", extra={"backend_pid": self.backend_pid})
                first = False
                backoff = 0.05
                if not started:
                    started = True
                    task_status.started()
                await self._listen(conn)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                if self.connected:
                    log.warning(
                        "notify hub lost its connection: %s",
                        describe(exc),
                        extra={"backend_pid": self.backend_pid},
                    )
                else:
                    log.debug("notify hub cannot connect: %s", describe(exc))
            finally:
                self.connected = False
                self._listening = set()
                if conn is not None:
                    with anyio.move_on_after(1, shield=True):
                        await conn.close()
            if not started:
                # Never block the host's start-up on the hub: everything polls meanwhile.
                started = True
                task_status.started()
            await anyio.sleep(backoff * (0.5 + random.random()))  # noqa: S311 - jitter
            backoff = min(backoff * 2, self.max_backoff)

    async def _listen(self, conn: AsyncConnection) -> None:
        next_probe = anyio.current_time() + self.probe_interval
        while True:
            if self._dirty:
                await self._sync(conn, wake_all=False)
            with anyio.CancelScope(deadline=next_probe) as scope:
                self._wait_scope = scope
                if self._dirty:  # a subscribe raced the sync above
                    scope.cancel()
                async for n in conn.notifies():
                    self.notifications += 1
                    for sub in tuple(self._subs.get(n.channel, ())):
                        sub._push(n.payload)
            self._wait_scope = None
            if anyio.current_time() >= next_probe:
                with anyio.fail_after(self.probe_timeout):
                    await conn.execute("SELECT 1")
                next_probe = anyio.current_time() + self.probe_interval

    async def _sync(self, conn: AsyncConnection, *, wake_all: bool) -> None:
        """Makes the connection's LISTEN set match the subscribed channels."""
        self._dirty = False
        wanted = set(self._subs)
        add = wanted - self._listening
        drop = self._listening - wanted
        stmts = [sql.SQL("LISTEN {}").format(sql.Identifier(c)) for c in sorted(add)]
        stmts += [sql.SQL("UNLISTEN {}").format(sql.Identifier(c)) for c in sorted(drop)]
        if stmts:
            # Shielded: a LISTEN cut off mid-flight would cost the whole connection.
            with anyio.CancelScope(shield=True), anyio.fail_after(self.probe_timeout):
                await conn.execute(sql.SQL("; ").join(stmts))
        self._listening = (self._listening | add) - drop
        # Whoever subscribed before the LISTEN was in place may have missed a change.
        for channel in wanted if wake_all else add:
            for sub in tuple(self._subs.get(channel, ())):
                sub._push(RECONNECTED)


def check_channel(channel: str) -> str:
    """A channel name must be non-empty text that fits Postgres's 63-byte identifier limit."""
    if not isinstance(channel, str) or not channel or "\x00" in channel:
        raise InvalidInput("channel", "must be a non-empty string without NUL characters")
    if len(channel.encode()) > MAX_IDENTIFIER_BYTES:
        raise InvalidInput(
            "channel", f"must be at most {MAX_IDENTIFIER_BYTES} bytes (LISTEN would silently truncate it)"
        )
    return channel
