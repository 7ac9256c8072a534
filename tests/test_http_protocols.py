"""The mounted API (runrow.http) streams real runs to the protocols' real clients.

A Dispatcher runs an agent that streams reasoning and text, calls a tool and may wait for
a person; the API is served by uvicorn; the bodies a client reads over HTTP (whole, or
cut at random points while the run is live and resumed with ``Last-Event-ID``) go to the
AI SDK's and AG-UI's own client code (tests/node), and what they rebuild must be what the
run's journal holds. Also the AI SDK's chat POST and its resume GET, and AG-UI's POST.
"""

from __future__ import annotations

import random
import uuid
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
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
from .protocol_support import require_node_clients, run_node_reader
from .test_protocol_clients import check_ag_ui, check_ai_sdk, expected

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from starlette.requests import Request

pytestmark = [pytest.mark.anyio, pytest.mark.node]

WORDS = [
    "the",
    "answer",
    "comes",
    "in",
    "many",
    "small",
    "pieces",
    "so",
    "that",
    "a",
    "cut",
    "can",
    "fall",
    "anywhere",
]


async def agent(run: runrow.RunContext) -> None:
    """Reasoning, text, a tool call, more text over time; with "approve" in the message it
    also waits for a person's yes before its last words; with "fail", it raises."""
    if "fail" in str(run.content):
        await run.text("Trying. ")
        raise QuotaExceeded("over the model's quota (3 requests/s)")
    await run.text("Thinking it over.", stream="reasoning")
    await run.text("Let me look. ")
    await run.emit(
        {"type": "tool_call_started", "tool_call_id": "call-1", "name": "lookup", "arguments": {"q": 1}}
    )
    await run.emit(
        {
            "type": "tool_call_finished",
            "tool_call_id": "call-1",
            "name": "lookup",
            "ok": True,
            "result": {"hits": 3},
        }
    )
    for word in WORDS:
        await run.text(word + " ")
        await run.flush()  # one event per word, written over time
        await anyio.sleep(0.01)
    if "approve" in str(run.content):
        answer = await run.wait_for_input("approve", {"question": "go on?"})
        await run.text(f"approved={answer}")
    await run.write_message("done")


class QuotaExceeded(Exception):
    pass


def _user(request: Request) -> str | None:
    return request.headers.get("x-user") or request.query_params.get("user") or None


ALICE = {"x-user": "alice"}


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
                runrow.Dispatcher(dsn, agent, schema=schema, hub=hub, poll=0.2, flush_interval=0.01)
            )
            yield

    app = Starlette(routes=[Mount("/api", app=create_api(pool, authenticate=_user, hub=hub, schema=schema))])
    app.router.lifespan_context = lifespan
    async with serve_asgi(app) as base, httpx.AsyncClient(base_url=f"{base}/api", timeout=30) as client:
        yield client, pool


async def read_blocks(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    json: Any = None,
    stop_after: int | None = None,
) -> tuple[httpx.Response, list[str]]:
    """The SSE messages (not comments) a client reads, as text blocks, until the stream
    ends or ``stop_after`` of them (then the connection is dropped)."""
    blocks: list[str] = []
    async with client.stream(method, url, headers=headers, json=json) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return resp, blocks
        async with aclosing(sse_blocks(resp)) as stream:
            async for block in stream:
                blocks.append(block)
                if stop_after is not None and len(blocks) >= stop_after:
                    break
    return resp, blocks


async def sse_blocks(resp: httpx.Response) -> AsyncIterator[str]:
    """The SSE messages (not comments) of an open response, as text blocks, as they come."""
    buffer = ""
    async for chunk in resp.aiter_text():
        buffer += chunk.replace("\r\n", "\n")
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            if any(line.startswith(("data:", "id:")) for line in block.splitlines()):
                yield block


def last_id(blocks: list[str]) -> str:
    ids = [line[3:].strip() for block in blocks for line in block.splitlines() if line.startswith("id:")]
    return ids[-1]


async def journal_of(pool: AsyncConnectionPool[Any], run_id: str, schema: str) -> list[runrow.Event]:
    return [e async for e in runrow.tail(pool, run_id, schema=schema) if not e.keepalive]


