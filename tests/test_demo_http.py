"""The demo's HTTP API against a real uvicorn and a real PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import anyio
import httpx
import psycopg
import pytest
from psycopg import sql

from runrow.demo import answer_for, approval_answer_for, steered_note_for

from .demo_support import SSE, answer_text, auth, read_sse, serve_demo

# The slow tier: a uvicorn server per test (tests/README.md, "Tiers").
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ALICE = auth("alice")
BOB = auth("bob")


async def _post(
    client: httpx.AsyncClient, cid: str, content: str, headers: dict[str, str] | None = None
) -> dict:
    resp = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": content}, headers=headers or ALICE
    )
    assert resp.status_code == 202, resp.text
    return resp.json()


async def _wait_status(
    client: httpx.AsyncClient, run_id: str, statuses: set[str], timeout: float = 20
) -> dict:
    with anyio.fail_after(timeout):
        while True:
            body = (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()
            if body["status"] in statuses:
                return body
            await anyio.sleep(0.05)


async def test_post_message_202_run_completes_with_tool_call(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema) as base, httpx.AsyncClient(base_url=base) as client:
        accepted = await _post(client, "conv-1", "hello runrow")
        assert accepted["status"] == "queued" and accepted["created"] is True
        uuid.UUID(accepted["run_id"])
        run = await _wait_status(client, accepted["run_id"], {"completed", "failed", "cancelled"})
        assert run["status"] == "completed", run
        conv = (await client.get("/v1/conversations/conv-1", headers=ALICE)).json()
        [turn] = conv["turns"]
        assert turn["user_message"] == "hello runrow"
        assert turn["answer"] == {"content": answer_for("hello runrow"), "status": "complete"}
        assert [n["text"] for n in conv["notes"]] == ["hello runrow"]  # the tool's side effect
        events = await read_sse(client, f"/v1/runs/{accepted['run_id']}/events", ALICE)
        types = [e.event for e in events]
        assert types[:4] == ["user_message_created", "run_queued", "tool_call_started", "tool_call_finished"]
        assert types[-1] == "complete" and events[-1].data["status"] == "completed"
        # The documented tool vocabulary: one tool_call_id and name across start and finish.
        started, finished = events[2].data, events[3].data
        assert started["name"] == finished["name"] == "save_note"
        assert started["tool_call_id"] == finished["tool_call_id"]
        assert started["arguments"] == {"text": "hello runrow"} and finished["result"]["note_id"]
        # A finished turn carries its tool calls, so a page that did not watch it stream
        # (a reload in a new tab, another device) still shows them.
        assert turn["tool_calls"] == [
            {
                "tool_call_id": started["tool_call_id"],
                "name": "save_note",
                "arguments": {"text": "hello runrow"},
                "result": finished["result"],
                "uncertain": False,
            }
        ]


async def test_idempotency_key_returns_the_first_run(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        key = {**ALICE, "Idempotency-Key": "send-42"}
        first = await _post(client, "conv-i", "once", key)
        again = await _post(client, "conv-i", "once", key)
        other = await _post(client, "conv-i", "once", {**ALICE, "Idempotency-Key": "send-43"})
        assert again["run_id"] == first["run_id"] and again["created"] is False
        assert other["run_id"] != first["run_id"]
        conv = (await client.get("/v1/conversations/conv-i", headers=ALICE)).json()
        assert len(conv["turns"]) == 2


async def test_idempotency_key_reused_for_another_message_answers_409(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        key = {**ALICE, "Idempotency-Key": "send-7"}
        first = await _post(client, "conv-i", "once", key)
        for cid, content in (("conv-i", "a different message"), ("conv-j", "once")):
            resp = await client.post(
                f"/v1/conversations/{cid}/messages", json={"content": content}, headers=key
            )
            assert resp.status_code == 409, resp.text
            error = resp.json()["error"]
            assert error["code"] == "idempotency_conflict"
            assert "send-7" in error["message"] and error["run_id"] == first["run_id"]
        conv = (await client.get("/v1/conversations/conv-i", headers=ALICE)).json()
        assert [t["user_message"] for t in conv["turns"]] == ["once"]
        # The refused post to a new conversation did not claim it.
        assert (await client.get("/v1/conversations/conv-j", headers=ALICE)).json()["owner"] is None


async def test_sse_stream_and_resume_from_query_and_last_event_id(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema) as base, httpx.AsyncClient(base_url=base) as client:
        run_id = (await _post(client, "conv-s", "stream me"))["run_id"]
        url = f"/v1/runs/{run_id}/events"
        full = await read_sse(client, url, ALICE)
        seqs = [int(e.id or 0) for e in full]
        assert seqs == list(range(1, len(full) + 1)), "ids are the gap-free seq"
        assert all(e.data["seq"] == int(e.id or 0) and e.data["type"] == e.event for e in full)
        assert answer_text(full) == answer_for("stream me")
        assert len(full) > 8
        k = len(full) // 2
        by_query = await read_sse(client, f"{url}?from={k}", ALICE)
        assert by_query == full[k:]
        by_header = await read_sse(client, url, {**ALICE, "Last-Event-ID": str(k + 1)})
        assert by_header == full[k + 1 :]
        # An EventSource reconnects to its original URL and adds Last-Event-ID: the header wins.
        both = await read_sse(client, f"{url}?from=1", {**ALICE, "Last-Event-ID": str(k)})
        assert both == full[k:]
        # At or past the end of a finished run: 204, which tells an EventSource to stop
        # reconnecting (an empty 200 stream would have it reconnect forever).
        for params, headers in (
            ({"from": str(len(full))}, ALICE),
            ({"from": str(len(full) + 5)}, ALICE),
            ({}, {**ALICE, "Last-Event-ID": str(len(full))}),
        ):
            resp = await client.get(url, params=params, headers=headers)
            assert resp.status_code == 204, (params, headers, resp.status_code, resp.text)
            assert resp.content == b""


async def test_sse_reconnect_mid_stream_has_no_gap_and_no_duplicate(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, token_delay=0.03) as base, httpx.AsyncClient(base_url=base) as client:
        run_id = (await _post(client, "conv-m", "cut me off"))["run_id"]
        url = f"/v1/runs/{run_id}/events"
        got = await read_sse(client, url, ALICE, stop_after=6)  # disconnects mid-answer
        assert got[-1].event != "complete"
        assert (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()["status"] == "running"
        rest = await read_sse(client, url, {**ALICE, "Last-Event-ID": got[-1].id or ""})
        seqs = [int(e.id or 0) for e in got + rest]
        assert seqs == list(range(1, len(seqs) + 1))
        assert answer_text(got + rest) == answer_for("cut me off")


async def test_keepalive_comments_while_idle(dsn: str, schema: str) -> None:
    async with (
        serve_demo(dsn, schema, workers=0, keepalive=0.2) as base,
        httpx.AsyncClient(base_url=base) as client,
    ):
        run_id = (await _post(client, "conv-k", "nobody works here"))["run_id"]
        got = await read_sse(client, f"/v1/runs/{run_id}/events?from=2", ALICE, want_comment=True, timeout=10)
        assert got and got[-1].comments == ["keepalive"]


async def test_another_users_runs_answer_404_and_conversations_403(dsn: str, schema: str) -> None:
    # A run id is a secret (a random uuid): someone else's answers exactly like an unknown one.
    # A conversation id is a name anyone may pick, and posting to a taken one has to be
    # refused anyway, so a taken name is no secret: the API says so (403) and the page can
    # tell the user at once instead of failing their first message.
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        run_id = (await _post(client, "alice-conv", "mine"))["run_id"]
        unknown = str(uuid.uuid4())
        for rid in (run_id, unknown, "not-a-uuid"):
            for method, path, headers in (
                ("GET", f"/v1/runs/{rid}", BOB),
                ("GET", f"/v1/runs/{rid}/events", BOB),
                ("GET", f"/v1/runs/{rid}/events?from=1", BOB),
                ("GET", f"/v1/runs/{rid}/events", {**BOB, "Last-Event-ID": "2"}),  # a reconnect
                ("GET", f"/v1/runs/{rid}/events?access_token=demo-bob", {}),
                ("POST", f"/v1/runs/{rid}/cancel", BOB),
                ("POST", f"/v1/runs/{rid}/input", BOB),
            ):
                resp = await client.request(method, path, headers=headers)
                assert resp.status_code == 404, (method, path, resp.text)
                assert resp.json()["error"]["code"] == "not_found"
        for method, path, body in (
            ("GET", "/v1/conversations/alice-conv", None),
            ("POST", "/v1/conversations/alice-conv/stop", None),
            ("POST", "/v1/conversations/alice-conv/messages", {"content": "let me in"}),
        ):
            resp = await client.request(method, path, headers=BOB, json=body)
            assert resp.status_code == 403, (method, path, resp.text)
            assert resp.json()["error"]["code"] == "forbidden"
            assert "another user" in resp.json()["error"]["message"]
        # A conversation nobody has posted to yet is empty, not missing: a new conversation
        # loads without an error (nor a console error in the page).
        resp = await client.get("/v1/conversations/nobody-has-this", headers=BOB)
        assert resp.status_code == 200, resp.text
        assert resp.json() == {
            "conversation_id": "nobody-has-this",
            "owner": None,
            "turns": [],
            "messages": [],
            "notes": [],
        }
        resp = await client.post("/v1/conversations/nobody-has-this/stop", headers=BOB)
        assert resp.status_code == 200 and resp.json()["noop"] is True
        assert (await client.get("/v1/conversations/alice-conv", headers=ALICE)).json()["owner"] == "alice"
        # ...and alice still sees her run, untouched by bob's attempts.
        run = (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()
        assert run["status"] == "queued" and run["cancel_requested"] is False
        assert len((await client.get("/v1/conversations/alice-conv", headers=ALICE)).json()["turns"]) == 1


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (b"not json", {}, 400, "bad_json"),
        (b"[1, 2]", {}, 400, "bad_json"),
        (b'"just a string"', {}, 400, "bad_json"),
        (b"{}", {}, 422, "invalid_input"),
        (b'{"content": 42}', {}, 422, "invalid_input"),
        (b'{"content": "   "}', {}, 422, "invalid_input"),
        (b'{"content": ["a"]}', {}, 422, "invalid_input"),
        (b'{"content": "nul \\u0000 inside"}', {}, 422, "invalid_input"),
        # One problem, one code: too large is too_large, whichever limit caught it.
        (b'{"content": "' + b"x" * 20_000 + b'"}', {}, 413, "too_large"),  # over the content limit
        (b'{"content": "' + b"x" * 200_000 + b'"}', {}, 413, "too_large"),  # over the body limit
        (b'{"content": "hi"}', {"Idempotency-Key": "k" * 300}, 400, "bad_idempotency_key"),
        (b"\xff\xfe", {}, 400, "bad_json"),
        (b'{"content": "hi", "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", {}, 400, "bad_json"),  # too deep
        (b'{"content": "lone \\ud800 surrogate"}', {}, 422, "invalid_input"),
    ],
)
async def test_malformed_messages_answer_4xx_json(
    dsn: str, schema: str, body: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        resp = await client.post(
            "/v1/conversations/conv-bad/messages",
            content=body,
            headers={**ALICE, "Content-Type": "application/json", **headers},
        )
        assert resp.status_code == status, resp.text
        assert resp.json()["error"]["code"] == code, resp.text
        assert resp.json()["error"]["message"]
        conv = (await client.get("/v1/conversations/conv-bad", headers=ALICE)).json()
        assert conv["owner"] is None and conv["turns"] == [], "nothing written"


async def test_auth_and_path_errors_are_4xx_json(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        for headers in (
            {},
            {"Authorization": "Bearer alice"},
            {"Authorization": "Bearer demo-"},
            {"Authorization": "Basic x"},
        ):
            resp = await client.post("/v1/conversations/c/messages", json={"content": "hi"}, headers=headers)
            assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"
        resp = await client.post(
            "/v1/conversations/bad%20id!/messages", json={"content": "hi"}, headers=ALICE
        )
        assert resp.status_code == 400
        resp = await client.post(
            "/v1/conversations/" + "c" * 200 + "/messages", json={"content": "hi"}, headers=ALICE
        )
        assert resp.status_code == 400
        assert (await client.get("/v1/nothing", headers=ALICE)).status_code == 404
        resp = await client.delete(f"/v1/runs/{uuid.uuid4()}", headers=ALICE)
        assert resp.status_code == 405 and resp.json()["error"]["code"] == "method_not_allowed"
        doc = (await client.get("/openapi.json")).json()
        assert doc["openapi"].startswith("3.") and "/v1/runs/{run_id}/events" in doc["paths"]


@pytest.mark.parametrize(
    "cursor", ["-1", "abc", "", "1.5", "2147483648", "99999999999999999999", " 3", "0x10"]
)
async def test_bad_cursors_answer_400(dsn: str, schema: str, cursor: str) -> None:
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        run_id = (await _post(client, "conv-c", "cursor"))["run_id"]
        resp = await client.get(f"/v1/runs/{run_id}/events", params={"from": cursor}, headers=ALICE)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "bad_cursor"
        if cursor and cursor == cursor.strip():  # httpx refuses to send padded header values
            resp = await client.get(f"/v1/runs/{run_id}/events", headers={**ALICE, "Last-Event-ID": cursor})
            assert resp.status_code == 400, resp.text


async def test_stop_cancels_running_and_returns_queued_drafts(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, token_delay=0.2) as base, httpx.AsyncClient(base_url=base) as client:
        first = (await _post(client, "conv-stop", "a long answer please"))["run_id"]
        await _wait_status(client, first, {"running"})
        second = (await _post(client, "conv-stop", "and then this"))["run_id"]
        resp = await client.post("/v1/conversations/conv-stop/stop", headers=ALICE)
        assert resp.status_code == 200
        result = resp.json()
        assert result["cancel_requested"] == [first] and result["cancelled"] == [second]
        assert [d["content"] for d in result["drafts"]] == ["and then this"]
        assert (await _wait_status(client, first, {"completed", "failed", "cancelled"}))[
            "status"
        ] == "cancelled"
        events = await read_sse(client, f"/v1/runs/{first}/events", ALICE)
        assert events[-1].event == "complete" and events[-1].data["status"] == "cancelled"
        # cancelling a finished run changes nothing
        again = (await client.post(f"/v1/runs/{first}/cancel", headers=ALICE)).json()
        assert again["noop"] is True


async def test_cancel_one_queued_run(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        run_id = (await _post(client, "conv-q", "never mind"))["run_id"]
        result = (await client.post(f"/v1/runs/{run_id}/cancel", headers=ALICE)).json()
        assert result["cancelled"] == [run_id] and result["drafts"][0]["content"] == "never mind"
        assert (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()["status"] == "cancelled"


async def test_examples_chat_run_py_wires_host_auth_and_agent(dsn: str, schema: str) -> None:
    import importlib.util
    from pathlib import Path

    from .demo_support import QuietServer, free_port

    path = Path(__file__).parent.parent / "examples" / "chat" / "run.py"
    spec = importlib.util.spec_from_file_location("example_chat_run", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # run.py uses the default schema; point it at this test's schema the way a host would.
    app = module.create_app(
        dsn, schema=schema, authenticate=module.proxy_user, in_process_workers=1, agent=module.my_agent
    )
    import uvicorn

    port = free_port()
    server = QuietServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(20):
            while not server.started:
                await anyio.sleep(0.02)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                carol = {"X-User": "carol"}
                resp = await client.post(
                    "/v1/conversations/ex/messages", json={"content": "hi"}, headers=carol
                )
                assert resp.status_code == 202
                events = await read_sse(client, f"/v1/runs/{resp.json()['run_id']}/events", carol)
                assert answer_text(events).strip() == "echo: hi"
                assert events[-1].data["status"] == "completed"
                assert (await client.get("/v1/conversations/ex", headers=ALICE)).status_code == 403
        finally:
            server.should_exit = True
    assert callable(module.build_app) and callable(module.main)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(f"{schema}_demo")))


def _metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from a Prometheus text exposition (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        key, value = line.rsplit(" ", 1)
        metric, _, rest = key.partition("{")
        found = ",".join(sorted(p for p in rest.rstrip("}").split(",") if p)) if rest else ""
        if metric == name and found == want:
            return float(value)
    return 0.0


async def test_metrics_endpoint_counts_runs_after_a_few_turns(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, token_delay=0.05) as base, httpx.AsyncClient(base_url=base) as client:
        before = (await client.get("/metrics")).text
        assert "runrow_queue_depth" in before
        done = [await _post(client, f"m-{i}", f"question {i}") for i in range(3)]
        for r in done:
            assert (await _wait_status(client, r["run_id"], {"completed"}))["status"] == "completed"
        slow = await _post(client, "m-stop", "a long question " * 30)
        await _wait_status(client, slow["run_id"], {"running"})
        assert (await client.post("/v1/conversations/m-stop/stop", headers=ALICE)).status_code == 200
        await _wait_status(client, slow["run_id"], {"cancelled"})
        text = (await client.get("/metrics")).text
    assert (
        _metric(text, "runrow_runs_finished_total", status="completed", recorded="true")
        - _metric(before, "runrow_runs_finished_total", status="completed", recorded="true")
        == 3
    )
    assert _metric(text, "runrow_runs_finished_total", status="cancelled", recorded="true") == 1
    assert _metric(text, "runrow_runs_started_total") == 4
    assert _metric(text, "runrow_queue_wait_seconds_count") == 4


async def test_load_shedding_answers_429_with_retry_after_and_queued_runs_know_their_place(
    dsn: str, schema: str
) -> None:
    # No workers: every turn stays queued, so the conversation's limit is reached.
    async with (
        serve_demo(dsn, schema, workers=0, max_queued_per_conversation=2) as base,
        httpx.AsyncClient(base_url=base) as client,
    ):
        first = await _post(client, "busy", "one")
        second = await _post(client, "busy", "two")
        refused = await client.post(
            "/v1/conversations/busy/messages", json={"content": "three"}, headers=ALICE
        )
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "overloaded"
        other = await _post(client, "elsewhere", "fine")  # another conversation is not shed
        positions = [
            (await client.get(f"/v1/runs/{r['run_id']}/position", headers=ALICE)).json()["position"]
            for r in (first, second, other)
        ]
        assert positions[0] == 1 and positions[2] is not None and positions[1] > positions[0]
        assert (await client.get(f"/v1/runs/{first['run_id']}/position", headers=BOB)).status_code == 404
        conv = (await client.get("/v1/conversations/busy", headers=ALICE)).json()
        assert [t["user_message"] for t in conv["turns"]] == ["one", "two"]  # nothing written for "three"


async def _lose_the_worker(dsn: str, schema: str, run_id: str) -> None:
    """Makes a queued run look claimed by a worker that died an hour ago."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "UPDATE {}.agent_run SET status = 'running', worker_id = 'ghost', started_at = now(), claim_token = gen_random_uuid(), "
                "last_heartbeat_at = now() - interval '1 hour', "
                "claim_expires_at = now() - interval '1 hour' WHERE id = %s"
            ).format(sql.Identifier(schema)),
            (run_id,),
        )


