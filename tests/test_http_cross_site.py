"""runrow.http against another site's pages: with cookie sign-in, a form or a fetch on
another site makes the user's browser send the request with the user's cookie. A body
is read only when it is sent as JSON (a form cannot send that without the browser asking
first), and a request that would change something is refused when the browser says it
comes from another site (``Sec-Fetch-Site``, or ``Origin`` from older browsers), unless
its origin is one the host allowed."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request

import runrow
from runrow.http import create_api

pytestmark = pytest.mark.anyio

HOST = "api.example"  # the Host the client sends: the API's own origin is http://api.example
EVIL = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}


def _cookie_user(request: Request) -> str | None:
    return request.cookies.get("session") or None  # a browser sends it whoever built the page


def _api(dsn: str, schema: str, **options: Any) -> tuple[Any, AsyncConnectionPool[Any]]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, open=False, kwargs={"autocommit": True})
    return create_api(pool, authenticate=_cookie_user, schema=schema, **options), pool


def _client(api: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url=f"http://{HOST}", cookies={"session": "alice"}
    )


async def _post_json(client: httpx.AsyncClient, cid: str, content: str = "hi") -> str:
    resp = await client.post(f"/v1/conversations/{cid}/messages", json={"content": content})
    assert resp.status_code == 202, resp.text
    run_id: str = resp.json()["run_id"]
    return run_id


async def test_a_body_is_read_only_when_it_is_sent_as_json(dsn: str, schema: str) -> None:
    """A form posts text/plain, urlencoded or multipart, and text/plain can carry a JSON
    text: none of them may post a message, answer an input or start a chat run."""
    api, pool = _api(dsn, schema)
    body = b'{"content": "posted by another site"}'
    async with pool, _client(api) as client:
        for content_type in (
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            None,
        ):
            headers = {} if content_type is None else {"Content-Type": content_type}
            for path, payload in (
                ("/v1/conversations/c/messages", body),
                ("/v1/ai-sdk/chat", b'{"id": "c", "messages": [{"role": "user", "content": "hi"}]}'),
                (
                    "/v1/ag-ui",
                    b'{"threadId": "c", "runId": "r", "messages": [{"role": "user", "content": "hi"}]}',
                ),
            ):
                resp = await client.post(path, content=payload, headers=headers)
                assert resp.status_code == 415, (path, content_type, resp.text)
                assert resp.json()["error"]["code"] == "unsupported_media_type"
        assert await runrow.list_runs(pool, conversation_id="c", schema=schema) == []
        run_id = await _post_json(client, "c")
        resp = await client.post(
            f"/v1/runs/{run_id}/input",
            content=b'{"key": "k", "value": 1}',
            headers={"Content-Type": "text/plain"},
        )
        assert resp.status_code == 415
        # JSON as such passes, with parameters or as a +json type.
        for content_type in (
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/merge-patch+json",
        ):
            resp = await client.post(
                "/v1/conversations/c/messages", content=body, headers={"Content-Type": content_type}
            )
            assert resp.status_code == 202, (content_type, resp.text)


async def test_another_sites_requests_change_nothing(dsn: str, schema: str) -> None:
    """Stop, cancel and retry read no body: only the browser's own word on where the
    request comes from can refuse them. Every state-changing route refuses it, first."""
    api, pool = _api(dsn, schema, max_queued_per_conversation=None)
    async with pool, _client(api) as client:
        running = await _post_json(client, "mine")
        ended = await _post_json(client, "mine", "second")
        await runrow.cancel_run(pool, ended, schema=schema)
        json_body = {"json": {"content": "x"}}
        for method_path, kwargs in (
            ("/v1/conversations/mine/stop", {}),
            (f"/v1/runs/{running}/cancel", {}),
            (f"/v1/runs/{ended}/retry", {}),
            (f"/v1/runs/{running}/input", {"json": {"key": "k", "value": 1}}),
            ("/v1/conversations/mine/messages", json_body),
            ("/v1/ai-sdk/chat", {"json": {"id": "mine", "messages": [{"role": "user", "content": "x"}]}}),
            (
                "/v1/ag-ui",
                {"json": {"threadId": "mine", "runId": "r", "messages": [{"role": "user", "content": "x"}]}},
            ),
        ):
            for headers in (
                EVIL,
                {"Sec-Fetch-Site": "cross-site"},
                {"Sec-Fetch-Site": "same-site", "Origin": "https://other.api.example"},  # a sibling
                {"Origin": "https://evil.example"},  # a browser without Sec-Fetch-Site
                {"Origin": "null"},  # a sandboxed frame, a data: URL
            ):
                resp = await client.post(method_path, headers=headers, **kwargs)
                assert resp.status_code == 403, (method_path, headers, resp.text)
                assert resp.json()["error"]["code"] == "cross_site"
        runs = await runrow.list_runs(pool, conversation_id="mine", schema=schema)
        assert sorted(r.status for r in runs) == ["cancelled", "queued"] and len(runs) == 2
        assert not (await runrow.get_run(pool, running, schema=schema)).cancel_requested
        # Reads stay open to any page (CORS, not runrow, decides who may read the answer).
        assert (await client.get(f"/v1/runs/{running}", headers=EVIL)).status_code == 200
        # The same site's own pages, and clients that are not browsers, are served.
        for headers in (
            {"Sec-Fetch-Site": "same-origin", "Origin": f"http://{HOST}"},
            {"Sec-Fetch-Site": "none"},  # typed in the address bar, a bookmark
            {"Origin": f"http://{HOST}"},  # an older browser, same origin
            {},  # curl, a server, a test client
        ):
            assert (await client.post("/v1/conversations/mine/stop", headers=headers)).status_code == 200


async def test_allowed_origins_may_post_from_another_site(dsn: str, schema: str) -> None:
    api, pool = _api(dsn, schema, allowed_origins=["https://app.example", "HTTP://Local.Test:8080"])
    async with pool, _client(api) as client:
        for origin in ("https://app.example", "http://local.test:8080"):
            resp = await client.post(
                "/v1/conversations/ok/messages",
                json={"content": origin},
                headers={"Origin": origin, "Sec-Fetch-Site": "cross-site"},
            )
            assert resp.status_code == 202, resp.text
        for origin in ("https://app.example:8443", "http://app.example", "https://evil.example"):
            resp = await client.post(
                "/v1/conversations/ok/stop", headers={"Origin": origin, "Sec-Fetch-Site": "cross-site"}
            )
            assert resp.status_code == 403, origin


async def test_allowed_origins_are_checked(dsn: str) -> None:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, open=False)
    for bad in (
        ["app.example"],
        ["https://app.example/"],
        ["https://app.example/chat"],
        ["https://app.example?x=1"],
        ["https://user@app.example"],
        ["ftp://app.example"],
        ["*"],
        "https://app.example",  # a string, not a collection of them
    ):
        with pytest.raises(ValueError, match="allowed_origins"):
            create_api(pool, authenticate=_cookie_user, allowed_origins=bad)


async def test_the_openapi_document_says_what_is_refused(dsn: str, schema: str) -> None:
    api, _ = _api(dsn, schema)
    async with _client(api) as client:
        doc = (await client.get("/openapi.json")).json()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            responses = op["responses"]
            if method == "post":
                assert "cross_site" in responses["403"]["description"], path
            else:
                assert "cross_site" not in str(responses.get("403")), path
            if "requestBody" in op:
                assert list(op["requestBody"]["content"]) == ["application/json"]
                assert "unsupported_media_type" in responses["415"]["description"], path
            else:
                assert "415" not in responses, path
    # The conversation routes' own 403 is still documented.
    assert (
        "forbidden"
        in doc["paths"]["/v1/conversations/{conversation_id}/stop"]["post"]["responses"]["403"]["description"]
    )