def rebuild(kind: str, blocks: list[str], tmp_path: Path, thread: str) -> dict[str, Any]:
    path = tmp_path / f"{kind}-{uuid.uuid4().hex[:6]}.sse"
    path.write_text("".join(block + "\n\n" for block in blocks))
    return run_node_reader(kind, path, thread_id=thread)


async def post(client: httpx.AsyncClient, cid: str, content: str) -> str:
    resp = await client.post(f"/v1/conversations/{cid}/messages", json={"content": content}, headers=ALICE)
    assert resp.status_code == 202, resp.text
    run_id: str = resp.json()["run_id"]
    return run_id


@pytest.fixture(autouse=True)
def _node_clients() -> None:
    require_node_clients()


@pytest.mark.parametrize("fmt", ["ai-sdk", "ag-ui"])
async def test_a_live_stream_cut_at_random_and_resumed_rebuilds_the_journal(
    dsn: str, schema: str, fmt: str, tmp_path: Path
) -> None:
    rng = random.Random(fmt)
    async with serve(dsn, schema) as (client, pool):
        for round_ in range(3):
            cid = f"cut-{fmt}-{round_}"
            run_id = await post(client, cid, "tell me")
            url = f"/v1/runs/{run_id}/events?format={fmt}"
            pieces: list[str] = []
            headers = dict(ALICE)
            for _ in range(rng.randint(1, 3)):  # drop the connection after a few messages, then resume
                resp, got = await read_blocks(
                    client, "GET", url, headers=headers, stop_after=rng.randint(1, 8)
                )
                assert resp.status_code == 200
                pieces += got
                headers = {**ALICE, "Last-Event-ID": last_id(pieces)}
            resp, rest = await read_blocks(client, "GET", url, headers=headers)
            pieces += rest
            assert resp.status_code in (200, 204)
            _, whole = await read_blocks(client, "GET", url, headers=ALICE)
            assert pieces == whole  # nothing lost, nothing repeated, the same ids
            events = await journal_of(pool, run_id, schema)
            assert events[-1].payload["status"] == "completed"
            if fmt == "ai-sdk":
                check_ai_sdk(rebuild(fmt, pieces, tmp_path, cid), expected(events), run_id=uuid.UUID(run_id))
            else:
                check_ag_ui(
                    rebuild(fmt, pieces, tmp_path, cid),
                    expected(events),
                    run_id=uuid.UUID(run_id),
                    thread=cid,
                )
            # At the end of a finished run's stream, a reconnect is told there is no more.
            done = await client.get(url, headers={**ALICE, "Last-Event-ID": last_id(whole)})
            assert done.status_code == 204


