"""``create_api(..., read_pool=standby_pool)``: the event streams read the standby."""

from __future__ import annotations

import uuid
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.routing import Mount

import runrow
from runrow import _replica
from runrow.http import create_api

from .demo_support import serve_asgi
from .replica import primary_and_standby, replayed
from .test_http_protocols import ALICE, _user, read_blocks

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from runrow.embedded import EmbeddedPostgres

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    yield from primary_and_standby()


async def agent(run: runrow.RunContext) -> None:
    for i in range(20):
        await run.text(f"w{i} ")
        await run.flush()
        await anyio.sleep(0.01)


async def test_the_api_streams_events_from_the_read_pool(
    servers: tuple[EmbeddedPostgres, EmbeddedPostgres],
) -> None:
    p, s = servers[0].conninfo(), servers[1].conninfo()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    await runrow.migrate(p, schema=schema)
    with anyio.fail_after(30):
        while not replayed(s, p):
            await anyio.sleep(0.05)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(p, open=False, kwargs={"autocommit": True})
    read_pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        s, open=False, kwargs={"autocommit": True}, timeout=2
    )
    hub = runrow.NotifyHub(p)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            for cm in (pool, read_pool, hub):
                await stack.enter_async_context(cm)  # type: ignore[arg-type]
            await stack.enter_async_context(
                runrow.Dispatcher(p, agent, schema=schema, hub=hub, poll=0.2, flush_interval=0.01)
            )
            yield

    api = create_api(pool, authenticate=_user, hub=hub, schema=schema, read_pool=read_pool)
    app = Starlette(routes=[Mount("/api", app=api)])
    app.router.lifespan_context = lifespan
    before = _replica.STATS["replica_reads"]
    async with serve_asgi(app) as base, httpx.AsyncClient(base_url=f"{base}/api", timeout=30) as client:
        resp = await client.post("/v1/conversations/c1/messages", json={"content": "x"}, headers=ALICE)
        assert resp.status_code == 202, resp.text
        rid = resp.json()["run_id"]
        resp, blocks = await read_blocks(client, "GET", f"/v1/runs/{rid}/events", headers=ALICE)
        assert resp.status_code == 200
    ids = [int(line[3:].strip()) for b in blocks for line in b.splitlines() if line.startswith("id:")]
    async with await psycopg.AsyncConnection.connect(p, autocommit=True) as conn:
        cur = await conn.execute(f"SELECT seq FROM {schema}.run_event WHERE run_id = %s ORDER BY seq", (rid,))
        assert ids == [r[0] for r in await cur.fetchall()]
    assert _replica.STATS["replica_reads"] > before
