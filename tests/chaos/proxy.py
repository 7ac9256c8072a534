"""A small TCP proxy between the workers and PostgreSQL that can cut or delay connections.

``cut(fraction)`` closes that share of the open connections (both sides, at once);
``delay = seconds`` holds every chunk that long before forwarding it, in both
directions, until set back to 0. ``lose_answer_to(marker)`` lets the next request that
carries ``marker`` through, then closes that connection when the server answers it,
dropping the answer: the server has done the work, but the client sees its connection
die. For a statement in its own implicit transaction whose result fits the server's
send buffer and that raises no notice, the work is committed by then: PostgreSQL sends
such a result only when it reports ready for the next query, after the commit. A connection attempt while the server is down is
closed at once, as the server itself would refuse it. ``refuse_new = True`` closes
every new connection at once (those open go on): a client's cancel request, which
needs a connection of its own, then cannot reach the server.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import anyio
import anyio.abc

if TYPE_CHECKING:
    from anyio.abc import SocketStream, TaskGroup


class _Pair:
    __slots__ = ("lose_answer", "scope")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.lose_answer = False


class Proxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.port = 0
        self.delay = 0.0
        self.accepted = 0
        self.cuts = 0
        self.answers_lost = 0
        self.requests_dropped = 0
        self.refuse_new = False
        self._pairs: set[_Pair] = set()
        self._marker: bytes | None = None
        self._drop_marker: bytes | None = None

    @property
    def open_connections(self) -> int:
        return len(self._pairs)

    async def start(self, tg: TaskGroup) -> int:
        """Starts listening on 127.0.0.1 (a free port); serves in ``tg``. Returns the port."""
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        tg.start_soon(self._serve, listener)
        return self.port

    async def _serve(self, listener: anyio.abc.SocketListener) -> None:
        async with listener:  # closed when serving is cancelled
            await listener.serve(self._handle)

    def cut(self, fraction: float = 1.0, rng: random.Random | None = None) -> int:
        """Closes ``fraction`` of the open connections; returns how many."""
        pairs = list(self._pairs)
        rng = rng or random.Random()
        chosen = [p for p in pairs if rng.random() < fraction] if fraction < 1.0 else pairs
        for p in chosen:
            p.scope.cancel()
        self.cuts += len(chosen)
        return len(chosen)

    def lose_answer_to(self, marker: bytes) -> None:
        """One shot: the answer to the next request carrying ``marker`` is dropped and
        its connection closed."""
        self._marker = marker

    def drop_request_with(self, marker: bytes) -> None:
        """One shot: the next request carrying ``marker`` is not sent on, and its
        connection is closed (the statement never reaches the server)."""
        self._drop_marker = marker

    async def _handle(self, client: SocketStream) -> None:
        self.accepted += 1
        pair = _Pair()
        async with client:
            if self.refuse_new:
                return
            try:
                with anyio.fail_after(5):
                    upstream = await anyio.connect_tcp(self.upstream_host, self.upstream_port)
            except (OSError, TimeoutError):
                return
            async with upstream:
                self._pairs.add(pair)
                try:
                    with pair.scope:
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(self._pump, client, upstream, tg, pair, True)
                            tg.start_soon(self._pump, upstream, client, tg, pair, False)
                finally:
                    self._pairs.discard(pair)

    async def _pump(
        self, src: SocketStream, dst: SocketStream, tg: TaskGroup, pair: _Pair, upstream: bool
    ) -> None:
        try:
            while True:
                data = await src.receive(65536)
                if upstream and self._drop_marker is not None and self._drop_marker in data:
                    self._drop_marker = None
                    self.requests_dropped += 1
                    break  # not sent on; the pair is closed below
                if upstream and self._marker is not None and self._marker in data:
                    self._marker, pair.lose_answer = None, True
                elif not upstream and pair.lose_answer:
                    self.answers_lost += 1
                    break  # drop the answer; the pair is closed below
                if self.delay > 0:
                    await anyio.sleep(self.delay)
                await dst.send(data)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        # One side ended: end the whole pair.
        tg.cancel_scope.cancel()