async def test_the_web_process_reaps_when_its_workers_run_elsewhere(dsn: str, schema: str) -> None:
    """`runrow demo` runs its workers as processes: when the only one dies, the web
    process's reaper still ends its run (failed, worker_lost) on the demo's timing."""
    async with (
        serve_demo(dsn, schema, workers=0, reap_interval=0.2, reap_grace=0.0) as base,
        httpx.AsyncClient(base_url=base) as client,
    ):
        run_id = (await _post(client, "conv-lost", "who is there"))["run_id"]
        await _lose_the_worker(dsn, schema, run_id)
        run = await _wait_status(client, run_id, {"failed", "completed", "cancelled"}, timeout=10)
        assert run["status"] == "failed" and run["error"]["type"] == "worker_lost", run
        events = await read_sse(client, f"/v1/runs/{run_id}/events", ALICE)
        assert events[-1].data["reason"] == "worker_lost"


async def test_no_reaper_in_the_web_process_unless_asked(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        run_id = (await _post(client, "conv-lost", "who is there"))["run_id"]
        await _lose_the_worker(dsn, schema, run_id)
        # A negative check, so a fixed wait: a reaper here would end this hour-old lease
        # in its first pass after the loss.
        await anyio.sleep(1.0)
        assert (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()["status"] == "running"
        # (end it, so that nothing is left running for other tests to trip on)
        await _reap_now(dsn, schema)


async def _reap_now(dsn: str, schema: str) -> None:
    from runrow._engine.reaper import reap_expired

    await reap_expired(dsn, schema=schema, grace=0.0)


@pytest.mark.parametrize(
    ("durations", "position", "slots", "expected"),
    [
        ([], 1, 1, None),  # nothing finished yet: unknown
        ([8.0, 8.0], 2, 1, None),  # too few samples to say
        ([8.0, 8.0, 8.0], 1, 1, 8.0),  # today's complaint: 3 runs of 8 s said 200 s
        ([8.0, 8.0, 8.0], 2, 1, 16.0),
        ([7.0, 8.0, 9.0, 60.0], 2, 1, 17.0),  # the median: one slow run does not swing it
        ([8.0, 8.0, 8.0], 4, 4, 8.0),  # four runs ahead, four slots: one round
        ([8.0, 8.0, 8.0], 5, 4, 16.0),
        ([8.0, 8.0, 8.0], None, 1, None),  # not queued
    ],
)
def test_wait_estimate(
    durations: list[float], position: int | None, slots: int, expected: float | None
) -> None:
    from runrow.http._turns import estimate_wait

    assert estimate_wait(durations, position, slots) == expected


async def test_queue_position_estimate_follows_recent_run_durations(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, token_delay=0.01) as base, httpx.AsyncClient(base_url=base) as client:
        done = [await _post(client, f"e-{i}", f"question {i}") for i in range(3)]
        runs = [await _wait_status(client, r["run_id"], {"completed"}) for r in done]
    durations = sorted(
        (datetime.fromisoformat(r["finished_at"]) - datetime.fromisoformat(r["started_at"])).total_seconds()
        for r in runs
    )
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        first = await _post(client, "e-wait", "one")
        second = await _post(client, "e-wait-2", "two")
        pos = (await client.get(f"/v1/runs/{second['run_id']}/position", headers=ALICE)).json()
        assert pos["position"] == 2 and pos["finished_samples"] == 3
        # The median duration per run ahead (one slot: no workers here), not position /
        # throughput over five minutes (which said 100 s per place after three runs).
        assert pos["estimated_wait_seconds"] == pytest.approx(2 * durations[1], abs=0.01)
        assert (await client.get(f"/v1/runs/{first['run_id']}/position", headers=ALICE)).json()[
            "estimated_wait_seconds"
        ] == pytest.approx(durations[1], abs=0.01)


async def test_queue_position_estimate_is_unknown_before_enough_runs_finished(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        run = await _post(client, "e-none", "one")
        pos = (await client.get(f"/v1/runs/{run['run_id']}/position", headers=ALICE)).json()
        assert pos["position"] == 1 and pos["estimated_wait_seconds"] is None and pos["finished_samples"] == 0


async def test_the_openapi_document_lists_what_the_api_answers(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        paths = (await client.get("/openapi.json")).json()["paths"]
    assert "204" in paths["/v1/runs/{run_id}/events"]["get"]["responses"]
    for path, method in (
        ("/v1/conversations/{conversation_id}", "get"),
        ("/v1/conversations/{conversation_id}/stop", "post"),
        ("/v1/conversations/{conversation_id}/messages", "post"),
    ):
        assert "403" in paths[path][method]["responses"], path
    assert (
        "too_large"
        in paths["/v1/conversations/{conversation_id}/messages"]["post"]["responses"]["413"]["description"]
    )
    position = paths["/v1/runs/{run_id}/position"]["get"]["responses"]["200"]
    assert "finished_samples" in str(position)
    answer = paths["/v1/runs/{run_id}/input"]["post"]
    assert {"200", "400", "404", "409", "422"} <= set(answer["responses"])
    assert "not_waiting_for_input" in answer["responses"]["409"]["description"]
    assert answer["requestBody"]["content"]["application/json"]["schema"]["required"] == ["key", "value"]


# -- human in the loop: the agent asks for approval before it sends -------------------------

SEND = "please send hello to bob"
FINISHED = {"completed", "failed", "cancelled", "expired"}


async def _approval_asked(client: httpx.AsyncClient, run_id: str) -> tuple[list[SSE], dict[str, Any]]:
    """Waits for the run to ask for approval: its events so far, and the request's payload."""
    assert (await _wait_status(client, run_id, {"waiting", *FINISHED}))["status"] == "waiting"
    events = await read_sse(client, f"/v1/runs/{run_id}/events", ALICE, until="input_requested")
    assert events[-1].event == "input_requested", [e.event for e in events]
    return events, events[-1].data


async def _answer(client: httpx.AsyncClient, run_id: str, key: str, value: object) -> httpx.Response:
    return await client.post(f"/v1/runs/{run_id}/input", json={"key": key, "value": value}, headers=ALICE)


async def test_approval_is_asked_then_approved_and_the_tool_runs_once(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema) as base, httpx.AsyncClient(base_url=base) as client:
        run_id = (await _post(client, "conv-ok", SEND))["run_id"]
        events, asked = await _approval_asked(client, run_id)
        started = events[-2].data
        assert events[-2].event == "tool_call_started" and started["name"] == "send_message"
        args = {"to": "bob", "text": SEND}
        assert started["arguments"] == args
        assert asked["key"] == f"approve:{started['tool_call_id']}"
        assert asked["request"] == {
            "kind": "approval",
            "tool": "send_message",
            "tool_call_id": started["tool_call_id"],
            "args": args,
            "prompt": "Send this message to bob?",
        }
        assert asked["expires_at"] is not None  # the demo's default limit (600 s)
        # Waiting: nothing sent yet, and the run stays parked.
        assert (await client.get("/v1/conversations/conv-ok", headers=ALICE)).json()["notes"] == []
        await anyio.sleep(0.3)  # a negative check, so a fixed wait: a wrongly woken claim would show
        assert (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()["status"] == "waiting"

        resp = await _answer(client, run_id, asked["key"], {"approved": True})
        assert resp.status_code == 200 and resp.json() == {"recorded": True}, resp.text
        # The same answer again (a double click, a retried request) is harmless...
        resp = await _answer(client, run_id, asked["key"], {"approved": True})
        assert resp.status_code == 200 and resp.json() == {"recorded": False}, resp.text
        # ...another answer is refused: the first one stands.
        resp = await _answer(client, run_id, asked["key"], {"approved": False})
        assert resp.status_code == 409, resp.text
        assert resp.json()["error"]["code"] == "not_waiting_for_input"

        run = await _wait_status(client, run_id, FINISHED)
        assert run["status"] == "completed", run
        full = await read_sse(client, f"/v1/runs/{run_id}/events", ALICE)
        assert [int(e.id or 0) for e in full] == list(range(1, len(full) + 1)), "one gap-free journal"
        types = [e.event for e in full]
        assert types.count("tool_call_started") == 1, types  # the replay's emit was dropped
        assert types.count("input_requested") == 1 and types.count("input_provided") == 1, types
        assert (
            types.index("input_requested") < types.index("input_provided") < types.index("tool_call_finished")
        )
        provided = full[types.index("input_provided")].data
        assert provided["key"] == asked["key"] and provided["value"] == {"approved": True}
        finished = full[types.index("tool_call_finished")].data
        assert finished["ok"] is True and finished["result"]["sent"] is True
        assert answer_text(full) == approval_answer_for(SEND, True)
        assert full[-1].event == "complete" and full[-1].data["status"] == "completed"
        conv = (await client.get("/v1/conversations/conv-ok", headers=ALICE)).json()
        assert [n["text"] for n in conv["notes"]] == [f"sent to bob: {SEND}"]  # sent once
        [turn] = conv["turns"]
        assert turn["answer"]["content"] == approval_answer_for(SEND, True)
        [call] = turn["tool_calls"]
        assert call["name"] == "send_message" and call["result"] == finished["result"]
        assert turn["inputs"] == [
            {
                "key": asked["key"],
                "request": asked["request"],
                "expires_at": asked["expires_at"],
                "provided": True,
                "value": {"approved": True},
            }
        ]
        # A finished run waits for nothing.
        resp = await _answer(client, run_id, asked["key"], {"approved": True})
        assert resp.status_code in (200, 409), resp.text


async def test_approval_denied_sends_nothing(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema) as base, httpx.AsyncClient(base_url=base) as client:
        run_id = (await _post(client, "conv-no", SEND))["run_id"]
        _, asked = await _approval_asked(client, run_id)
        resp = await _answer(client, run_id, asked["key"], {"approved": False})
        assert resp.status_code == 200 and resp.json() == {"recorded": True}, resp.text
        assert (await _wait_status(client, run_id, FINISHED))["status"] == "completed"
        full = await read_sse(client, f"/v1/runs/{run_id}/events", ALICE)
        finished = next(e.data for e in full if e.event == "tool_call_finished")
        assert finished["ok"] is False and finished["result"] == {"sent": False, "reason": "denied"}
        assert answer_text(full) == approval_answer_for(SEND, False)
        conv = (await client.get("/v1/conversations/conv-no", headers=ALICE)).json()
        assert conv["notes"] == []
        assert conv["turns"][0]["inputs"][0]["value"] == {"approved": False}


async def test_input_answers_409_when_the_run_is_not_waiting_for_it(dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema) as base, httpx.AsyncClient(base_url=base) as client:
        # A run that never asked.
        plain = (await _post(client, "conv-409", "hello"))["run_id"]
        assert (await _wait_status(client, plain, FINISHED))["status"] == "completed"
        resp = await _answer(client, plain, "approve:call_x", {"approved": True})
        assert resp.status_code == 409, resp.text
        error = resp.json()["error"]
        assert error["code"] == "not_waiting_for_input" and error["message"]
        assert error["key"] == "approve:call_x" and error["status"] == "completed"
        # A waiting run, asked with a key it is not waiting for.
        waiting = (await _post(client, "conv-409", SEND))["run_id"]
        _, asked = await _approval_asked(client, waiting)
        resp = await _answer(client, waiting, "approve:something-else", {"approved": True})
        assert resp.status_code == 409, resp.text
        assert resp.json()["error"]["status"] == "waiting"
        # Stop cancels a waiting run at once (no worker holds it); then nothing waits.
        stopped = (await client.post("/v1/conversations/conv-409/stop", headers=ALICE)).json()
        assert stopped["cancelled"] == [waiting], stopped
        assert (await client.get(f"/v1/runs/{waiting}", headers=ALICE)).json()["status"] == "cancelled"
        resp = await _answer(client, waiting, asked["key"], {"approved": True})
        assert resp.status_code == 409, resp.text
        assert resp.json()["error"]["status"] == "cancelled"
        conv = (await client.get("/v1/conversations/conv-409", headers=ALICE)).json()
        assert conv["turns"][1]["inputs"][0]["provided"] is False
        assert [n["text"] for n in conv["notes"]] == ["hello"]  # nothing sent


async def test_an_unanswered_approval_expires(dsn: str, schema: str) -> None:
    async with (
        serve_demo(dsn, schema, approval_timeout=1.0) as base,
        httpx.AsyncClient(base_url=base) as client,
    ):
        run_id = (await _post(client, "conv-exp", SEND))["run_id"]
        _, asked = await _approval_asked(client, run_id)
        assert asked["expires_at"] is not None
        run = await _wait_status(client, run_id, FINISHED, timeout=30)
        assert run["status"] == "expired", run
        full = await read_sse(client, f"/v1/runs/{run_id}/events", ALICE)
        assert full[-1].event == "complete" and full[-1].data["status"] == "expired"
        resp = await _answer(client, run_id, asked["key"], {"approved": True})
        assert resp.status_code == 409 and resp.json()["error"]["status"] == "expired", resp.text
        conv = (await client.get("/v1/conversations/conv-exp", headers=ALICE)).json()
        assert conv["notes"] == [] and conv["turns"][0]["inputs"][0]["provided"] is False
        # The call announced before the wait never ran: it is not reported uncertain.
        assert [t["uncertain"] for t in conv["turns"][0]["tool_calls"]] == [False]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "bad_json"),
        (b'["approve:x", true]', 400, "bad_json"),
        (b"{}", 422, "invalid_input"),
        (b'{"value": {"approved": true}}', 422, "invalid_input"),
        (b'{"key": 7, "value": {"approved": true}}', 422, "invalid_input"),
        (b'{"key": "", "value": {"approved": true}}', 422, "invalid_input"),
        (b'{"key": "' + b"k" * 201 + b'", "value": true}', 422, "invalid_input"),
        (b'{"key": "approve:x"}', 422, "invalid_input"),  # no value
        (b'{"key": "approve:x", "value": "' + b"x" * 200_000 + b'"}', 413, "too_large"),
    ],
)
async def test_malformed_input_answers_4xx_json(
    dsn: str, schema: str, body: bytes, status: int, code: str
) -> None:
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        run_id = (await _post(client, "conv-bad-input", "hi"))["run_id"]
        resp = await client.post(
            f"/v1/runs/{run_id}/input",
            content=body,
            headers={**ALICE, "Content-Type": "application/json"},
        )
        assert resp.status_code == status, resp.text
        assert resp.json()["error"]["code"] == code and resp.json()["error"]["message"], resp.text
        assert (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()["status"] == "queued"


async def test_a_steering_message_is_read_by_the_streaming_turn(dsn: str, schema: str) -> None:
    """The page's "steer" box: a message posted with on_busy="steer" while a turn streams
    is read by that turn (its answer says so, where it read it; its journal has the
    delivery), and its own turn ends absorbed into it."""
    async with serve_demo(dsn, schema, token_delay=0.1) as base, httpx.AsyncClient(base_url=base) as client:
        first = (await _post(client, "conv-steer", "a long answer please"))["run_id"]
        await _wait_status(client, first, {"running"})
        resp = await client.post(
            "/v1/conversations/conv-steer/messages",
            json={"content": "and mention cats", "on_busy": "steer"},
            headers=ALICE,
        )
        assert resp.status_code == 202, resp.text
        steer = resp.json()["run_id"]
        assert (await _wait_status(client, first, {"completed", "failed", "cancelled"}))[
            "status"
        ] == "completed"
        run = await _wait_status(client, steer, {"absorbed", "completed", "failed", "cancelled"})
        assert run["status"] == "absorbed" and run["absorbed_into"] == first
        events = await read_sse(client, f"/v1/runs/{first}/events", ALICE)
        [delivered] = [e.data for e in events if e.event == "steering_delivered"]
        assert delivered["content"] == "and mention cats" and delivered["run_id"] == steer
        conv = (await client.get("/v1/conversations/conv-steer", headers=ALICE)).json()
        answer = next(t["answer"]["content"] for t in conv["turns"] if t["run"]["id"] == first)
        assert steered_note_for("and mention cats") in answer
        assert answer.replace(steered_note_for("and mention cats"), "") == answer_for("a long answer please")
        events = await read_sse(client, f"/v1/runs/{steer}/events", ALICE)
        assert {k: events[-1].data[k] for k in ("status", "reason", "into")} == {
            "status": "absorbed",
            "reason": "steered",
            "into": first,
        }


async def test_a_research_turn_fans_out_to_three_sub_agents_in_one_stream(dsn: str, schema: str) -> None:
    """ "research <topic>" spawns three researchers and answers from their notes; the
    turn's tree streams as one (each sub-agent's events tagged with its run), and the
    stream cut in the middle resumes from its last id with nothing lost or repeated."""
    from runrow.demo.research import ANGLES, notes_for

    async with serve_demo(dsn, schema, token_delay=0.02) as base, httpx.AsyncClient(base_url=base) as client:
        run_id = (await _post(client, "conv-r", "research tides"))["run_id"]
        url = f"/v1/runs/{run_id}/events?tree=true"
        got = await read_sse(client, url, ALICE, stop_after=9)
        rest = await read_sse(client, url, {**ALICE, "Last-Event-ID": got[-1].id or ""})
        stream = got + rest
        assert [int(e.id or 0) for e in stream] == list(range(1, len(stream) + 1))
        children = {e.data["run_id"] for e in stream} - {run_id}
        assert len(children) == 3
        for child in children:
            text = "".join(
                e.data["delta"] for e in stream if e.data["run_id"] == child and e.event == "content_delta"
            )
            assert text.strip() in {notes_for("tides", a) for a in ANGLES}
        assert stream[-1].event == "complete" and stream[-1].data["run_id"] == run_id
        assert stream[-1].data["status"] == "completed"
        body = (await client.get("/v1/conversations/conv-r", headers=ALICE)).json()
        answer = body["turns"][0]["answer"]["content"]
        assert all(notes_for("tides", a) in answer for a in ANGLES), answer
        # The sub-agents are no turns of the conversation: they run in their own.
        assert len(body["turns"]) == 1
