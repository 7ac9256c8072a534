"""NotifyHub: one LISTEN connection, bounded lossy buffers, reconnect and re-LISTEN."""

from __future__ import annotations

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._hub import RECONNECTED, check_channel

from .chaos.proxy import Proxy
from .helpers import wait_for

pytestmark = pytest.mark.anyio


async def _notify(conn: psycopg.AsyncConnection, channel: str, payload: str = "") -> None:
    await conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def test_subscribers_get_hints_and_a_wake_once_listening(
    dsn: str, conn: psycopg.AsyncConnection
) -> None:
    async with (
        runrow.NotifyHub(dsn) as hub,
        hub.subscribe("hub_a") as a1,
        hub.subscribe("hub_a") as a2,
        hub.subscribe("hub_b") as b,
    ):
        # Each subscription is told once the LISTEN is in place: re-read, you may have missed something.
        assert await a1.receive() == RECONNECTED
        assert await a2.receive() == RECONNECTED
        assert await b.receive() == RECONNECTED
        await _notify(conn, "hub_a", "x")
        assert await a1.receive() == "x" and await a2.receive() == "x"
        await _notify(conn, "hub_b", "y")
        assert await b.receive() == "y"
        assert a1.drain() == [] and a2.drain() == []  # hub_b's hint went only to b


async def test_one_connection_serves_every_channel(dsn: str, conn: psycopg.AsyncConnection) -> None:
    async with runrow.NotifyHub(dsn) as hub, anyio.create_task_group() as tg:
        ready = 0

        async def listen(i: int) -> None:
            nonlocal ready
            async with hub.subscribe(f"many_{i}") as sub:
                await sub.receive()
                ready += 1
                await sub.receive()

        for i in range(200):
            tg.start_soon(listen, i)
        await wait_for(lambda: ready == 200, what="200 channels listening")
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid = %s",
            (hub.backend_pid,),
        )
        assert (await cur.fetchone())[0] == 1  # type: ignore[index]
        cur = await conn.execute("SELECT count(*) FROM pg_listening_channels()")  # ours: none
        assert (await cur.fetchone())[0] == 0  # type: ignore[index]
        for i in range(200):
            await _notify(conn, f"many_{i}")


async def test_a_full_buffer_drops_hints_instead_of_blocking(dsn: str, conn: psycopg.AsyncConnection) -> None:
    async with runrow.NotifyHub(dsn, buffer=2) as hub, hub.subscribe("tiny") as sub:
        assert await sub.receive() == RECONNECTED
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            for i in range(10):
                await _notify(other, "tiny", str(i))
            await _notify(other, "tiny_sentinel")
        async with hub.subscribe("tiny_probe") as probe:
            await probe.receive()
            await _notify(conn, "tiny_probe")
            await probe.receive()  # the hub kept running while tiny's buffer was full
        await wait_for(lambda: sub.dropped == 8, what="eight dropped hints")
        assert sub.drain() == ["0", "1"]


async def test_the_hub_reconnects_after_its_backend_is_killed(
    dsn: str, conn: psycopg.AsyncConnection
) -> None:
    async with runrow.NotifyHub(dsn, probe_interval=0.5) as hub, hub.subscribe("survivor") as sub:
        assert await sub.receive() == RECONNECTED
        old = hub.backend_pid
        await conn.execute("SELECT pg_terminate_backend(%s)", (old,))
        with anyio.fail_after(10):
            assert await sub.receive() == RECONNECTED  # re-LISTENed, and told to re-read
        assert hub.reconnects == 1 and hub.backend_pid != old
        await _notify(conn, "survivor", "after")
        with anyio.fail_after(5):
            assert await sub.receive() == "after"


async def test_a_hub_that_cannot_connect_does_not_block_its_owner() -> None:
    hub = runrow.NotifyHub("host=127.0.0.1 port=1 connect_timeout=1", connect_timeout=1, max_backoff=0.2)
    with anyio.fail_after(10):
        async with hub, hub.subscribe("nobody_home") as sub:
            assert not hub.connected
            assert not await sub.wait(0.2)  # waiters simply time out and poll


def test_channel_names_are_checked() -> None:
    assert check_channel("x" * 63)
    for bad in ("", "x" * 64, "é" * 32, "a\x00b"):
        with pytest.raises(runrow.InvalidInput):
            check_channel(bad)


async def test_subscribe_needs_a_running_hub(dsn: str) -> None:
    hub = runrow.NotifyHub(dsn)
    with pytest.raises(RuntimeError, match="not running"):
        async with hub.subscribe("x"):
            pass


async def test_channels_with_awkward_names_are_quoted(dsn: str, conn: psycopg.AsyncConnection) -> None:
    name = 'Weird "Chan"; LISTEN x'
    async with runrow.NotifyHub(dsn) as hub, hub.subscribe(name) as sub:
        await sub.receive()
        await conn.execute(sql.SQL("NOTIFY {}, 'ok'").format(sql.Identifier(name)))
        with anyio.fail_after(5):
            assert await sub.receive() == "ok"


async def test_resubscribing_while_the_unlisten_is_in_flight_is_not_deaf(
    dsn: str, conn: psycopg.AsyncConnection
) -> None:
    """An SSE client reconnects to the same run: its old subscription ends (the hub
    UNLISTENs) and the new one starts on the same channel while that UNLISTEN is still
    in flight. The hub reaches the server through a proxy that delays every chunk, and
    the new subscription starts once the server has applied the UNLISTEN but before the
    hub has its answer. The new subscriber must hear the channel's next notification."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    host = str(params.get("host") or "127.0.0.1")
    proxy = Proxy("127.0.0.1" if host.startswith("/") else host, int(params.get("port") or 5432))
    channel = "hub_resubscribe"
    async with anyio.create_task_group() as tg:
        port = await proxy.start(tg)
        proxied = psycopg.conninfo.make_conninfo(
            dsn, host="127.0.0.1", port=port, sslmode="disable", gssencmode="disable"
        )
        async with runrow.NotifyHub(proxied) as hub:
            async with hub.subscribe(channel) as old:
                with anyio.fail_after(10):
                    assert await old.receive() == RECONNECTED
                proxy.delay = 0.3
            # The old subscription is gone: the hub now UNLISTENs, slowly.

            async def unlisten_applied_not_answered() -> bool:
                cur = await conn.execute(
                    "SELECT query FROM pg_stat_activity WHERE pid = %s", (hub.backend_pid,)
                )
                row = await cur.fetchone()
                return row is not None and str(row[0]).startswith("UNLISTEN")

            await wait_for(unlisten_applied_not_answered, interval=0.01, what="the UNLISTEN in flight")
            async with hub.subscribe(channel) as new:
                proxy.delay = 0
                got: list[str] = []
                with anyio.move_on_after(5):
                    while "ping" not in got:
                        await _notify(conn, channel, "ping")
                        with anyio.move_on_after(0.2):
                            got.append(await new.receive())
                assert "ping" in got, "the resubscribed channel never heard its notification"
        tg.cancel_scope.cancel()