async def test_the_ai_sdk_chat_post_streams_and_its_resume_reattaches(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    chat = {
        "id": "sdk-chat",
        "trigger": "submit-message",
        "messages": [
            {"id": "msg-1", "role": "user", "parts": [{"type": "text", "text": "hello, please approve"}]}
        ],
    }
    async with serve(dsn, schema) as (client, pool):
        assert (await client.get("/v1/ai-sdk/chat/sdk-chat/stream", headers=ALICE)).status_code == 204
        resp, first = await read_blocks(
            client, "POST", "/v1/ai-sdk/chat", headers=ALICE, json=chat, stop_after=3
        )
        assert resp.headers["x-vercel-ai-ui-message-stream"] == "v1"
        run_id = resp.headers["x-runrow-run-id"]
        # The page reloads: useChat's transport reattaches with a GET, and the same message
        # is replayed from its start while the run waits for the person's answer.
        with anyio.fail_after(20):
            while (await runrow.get_run(pool, run_id, schema=schema)).status != "waiting":
                await anyio.sleep(0.05)
        resp, replay = await read_blocks(
            client, "GET", "/v1/ai-sdk/chat/sdk-chat/stream", headers=ALICE, stop_after=3
        )
        assert resp.headers["x-runrow-run-id"] == run_id and replay == first
        # Reattached while the run still waits, the stream carries on to the end once the
        # person answers (after the run ends, the resume GET rightly answers 204).
        whole: list[str] = []
        with anyio.fail_after(30):
            async with client.stream("GET", "/v1/ai-sdk/chat/sdk-chat/stream", headers=ALICE) as resp:
                assert resp.status_code == 200
                async with aclosing(sse_blocks(resp)) as blocks:
                    whole.append(await anext(blocks))
                    assert await runrow.provide_input(pool, run_id, "approve", True, schema=schema)
                    whole += [block async for block in blocks]
        assert whole[:3] == first
        events = await journal_of(pool, run_id, schema)
        check_ai_sdk(
            rebuild("ai-sdk", whole, tmp_path, "sdk-chat"), expected(events), run_id=uuid.UUID(run_id)
        )
        # The same message again (a client retry) is the same run, not a second turn.
        again, _ = await read_blocks(
            client, "POST", "/v1/ai-sdk/chat", headers=ALICE, json=chat, stop_after=1
        )
        assert again.headers["x-runrow-run-id"] == run_id
        assert len(await runrow.list_runs(pool, conversation_id="sdk-chat", schema=schema)) == 1
        assert (await client.get("/v1/ai-sdk/chat/sdk-chat/stream", headers=ALICE)).status_code == 204
        # Someone else's chat is refused; requests the endpoint cannot answer say why.
        bob = await client.get("/v1/ai-sdk/chat/sdk-chat/stream", headers={"x-user": "bob"})
        assert bob.status_code == 403
        bad = await client.post(
            "/v1/ai-sdk/chat", headers=ALICE, json={**chat, "trigger": "regenerate-message"}
        )
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "unsupported_trigger"
        empty = await client.post("/v1/ai-sdk/chat", headers=ALICE, json={**chat, "messages": []})
        assert empty.status_code == 422


async def test_the_ag_ui_post_runs_the_agent_and_streams_its_events(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    body = {
        "threadId": "agui-thread",
        "runId": "client-run-1",
        "messages": [{"id": "u1", "role": "user", "content": "hello"}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    }
    async with serve(dsn, schema) as (client, pool):
        resp, blocks = await read_blocks(client, "POST", "/v1/ag-ui", headers=ALICE, json=body)
        assert resp.status_code == 200
        run_id = resp.headers["x-runrow-run-id"]
        events = await journal_of(pool, run_id, schema)
        check_ag_ui(
            rebuild("ag-ui", blocks, tmp_path, "agui-thread"),
            expected(events),
            run_id=uuid.UUID(run_id),
            thread="agui-thread",
        )
        # The client's runId is the idempotency key: a retried POST streams the same run.
        again, repeat = await read_blocks(client, "POST", "/v1/ag-ui", headers=ALICE, json=body)
        assert again.headers["x-runrow-run-id"] == run_id and repeat == blocks
        missing = await client.post("/v1/ag-ui", headers=ALICE, json={**body, "runId": ""})
        assert missing.status_code == 400 and missing.json()["error"]["code"] == "bad_run_id"


async def test_a_failed_runs_error_reaches_both_protocols_clients(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """The run's recorded error (its exception's type and message) is the AI SDK's
    errorText and AG-UI's RUN_ERROR message, where both read "run failed" before."""
    async with serve(dsn, schema) as (client, pool):
        chat = {
            "id": "fails",
            "messages": [{"id": "f1", "role": "user", "parts": [{"type": "text", "text": "fail"}]}],
        }
        resp, blocks = await read_blocks(client, "POST", "/v1/ai-sdk/chat", headers=ALICE, json=chat)
        run_id = resp.headers["x-runrow-run-id"]
        info = await runrow.get_run(pool, run_id, schema=schema)
        assert info.status == "failed"
        assert info.error is not None and "QuotaExceeded" in info.error.pop("traceback")
        assert info.error == {"type": "QuotaExceeded", "message": "over the model's quota (3 requests/s)"}
        said = "QuotaExceeded: over the model's quota (3 requests/s)"
        events = await journal_of(pool, run_id, schema)
        result = rebuild("ai-sdk", blocks, tmp_path, "fails")
        check_ai_sdk(result, expected(events), run_id=uuid.UUID(run_id))
        assert result["errors"] == [said]
        _, blocks = await read_blocks(client, "GET", f"/v1/runs/{run_id}/events?format=ag-ui", headers=ALICE)
        result = rebuild("ag-ui", blocks, tmp_path, "fails")
        check_ag_ui(result, expected(events), run_id=uuid.UUID(run_id), thread="fails")
        assert result["runError"]["message"] == said and result["runError"]["code"] == "failed"
