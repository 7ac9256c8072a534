"""runrow.admin answering a waiting input from a run's page (over HTTP, through ASGI, on a
real database, with real Dispatchers): the form only for a waiting run and never read-only,
CSRF and tenant refusals that change nothing, approve, deny, a JSON value and a text value
each resuming the run with what they say, and clear errors (malformed JSON, an answered
key, an ended run), everything the agent asked with escaped."""

from __future__ import annotations

import json
import re
import uuid
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest

import runrow

from .admin_support import admin_client, csrf_of
from .helpers import wait_for

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio

HOSTILE = "</pre><script>alert(1)</script><img src=x onerror=alert(2)>\"'"


async def asking_agent(run: runrow.RunContext) -> None:
    """Waits for the input its request names (``{"key": ..., "ask": ...}``), then writes
    the answer, as JSON, as its reply."""
    spec = run.request or {}
    answer = await run.wait_for_input(spec.get("key", "approve"), {"ask": spec.get("ask", "ok?")})
    await run.write_message(json.dumps(answer))


@asynccontextmanager
async def _worker(dsn: str, schema: str) -> AsyncIterator[None]:
    async with runrow.Dispatcher(dsn, asking_agent, schema=schema, poll=0.2):
        yield


async def _status(dsn: str, schema: str, rid: uuid.UUID) -> str:
    return (await runrow.get_run(dsn, rid, schema=schema)).status


async def _parked(
    dsn: str, schema: str, *, key: str = "approve", ask: str = "ok?", tenant: str | None = None
) -> uuid.UUID:
    """A run parked on input ``key`` (its worker gone again: it waits with no worker)."""
    async with _worker(dsn, schema):
        run = await runrow.enqueue(
            dsn,
            schema=schema,
            conversation_id=f"c-{uuid.uuid4().hex[:8]}",
            user_id="u",
            content="x",
            tenant_id=tenant,
            request={"key": key, "ask": ask},
        )

        async def waiting() -> bool:
            return await _status(dsn, schema, run.id) == "waiting"

        await wait_for(waiting, what="the run to park")
    return run.id


async def _answer(client: Any, rid: uuid.UUID, token: str, **fields: str) -> Any:
    return await client.post(f"/admin/runs/{rid}/input", data={"csrf": token, **fields})


async def _reply(dsn: str, schema: str, rid: uuid.UUID) -> Any:
    """The completed run's answer, as its agent wrote it back."""

    async def done() -> bool:
        return await _status(dsn, schema, rid) == "completed"

    await wait_for(done, what="the run to resume and complete")
    info = await runrow.get_run(dsn, rid, schema=schema)
    (message,) = [
        m for m in await runrow.transcript(dsn, info.conversation_id, schema=schema) if m.role == "assistant"
    ]
    return json.loads(message.content)


def _forms(html: str) -> list[str]:
    return re.findall(r'<form method="post" action="[^"]*/input" class="answer".*?</form>', html, re.S)


async def test_the_form_shows_only_for_a_waiting_run_and_never_read_only(dsn: str, schema: str) -> None:
    waiting = await _parked(dsn, schema)
    queued = (
        await runrow.enqueue(dsn, schema=schema, conversation_id="c-queued", user_id="u", content="x")
    ).id
    async with admin_client(dsn, schema) as client:
        page = (await client.get(f"/admin/runs/{waiting}")).text
        (form,) = _forms(page)
        assert f'action="/admin/runs/{waiting}/input"' in form
        assert 'name="key" value="approve"' in form and 'name="csrf"' in form
        for label in ("Approve", "Deny", "Send the value"):
            assert label in form
        assert _forms((await client.get(f"/admin/runs/{queued}")).text) == []
    for options, who in (({"read_only": True}, "act"), ({}, "view")):
        async with admin_client(dsn, schema, who=who, **options) as client:
            page = (await client.get(f"/admin/runs/{waiting}")).text
            assert "ok?" in page and _forms(page) == [] and 'method="post"' not in page
            assert (await client.get(f"/admin/runs/{waiting}/input")).status_code == 403
            refused = await _answer(client, waiting, "x", key="approve", decision="approve")
            assert refused.status_code == 403
    assert await _status(dsn, schema, waiting) == "waiting"


async def test_an_answer_without_a_good_token_is_refused_and_changes_nothing(dsn: str, schema: str) -> None:
    rid = await _parked(dsn, schema)
    async with admin_client(dsn, schema) as client:
        token = csrf_of((await client.get(f"/admin/runs/{rid}")).text)
        fields = {"key": "approve", "decision": "approve"}
        assert (await client.head(f"/admin/runs/{rid}/input")).status_code == 200  # HEAD only shows
        assert (await client.post(f"/admin/runs/{rid}/input", data=fields)).status_code == 403
        assert (await _answer(client, rid, token + "0", **fields)).status_code == 403
        cross = await client.post(
            f"/admin/runs/{rid}/input",
            data={"csrf": token, **fields},
            headers={"Origin": "https://evil.example"},
        )
        assert cross.status_code == 403
        # An action's form is one short field: a large body is refused as such, not read.
        big = await client.post(f"/admin/runs/{rid}/cancel", data={"csrf": token, "pad": "x" * 5000})
        assert big.status_code == 413
    assert await _status(dsn, schema, rid) == "waiting"
    assert [p.key for p in await runrow.waiting_inputs(dsn, run_id=rid, schema=schema)] == ["approve"]


