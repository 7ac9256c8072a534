"""The demo's HTTP API against a real uvicorn and a real PostgreSQL."""

from __future__ import annotations

import uuid

import anyio
import httpx
import psycopg
import pytest
from psycopg import sql

from runrow.demo import answer_for

from .demo_support import answer_text, auth, read_sse, serve_demo

pytestmark = pytest.mark.anyio

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
        assert (await client.get("/v1/conversations/conv-j", headers=ALICE)).status_code == 404


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
        past_end = await read_sse(client, f"{url}?from={len(full)}", ALICE)
        assert all(e.event == "complete" for e in past_end)


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


async def test_another_users_ids_answer_404_everywhere(dsn: str, schema: str) -> None:
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
            ):
                resp = await client.request(method, path, headers=headers)
                assert resp.status_code == 404, (method, path, resp.text)
                assert resp.json()["error"]["code"] == "not_found"
        for method, path, body in (
            ("GET", "/v1/conversations/alice-conv", None),
            ("POST", "/v1/conversations/alice-conv/stop", None),
            ("POST", "/v1/conversations/alice-conv/messages", {"content": "let me in"}),
            ("GET", "/v1/conversations/nobody-has-this", None),
        ):
            resp = await client.request(method, path, headers=BOB, json=body)
            assert resp.status_code == 404, (method, path, resp.text)
        # ...and alice still sees her run, untouched by bob's attempts.
        run = (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()
        assert run["status"] == "queued" and run["cancel_requested"] is False
        assert len((await client.get("/v1/conversations/alice-conv", headers=ALICE)).json()["turns"]) == 1


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b"not json", {}, 400),
        (b"[1, 2]", {}, 400),
        (b'"just a string"', {}, 400),
        (b"{}", {}, 422),
        (b'{"content": 42}', {}, 422),
        (b'{"content": "   "}', {}, 422),
        (b'{"content": ["a"]}', {}, 422),
        (b'{"content": "nul \\u0000 inside"}', {}, 422),
        (b'{"content": "' + b"x" * 20_000 + b'"}', {}, 413),  # over the content limit
        (b'{"content": "' + b"x" * 200_000 + b'"}', {}, 413),  # over the body limit
        (b'{"content": "hi"}', {"Idempotency-Key": "k" * 300}, 400),
        (b"\xff\xfe", {}, 400),
        (b'{"content": "hi", "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", {}, 400),  # too deep
        (b'{"content": "lone \\ud800 surrogate"}', {}, 422),
    ],
)
async def test_malformed_messages_answer_4xx_json(
    dsn: str, schema: str, body: bytes, headers: dict[str, str], status: int
) -> None:
    async with serve_demo(dsn, schema, workers=0) as base, httpx.AsyncClient(base_url=base) as client:
        resp = await client.post(
            "/v1/conversations/conv-bad/messages",
            content=body,
            headers={**ALICE, "Content-Type": "application/json", **headers},
        )
        assert resp.status_code == status, resp.text
        assert resp.json()["error"]["message"]
        assert (await client.get("/v1/conversations/conv-bad", headers=ALICE)).status_code == 404, (
            "nothing written"
        )


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
                assert (await client.get("/v1/conversations/ex", headers=ALICE)).status_code == 404
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
