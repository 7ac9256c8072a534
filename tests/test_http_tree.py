"""A tree's stream over HTTP (#41 point 4): ``GET /v1/runs/{root}/events?tree=true`` in
runrow's format, the AI SDK's and AG-UI's, cut at random while the tree runs and resumed
with ``Last-Event-ID``; what the client pieces together is the whole stream, and the AI
SDK's and AG-UI's own clients (tests/node) rebuild the root's answer with each sub-agent
as a part. The chat endpoints stream trees with ``create_api(tree_streams=True)``."""

from __future__ import annotations

import json
import random
import uuid
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.routing import Mount

import runrow
from runrow.http import create_api

from .demo_support import serve_asgi
from .protocol_support import require_node_clients
from .test_http_protocols import ALICE, _user, last_id, read_blocks, rebuild

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

pytestmark = [pytest.mark.anyio, pytest.mark.node]

TOPICS = ("tides", "moons", "orbits")


async def researcher(run: runrow.RunContext) -> None:
    for i in range(4):
        await run.text(f"{run.content}{i} ")
        await run.flush()
        await anyio.sleep(0.01)
    await run.write_message(f"notes on {run.content}")


async def orchestrator(run: runrow.RunContext) -> None:
    await run.text("Planning. ")
    kids = await run.spawn_many([("researcher", t) for t in TOPICS])
    results = await run.wait_for_children(kids)
    await run.text("Done: " + ", ".join(r.get() for r in results))
    await run.write_message("done")


@asynccontextmanager
async def serve(dsn: str, schema: str) -> AsyncIterator[tuple[httpx.AsyncClient, AsyncConnectionPool[Any]]]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, open=False, kwargs={"autocommit": True})
    hub = runrow.NotifyHub(dsn)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(pool)
            await stack.enter_async_context(hub)
            await stack.enter_async_context(
                runrow.Dispatcher(
                    dsn,
                    orchestrator,
                    agents={"researcher": researcher},
                    schema=schema,
                    hub=hub,
                    poll=0.2,
                    flush_interval=0.01,
                    concurrency=4,
                )
            )
            yield

    api = create_api(pool, authenticate=_user, hub=hub, schema=schema, tree_streams=True)
    app = Starlette(routes=[Mount("/api", app=api)])
    app.router.lifespan_context = lifespan
    async with serve_asgi(app) as base, httpx.AsyncClient(base_url=f"{base}/api", timeout=30) as client:
        yield client, pool


@pytest.fixture(autouse=True)
def _node_clients() -> None:
    require_node_clients()


async def _post(client: httpx.AsyncClient, cid: str) -> str:
    resp = await client.post(f"/v1/conversations/{cid}/messages", json={"content": "space"}, headers=ALICE)
    assert resp.status_code == 202, resp.text
    run_id: str = resp.json()["run_id"]
    return run_id


def _data(blocks: list[str]) -> list[dict[str, Any]]:
    return [
        json.loads(line[5:])
        for b in blocks
        for line in b.splitlines()
        if line.startswith("data:") and line[5:].strip() != "[DONE]"
    ]


@pytest.mark.parametrize("fmt", ["runrow", "ai-sdk", "ag-ui"])
async def test_a_live_trees_stream_cut_at_random_and_resumed_is_whole(
    dsn: str, schema: str, fmt: str, tmp_path: Path
) -> None:
    rng = random.Random(fmt)
    async with serve(dsn, schema) as (client, pool):
        cid = f"tree-{fmt}"
        root = await _post(client, cid)
        url = f"/v1/runs/{root}/events?tree=true&format={fmt}"
        pieces: list[str] = []
        headers = dict(ALICE)
        for _ in range(rng.randint(2, 4)):
            resp, got = await read_blocks(client, "GET", url, headers=headers, stop_after=rng.randint(1, 6))
            assert resp.status_code == 200
            pieces += got
            headers = {**ALICE, "Last-Event-ID": last_id(pieces)}
        resp, rest = await read_blocks(client, "GET", url, headers=headers)
        assert resp.status_code in (200, 204)
        pieces += rest
        _, whole = await read_blocks(client, "GET", url, headers=ALICE)
        assert pieces == whole  # nothing lost, nothing repeated, the same ids
        done = await client.get(url, headers={**ALICE, "Last-Event-ID": last_id(whole)})
        assert done.status_code == 204  # the tree has ended: an EventSource stops here

        tree = [e async for e in runrow.tail(pool, root, schema=schema, tree=True) if not e.keepalive]
        children = {str(e.run_id) for e in tree} - {root}
        assert len(children) == 3
        if fmt == "runrow":
            got_events = _data(whole)
            assert [d["seq"] for d in got_events] == list(range(1, len(tree) + 1))
            assert [(d["run_id"], d["run_seq"], d["type"]) for d in got_events] == [
                (str(e.run_id), e.run_seq, e.type) for e in tree
            ]
        elif fmt == "ai-sdk":
            message = rebuild(fmt, whole, tmp_path, cid)["message"]
            parts = {p["id"]: p["data"] for p in message["parts"] if p["type"] == "data-runrow-child"}
            assert set(parts) == {f"child-{c}" for c in children}
            for data in parts.values():
                assert data["status"] == "completed"
                topic = next(t for t in TOPICS if data["text"].startswith(t))
                assert data["text"] == "".join(f"{topic}{i} " for i in range(4))
            text = "".join(p["text"] for p in message["parts"] if p["type"] == "text")
            assert text.startswith("Planning. ") and "notes on tides" in text
            chunk_types = [c["type"] for c in _data(whole)]
            assert chunk_types.count("finish") == 1 and chunk_types[-1] == "finish"
        else:
            result = rebuild(fmt, whole, tmp_path, cid)
            types = [e["type"] for e in result["events"]]
            assert (
                types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED" and types.count("RUN_FINISHED") == 1
            )
            child_events = [e["value"] for e in result["events"] if e.get("name") == "runrow.child"]
            assert {v["runId"] for v in child_events} == children
            assert sum(1 for v in child_events if v["type"] == "complete") == 3
            said = "".join(m.get("content") or "" for m in result["messages"] if m["role"] == "assistant")
            assert "notes on moons" in said


async def test_a_childs_tree_and_a_bad_flag_are_refused_and_the_chat_post_streams_the_tree(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    async with serve(dsn, schema) as (client, pool):
        resp, blocks = await read_blocks(
            client,
            "POST",
            "/v1/ai-sdk/chat",
            headers=ALICE,
            json={
                "id": "chat-tree",
                "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "space"}]}],
            },
        )
        assert resp.status_code == 200
        root = resp.headers["x-runrow-run-id"]
        message = rebuild("ai-sdk", blocks, tmp_path, "chat-tree")["message"]
        assert sum(1 for p in message["parts"] if p["type"] == "data-runrow-child") == 3
        tree = [e async for e in runrow.tail(pool, root, schema=schema, tree=True) if not e.keepalive]
        child = next(str(e.run_id) for e in tree if str(e.run_id) != root)
        refused = await client.get(f"/v1/runs/{child}/events?tree=true", headers=ALICE)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "not_a_root"
        bad = await client.get(f"/v1/runs/{root}/events?tree=maybe", headers=ALICE)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_tree"
        # A child's own stream is still there, without the flag.
        own = await client.get(f"/v1/runs/{child}/events", headers=ALICE)
        assert own.status_code in (200, 204)
        assert uuid.UUID(root)