async def test_another_tenants_waiting_run_cannot_be_answered(dsn: str, schema: str) -> None:
    theirs = await _parked(dsn, schema, tenant="t-theirs")
    mine = await _parked(dsn, schema, tenant="t-mine")
    async with admin_client(dsn, schema, who="act:t-mine") as client:
        token = csrf_of((await client.get(f"/admin/runs/{mine}")).text)
        assert (await client.get(f"/admin/runs/{theirs}/input")).status_code == 404
        refused = await _answer(client, theirs, token, key="approve", decision="approve")
        assert refused.status_code == 404
    assert await _status(dsn, schema, theirs) == "waiting"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"decision": "approve"}, {"approved": True}),
        ({"decision": "deny"}, {"approved": False}),
        ({"decision": "value", "value": '{"pick": [1, "b"]}', "as": "json"}, {"pick": [1, "b"]}),
        ({"decision": "value", "value": "42", "as": "json"}, 42),
        ({"decision": "value", "value": "42", "as": "text"}, "42"),
        ({"decision": "value", "value": "send it, ünïcode ✓", "as": "text"}, "send it, ünïcode ✓"),
    ],
    ids=["approve", "deny", "json-object", "json-number", "text-digits", "text"],
)
async def test_an_answer_resumes_the_run_with_what_it_says(
    dsn: str, schema: str, fields: dict[str, str], expected: Any
) -> None:
    rid = await _parked(dsn, schema)
    async with admin_client(dsn, schema) as client:
        token = csrf_of((await client.get(f"/admin/runs/{rid}")).text)
        done = await _answer(client, rid, token, key="approve", **fields)
        assert done.status_code == 303 and done.headers["location"] == f"/admin/runs/{rid}"
        assert await _status(dsn, schema, rid) == "queued"  # recorded; no worker yet
        async with _worker(dsn, schema):
            assert await _reply(dsn, schema, rid) == expected
        page = (await client.get(f"/admin/runs/{rid}")).text
        assert _forms(page) == [] and "status-completed" in page


async def test_malformed_json_is_refused_with_a_clear_error(dsn: str, schema: str) -> None:
    rid = await _parked(dsn, schema)
    async with admin_client(dsn, schema) as client:
        token = csrf_of((await client.get(f"/admin/runs/{rid}")).text)
        bad = await _answer(
            client, rid, token, key="approve", decision="value", value='{"a": <b>', **{"as": "json"}
        )
        assert bad.status_code == 400
        assert 'role="alert"' in bad.text and "is not JSON" in bad.text and "as text" in bad.text
        (form,) = _forms(bad.text)  # shown again, with what was typed (escaped)
        assert "{&quot;a&quot;: &lt;b&gt;" in form and "<b>" not in form
        empty = await _answer(
            client, rid, token, key="approve", decision="value", value=" ", **{"as": "json"}
        )
        assert empty.status_code == 400 and "Type a value" in empty.text
        odd = await _answer(client, rid, token, key="approve", decision="maybe")
        assert odd.status_code == 400
    assert await _status(dsn, schema, rid) == "waiting"


async def test_an_answered_key_and_an_ended_run_say_so(dsn: str, schema: str) -> None:
    rid = await _parked(dsn, schema)
    ended = await _parked(dsn, schema)
    async with admin_client(dsn, schema) as client:
        token = csrf_of((await client.get(f"/admin/runs/{rid}")).text)
        assert (await _answer(client, rid, token, key="approve", decision="approve")).status_code == 303
        # The same answer again (a double click) changes nothing and is not an error.
        assert (await _answer(client, rid, token, key="approve", decision="approve")).status_code == 303
        other = await _answer(client, rid, token, key="approve", decision="deny")
        assert other.status_code == 409 and "already answered" in other.text and "queued" in other.text
        unknown = await _answer(client, ended, token, key="nope", decision="approve")
        assert unknown.status_code == 409 and "nope" in unknown.text
        await runrow.cancel_run(dsn, ended, schema=schema)
        gone = await _answer(client, ended, token, key="approve", decision="approve")
        assert gone.status_code == 409 and "cancelled" in gone.text and "no longer waits" in gone.text
    assert await _status(dsn, schema, ended) == "cancelled"


async def test_what_the_agent_asked_with_is_escaped(dsn: str, schema: str) -> None:
    rid = await _parked(dsn, schema, key=f"k{HOSTILE}", ask=HOSTILE)
    async with admin_client(dsn, schema) as client:
        page = (await client.get(f"/admin/runs/{rid}")).text
        assert "<script>alert(1)</script>" not in page and "onerror=alert(2)>" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        (form,) = _forms(page)
        key = re.search(r'name="key" value="([^"]*)"', form)
        assert key is not None and "&lt;/pre&gt;" in key.group(1) and "&quot;" in key.group(1)
        token = csrf_of(page)
        done = await _answer(client, rid, token, key=f"k{HOSTILE}", decision="approve")
        assert done.status_code == 303
    assert await _status(dsn, schema, rid) == "queued"
