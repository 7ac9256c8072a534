"""runrow.http, the mountable API: mounted in a host's FastAPI app (examples/fastapi/), its
OpenAPI document generated from its routes, conversation ownership under racing first
posts, the AI SDK's and AG-UI's chat endpoints, and its argument checks. (The demo's
tests, tests/test_demo_http.py, cover every route's behaviour through the demo, which
mounts this same API.)"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount, Route

import runrow
from runrow._json import check_id
from runrow.http import create_api
from runrow.http._chat import client_key

from . import manual
from .demo_support import read_sse, serve_asgi

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fastapi" / "app.py"


def _load_example() -> ModuleType:
    pytest.importorskip("fastapi")
    spec = importlib.util.spec_from_file_location("fastapi_example_app", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _header_user(request: Request) -> str | None:
    return request.headers.get("x-user") or None


async def _async_header_user(request: Request) -> str | None:
    await anyio.sleep(0)  # a host's authenticate may await (a session lookup)
    return _header_user(request)


def _as(user: str) -> dict[str, str]:
    return {"x-user": user}


async def test_the_fastapi_example_mounts_the_api_next_to_its_own_routes(dsn: str, schema: str) -> None:
    example = _load_example()
    app = example.build_app(dsn, schema=schema)
    alice = {"Authorization": "Bearer user-alice"}
    async with serve_asgi(app) as base, httpx.AsyncClient(base_url=base, timeout=30) as client:
        assert (await client.get("/healthz")).json() == {"ok": True}
        assert (await client.get("/me", headers=alice)).json() == {"user": "alice"}
        refused = await client.post("/chat/v1/conversations/c1/messages", json={"content": "hi"})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
        accepted = await client.post(
            "/chat/v1/conversations/c1/messages", json={"content": "hello"}, headers=alice
        )
        assert accepted.status_code == 202, accepted.text
        body = accepted.json()
        # URLs in answers carry the mount point.
        assert body["events_url"] == f"/chat/v1/runs/{body['run_id']}/events"
        assert accepted.headers["location"] == f"/chat/v1/runs/{body['run_id']}"
        events = await read_sse(client, body["events_url"], alice)
        assert [e.id for e in events] == [str(n) for n in range(1, len(events) + 1)]
        assert events[-1].event == "complete" and events[-1].data["status"] == "completed"
        text = "".join(e.data["delta"] for e in events if e.event == "content_delta")
        assert text == "You said: hello "
        run = (await client.get(f"/chat/v1/runs/{body['run_id']}", headers=alice)).json()
        assert run["status"] == "completed"
        conv = (await client.get("/chat/v1/conversations/c1", headers=alice)).json()
        assert conv["owner"] == "alice" and [m["content"] for m in conv["messages"]] == [
            "hello",
            "You said: hello",
        ]
        doc = (await client.get("/chat/openapi.json")).json()
        assert "/v1/conversations/{conversation_id}/messages" in doc["paths"]
        # The host's own routes are FastAPI's, not runrow's.
        assert "/healthz" in (await client.get("/openapi.json")).json()["paths"]


def _api(dsn: str, schema: str, **options: Any) -> tuple[Starlette, AsyncConnectionPool[Any]]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, open=False, kwargs={"autocommit": True})
    return create_api(pool, authenticate=_async_header_user, schema=schema, **options), pool


async def test_the_openapi_document_is_generated_from_every_route(dsn: str, schema: str) -> None:
    api, _ = _api(dsn, schema)
    routes = {
        (r.path, m.lower())
        for r in api.routes
        if isinstance(r, Route)
        for m in r.methods or ()
        if m != "HEAD"
    }
    routes.discard(("/openapi.json", "get"))
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        doc = (await client.get("/openapi.json")).json()
    documented = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert documented == routes
    for path, ops in doc["paths"].items():
        for op in ops.values():
            names = {p["name"] for p in op["parameters"] if p["in"] == "path"}
            assert names == {seg[1:-1] for seg in path.split("/") if seg.startswith("{")}, path
            assert op["summary"] and op["responses"], path
            for response in op["responses"].values():
                ref = response.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
                if ref is not None:
                    assert ref.rsplit("/", 1)[1] in doc["components"]["schemas"], ref


async def test_the_run_resource_has_the_fields_its_schema_documents_with_its_version(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    api, pool = _api(dsn, schema)
    async with (
        pool,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api") as client,
    ):
        run_id = (
            await client.post("/v1/conversations/v/messages", json={"content": "x"}, headers=_as("alice"))
        ).json()["run_id"]
        assert (await client.get(f"/v1/runs/{run_id}", headers=_as("alice"))).json()["version"] is None
        await manual.claim(conn, schema, version="2026.2")
        run = (await client.get(f"/v1/runs/{run_id}", headers=_as("alice"))).json()
        documented = (await client.get("/openapi.json")).json()["components"]["schemas"]["Run"]["properties"]
    assert set(run) == set(documented)
    assert run["version"] == "2026.2"


async def test_a_new_conversation_goes_to_one_of_two_racing_first_posters(dsn: str, schema: str) -> None:
    api, pool = _api(dsn, schema, max_queued_per_conversation=None)
    async with (
        pool,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api") as client,
    ):
        for round_ in range(15):
            cid = f"race-{round_}"
            answers: dict[str, int] = {}

            async def post(user: str, cid: str = cid, answers: dict[str, int] = answers) -> None:
                resp = await client.post(
                    f"/v1/conversations/{cid}/messages", json={"content": f"mine ({user})"}, headers=_as(user)
                )
                answers[user] = resp.status_code

            async with anyio.create_task_group() as tg:
                for user in ("alice", "bob", "carol"):
                    tg.start_soon(post, user)
            winners = [u for u, status in answers.items() if status == 202]
            assert len(winners) == 1 and sorted(answers.values()) == [202, 403, 403], answers
            runs = await runrow.list_runs(pool, conversation_id=cid, schema=schema)
            assert {r.user_id for r in runs} == set(winners) and len(runs) == 1
            conv = await client.get(f"/v1/conversations/{cid}", headers=_as(winners[0]))
            assert conv.json()["owner"] == winners[0]


async def test_stream_format_and_cursor_errors(dsn: str, schema: str) -> None:
    api, pool = _api(dsn, schema)
    async with (
        pool,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api") as client,
    ):
        run_id = (
            await client.post("/v1/conversations/f/messages", json={"content": "x"}, headers=_as("alice"))
        ).json()["run_id"]
        bad = await client.get(f"/v1/runs/{run_id}/events?format=xml", headers=_as("alice"))
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_format"
        for cursor in ("1.", ".1", "1.2.3", "-1", "x"):
            resp = await client.get(
                f"/v1/runs/{run_id}/events?format=ai-sdk&from={cursor}", headers=_as("alice")
            )
            assert resp.status_code == 400 and resp.json()["error"]["code"] == "bad_cursor", cursor
        # Someone else's run is 404 in every format, before any cursor is looked at.
        other = await client.get(f"/v1/runs/{run_id}/events?format=ag-ui", headers=_as("bob"))
        assert other.status_code == 404


async def test_retry_answers_202_for_an_ended_run_and_409_for_an_active_one(dsn: str, schema: str) -> None:
    api, pool = _api(dsn, schema)
    async with (
        pool,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api") as client,
    ):
        run_id = (
            await client.post("/v1/conversations/r/messages", json={"content": "x"}, headers=_as("alice"))
        ).json()["run_id"]
        busy = await client.post(f"/v1/runs/{run_id}/retry", headers=_as("alice"))
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "not_retryable"
        assert (await client.post(f"/v1/runs/{run_id}/retry", headers=_as("bob"))).status_code == 404
        assert (await client.post(f"/v1/runs/{run_id}/cancel", headers=_as("alice"))).json()["cancelled"] == [
            run_id
        ]
        first = await client.post(f"/v1/runs/{run_id}/retry", headers=_as("alice"))
        again = await client.post(f"/v1/runs/{run_id}/retry", headers=_as("alice"))
        assert first.status_code == again.status_code == 202
        assert first.json()["run_id"] == again.json()["run_id"] != run_id
        assert (first.json()["created"], again.json()["created"]) == (True, False)
        retry = await runrow.get_run(pool, first.json()["run_id"], schema=schema)
        assert str(retry.retry_of) == run_id and retry.status == "queued"


async def test_a_retry_past_the_turns_deadline_is_refused_and_writes_nothing(dsn: str, schema: str) -> None:
    api, pool = _api(dsn, schema)
    async with (
        pool,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api") as client,
    ):
        run = await runrow.enqueue(
            pool,
            schema=schema,
            conversation_id="d",
            user_id="alice",
            content="x",
            deadline=timedelta(seconds=-1),
        )
        await runrow.cancel_run(pool, run.id, schema=schema)
        late = await client.post(f"/v1/runs/{run.id}/retry", headers=_as("alice"))
        assert late.status_code == 409 and late.json()["error"]["code"] == "deadline_passed", late.text
        assert len(await runrow.list_runs(pool, conversation_id="d", schema=schema)) == 1


async def test_create_api_refuses_bad_arguments(dsn: str) -> None:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, open=False)
    with pytest.raises(runrow.InvalidInput):
        create_api(pool, authenticate=_header_user, schema="")
    for bad in ({"max_content_bytes": 0}, {"keepalive": 0}, {"worker_slots": 0}):
        with pytest.raises(ValueError, match="at least 1"):
            create_api(pool, authenticate=_header_user, **bad)


async def test_mounted_under_a_prefix_in_a_starlette_host(dsn: str, schema: str) -> None:
    api, pool = _api(dsn, schema)
    host = Starlette(routes=[Mount("/agent", app=api)])
    async with (
        pool,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=host), base_url="http://host") as client,
    ):
        resp = await client.post(
            "/agent/v1/conversations/p/messages", json={"content": "x"}, headers=_as("dora")
        )
        assert resp.status_code == 202
        assert resp.json()["events_url"].startswith("/agent/v1/runs/")
        got = await client.get(resp.headers["location"], headers=_as("dora"))
        assert got.json()["id"] == resp.json()["run_id"]
        missing = await client.get(f"/agent/v1/runs/{uuid.uuid4()}", headers=_as("dora"))
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_a_stop_never_lands_on_a_conversation_someone_else_is_starting(dsn: str, schema: str) -> None:
    """Bob's stop finds the conversation unowned; Alice's first post commits right then.
    Bob's stop must not cancel Alice's run (nor hand him her message as a draft)."""
    api, pool = _api(dsn, schema)
    endpoints = api.state.runrow_api
    real = endpoints.own_conversation
    async with (
        pool,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api") as client,
    ):

        async def own_then_alice_posts(cid: str, user: str) -> str | None:
            owner = await real(cid, user)
            if user == "bob":  # between Bob's check and his stop, Alice's first post lands
                resp = await client.post(
                    f"/v1/conversations/{cid}/messages", json={"content": "mine"}, headers=_as("alice")
                )
                assert resp.status_code == 202
            return owner

        endpoints.own_conversation = own_then_alice_posts
        stop = await client.post("/v1/conversations/contested/stop", headers=_as("bob"))
        endpoints.own_conversation = real
        assert stop.status_code == 200
        assert stop.json() == {"noop": True, "cancelled": [], "cancel_requested": [], "drafts": []}
        runs = await runrow.list_runs(pool, conversation_id="contested", schema=schema)
        assert [(r.user_id, r.status) for r in runs] == [("alice", "queued")]
        # Once it is Alice's, Bob is refused, and Alice's own stop works.
        assert (await client.post("/v1/conversations/contested/stop", headers=_as("bob"))).status_code == 403
        mine = await client.post("/v1/conversations/contested/stop", headers=_as("alice"))
        assert mine.json()["cancelled"] == [str(runs[0].id)]


async def test_chat_endpoints_answer_each_user_message_once_and_take_long_histories(
    dsn: str, schema: str
) -> None:
    api, pool = _api(dsn, schema, max_queued_per_conversation=None)
    history = [
        message
        for n in range(40)  # a long chat: about 170 KB of history, over the plain body limit
        for message in (
            {"id": f"u{n}", "role": "user", "parts": [{"type": "text", "text": f"question {n}"}]},
            {"id": f"a{n}", "role": "assistant", "parts": [{"type": "text", "text": "x" * 4000}]},
        )
    ]
    ask = {"id": "u-last", "role": "user", "parts": [{"type": "text", "text": "and now?"}]}
    # A real server: these runs' streams stay open (no worker answers them here).
    async with pool, serve_asgi(api) as base, httpx.AsyncClient(base_url=base, timeout=30) as client:
        # No credentials: 401, whatever the body.
        assert (await client.post("/v1/ai-sdk/chat", content=b"{not json")).status_code == 401
        assert (await client.post("/v1/ag-ui", content=b"{not json")).status_code == 401
        long_chat = {"id": "long", "messages": [*history, ask]}
        # (Read only the headers: the stream stays open.)
        async with client.stream("POST", "/v1/ai-sdk/chat", json=long_chat, headers=_as("ann")) as resp:
            assert resp.status_code == 200, await resp.aread()
        # The last message must be the user's: an assistant's or a tool's is not a question.
        answered = {"id": "long", "messages": [*history]}
        resp = await client.post("/v1/ai-sdk/chat", json=answered, headers=_as("ann"))
        assert resp.status_code == 422 and "last message" in resp.json()["error"]["message"]
        tool_result = {"id": "t1", "role": "tool", "toolCallId": "c1", "content": "42"}
        agui = {"threadId": "th", "runId": "r1", "messages": [{"id": "q1", "role": "user", "content": "hi"}]}
        async with client.stream("POST", "/v1/ag-ui", json=agui, headers=_as("ann")) as resp:
            assert resp.status_code == 200
            first_run = resp.headers["x-runrow-run-id"]
        rerun = {**agui, "runId": "r2", "messages": [*agui["messages"], tool_result]}
        assert (await client.post("/v1/ag-ui", json=rerun, headers=_as("ann"))).status_code == 422
        # A new run of the same user message is the same turn.
        async with client.stream(
            "POST", "/v1/ag-ui", json={**agui, "runId": "r3"}, headers=_as("ann")
        ) as resp:
            assert resp.headers["x-runrow-run-id"] == first_run
        # The same message id in another chat of the same user is another turn, not a conflict.
        async with client.stream(
            "POST", "/v1/ai-sdk/chat", json={**long_chat, "id": "other"}, headers=_as("ann")
        ) as resp:
            assert resp.status_code == 200
        assert len(await runrow.list_runs(pool, conversation_id="other", schema=schema)) == 1
        assert len(await runrow.list_runs(pool, conversation_id="th", schema=schema)) == 1
        # The last message is still held to max_content_bytes.
        huge = {**ask, "id": "u-huge", "parts": [{"type": "text", "text": "y" * (17 * 1024)}]}
        resp = await client.post(
            "/v1/ai-sdk/chat", json={"id": "long", "messages": [huge]}, headers=_as("ann")
        )
        assert resp.status_code == 413 and resp.json()["error"]["code"] == "too_large"


async def test_the_events_route_answers_404_before_it_reads_a_cursor(dsn: str, schema: str) -> None:
    api, pool = _api(dsn, schema)
    async with (
        pool,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api") as client,
    ):
        run_id = (
            await client.post("/v1/conversations/e/messages", json={"content": "x"}, headers=_as("alice"))
        ).json()["run_id"]
        for query in ("?from=nonsense", "?format=xml", "?format=ag-ui&from=1.2.3"):
            assert (
                await client.get(f"/v1/runs/{run_id}/events{query}", headers=_as("bob"))
            ).status_code == 404
        await runrow.cancel_run(pool, run_id, schema=schema)
        # An empty Last-Event-ID is an EventSource that has seen no id: from the start.
        resp = await client.get(f"/v1/runs/{run_id}/events", headers={**_as("alice"), "Last-Event-ID": ""})
        assert resp.status_code == 200 and "id: 1\n" in resp.text


# Each id at its documented maximum: conversation (chat id, thread id) 128 characters of
# A-Z a-z 0-9 _ . : -, a message id or an AG-UI runId 200 characters of anything.
LONG_CHAT = "c:" + "x" * 126
LONG_ID = "m" * 199 + "\u00e9"


def _ai_sdk_body(chat: str, message_id: str, text: str = "hi") -> dict[str, Any]:
    return {
        "id": chat,
        "messages": [{"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}],
    }


def _ag_ui_body(thread: str, run_id: str, message_id: str | None, text: str = "hi") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "user", "content": text}
    if message_id is not None:
        message["id"] = message_id
    return {"threadId": thread, "runId": run_id, "messages": [message]}


async def _chat_run(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> str:
    """The run a chat POST started (or found again): read its headers only (no worker here)."""
    async with client.stream("POST", path, json=body, headers=_as("ann")) as resp:
        assert resp.status_code == 200, await resp.aread()
        return resp.headers["x-runrow-run-id"]


async def test_chat_ids_at_their_documented_maximum_lengths_are_idempotent(dsn: str, schema: str) -> None:
    """The key a chat POST derives from its ids fits runrow's 256 characters for every id
    within the limits (it was refused with 422 on a field the client never sent), and a
    repeat still finds the same run."""
    assert len(LONG_CHAT) == 128 and len(LONG_ID) == 200
    api, pool = _api(dsn, schema, max_queued_per_conversation=None)
    async with pool, serve_asgi(api) as base, httpx.AsyncClient(base_url=base, timeout=30) as client:
        ai_sdk = _ai_sdk_body(LONG_CHAT, LONG_ID)
        first = await _chat_run(client, "/v1/ai-sdk/chat", ai_sdk)
        assert await _chat_run(client, "/v1/ai-sdk/chat", ai_sdk) == first
        by_message = _ag_ui_body("t:" + "y" * 126, "r" * 200, LONG_ID)
        second = await _chat_run(client, "/v1/ag-ui", by_message)
        assert await _chat_run(client, "/v1/ag-ui", {**by_message, "runId": "s" * 200}) == second
        by_run = _ag_ui_body("t:" + "z" * 126, "q" * 199 + "\u00e9", None)
        third = await _chat_run(client, "/v1/ag-ui", by_run)
        assert await _chat_run(client, "/v1/ag-ui", by_run) == third
        assert len({first, second, third}) == 3


async def test_chat_keys_of_different_ids_never_collide(dsn: str, schema: str) -> None:
    """A colon is allowed in a chat id: ("a:b", "c") and ("a", "b:c") are two turns."""
    api, pool = _api(dsn, schema, max_queued_per_conversation=None)
    async with pool, serve_asgi(api) as base, httpx.AsyncClient(base_url=base, timeout=30) as client:
        one = await _chat_run(client, "/v1/ai-sdk/chat", _ai_sdk_body("a:b", "c"))
        other = await _chat_run(client, "/v1/ai-sdk/chat", _ai_sdk_body("a", "b:c"))
        assert one != other
        one = await _chat_run(client, "/v1/ag-ui", _ag_ui_body("t:run:x", "y", None))
        other = await _chat_run(client, "/v1/ag-ui", _ag_ui_body("t", "x:run:y", None))
        assert one != other


_CHAT_IDS = st.text(alphabet="ab:._-Z9", min_size=1, max_size=128)
_CLIENT_IDS = st.text(min_size=1, max_size=200)  # anything: NUL, lone surrogates, colons


@settings(max_examples=300, deadline=None)
@given(
    one=st.tuples(
        st.sampled_from(["ai-sdk", "ag-ui"]),
        _CHAT_IDS,
        st.sampled_from([None, "message", "run"]),
        _CLIENT_IDS,
    ),
    other=st.tuples(
        st.sampled_from(["ai-sdk", "ag-ui"]),
        _CHAT_IDS,
        st.sampled_from([None, "message", "run"]),
        _CLIENT_IDS,
    ),
)
def test_client_keys_are_valid_stable_and_distinct(
    one: tuple[str, str, str | None, str], other: tuple[str, str, str | None, str]
) -> None:
    for ids in (one, other):
        key = client_key(*ids)
        check_id(key, "idempotency_key")  # what enqueue checks: it never refuses a derived key
        assert client_key(*ids) == key
        protocol, cid, kind, client_id = ids
        readable = ":".join([protocol, cid, *([] if kind is None else [kind]), client_id])
        if ":" not in cid and len(readable) <= 256 and "\x00" not in readable and readable.isprintable():
            assert key == readable  # the key such a request had before: its retry finds its run
    assert (client_key(*one) == client_key(*other)) == (one == other)


async def test_a_trimmed_runs_stream_ends_once_in_every_format(dsn: str, schema: str) -> None:
    """After trim a run's journal is one synthesised ending, at seq 1. A client that has
    it (or anything later) gets 204, which stops an EventSource; it used to get a new
    ending one id higher on every reconnect, forever."""
    api, pool = _api(dsn, schema)
    async with (
        pool,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api") as client,
    ):
        run_id = (
            await client.post("/v1/conversations/trim/messages", json={"content": "x"}, headers=_as("alice"))
        ).json()["run_id"]
        await runrow.cancel_run(pool, run_id, schema=schema)
        url = f"/v1/runs/{run_id}/events"
        before = await client.get(url, headers=_as("alice"))
        last = before.text.strip().split("\n\n")[-1]
        assert "event: complete" in last and "id: 3" in last.splitlines()  # seq 1-2, then the ending
        # (Years ahead: the run's journal partition, every run in it trimmed, is dropped.)
        trimmed = await runrow.trim(
            pool, retention=timedelta(0), now=datetime.now(UTC) + timedelta(days=3650), schema=schema
        )
        assert trimmed.runs == 1 and trimmed.partitions >= 1
        whole = await client.get(url, headers=_as("alice"))
        assert whole.status_code == 200
        assert whole.text.count("event: complete") == 1 and "id: 1\n" in whole.text
        assert '"synthesized": true' in whole.text
        # The synthesised ending's id, the real ending's from before the trim, or any other.
        for seen in ("1", "3", "2", "7"):
            again = await client.get(url, headers={**_as("alice"), "Last-Event-ID": seen})
            assert again.status_code == 204, (seen, again.text)
            assert (await client.get(f"{url}?from={seen}", headers=_as("alice"))).status_code == 204
        for fmt in ("ai-sdk", "ag-ui"):
            whole = await client.get(f"{url}?format={fmt}", headers=_as("alice"))
            assert whole.status_code == 200
            last_id = [line for line in whole.text.splitlines() if line.startswith("id:")][-1][3:].strip()
            again = await client.get(
                f"{url}?format={fmt}", headers={**_as("alice"), "Last-Event-ID": last_id}
            )
            assert again.status_code == 204
