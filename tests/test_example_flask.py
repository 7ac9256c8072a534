"""examples/flask/: its app, against the real database and a real Dispatcher running its
agent. A posted message's run streams as SSE to its terminal event; resuming from a
cursor (Last-Event-ID or ?cursor=) gives exactly the remaining events."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import psycopg
import pytest

import runrow

from .helpers import counts

pytest.importorskip("flask")
pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flask"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"flask_example_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def parse_sse(body: str) -> list[dict[str, Any]]:
    """The stream's events as {"id", "event", "data"}; comments (keepalives) left out."""
    events = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":"))
        if fields:
            events.append(
                {"id": fields.get("id"), "event": fields["event"], "data": json.loads(fields["data"])}
            )
    return events


async def test_the_flask_example_enqueues_and_streams(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    app = load("app").create_app(dsn, schema=schema, poll=0.05)
    client = app.test_client()

    def post(text: str, key: str | None = None) -> Any:
        headers = {"X-User": "ann", **({"Idempotency-Key": key} if key else {})}
        return client.post("/conversations/c1/messages", json={"text": text}, headers=headers)

    def get(path: str, **headers: str) -> Any:
        response = client.get(path, headers=headers)
        return response.status_code, response.get_data(as_text=True)  # reads the stream to its end

    try:
        async with runrow.Dispatcher(dsn, load("agent").agent, schema=schema, poll=0.2):
            posted = await anyio.to_thread.run_sync(post, "hello there", "k1")
            assert posted.status_code == 202 and posted.json["created"] is True
            run_id = posted.json["run_id"]
            again = await anyio.to_thread.run_sync(post, "hello there", "k1")
            assert again.status_code == 202 and again.json == {"run_id": run_id, "created": False}
            with anyio.fail_after(30):
                status, body = await anyio.to_thread.run_sync(get, f"/runs/{run_id}/events")
        assert status == 200
        events = parse_sse(body)
        assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))  # no gap, no duplicate
        assert events[0]["event"] == "user_message_created" and events[-1]["event"] == "complete"
        assert events[-1]["data"]["status"] == "completed"
        text = "".join(e["data"]["delta"] for e in events if e["event"] == "content_delta")
        assert text == "You said 'hello there'. "
        assert (await runrow.get_run(dsn, run_id, schema=schema)).status == "completed"

        # Resuming: exactly the events after the cursor, by header or by query.
        for cut in (1, len(events) // 2, len(events) - 1):
            status, rest = await anyio.to_thread.run_sync(
                lambda cut=cut: get(f"/runs/{run_id}/events", **{"Last-Event-ID": str(cut)})
            )
            assert status == 200 and parse_sse(rest) == events[cut:]
        status, rest = await anyio.to_thread.run_sync(get, f"/runs/{run_id}/events?cursor={len(events)}")
        assert status == 200 and parse_sse(rest) == []  # resumed past the ending: nothing left

        # The refusals: a bad turn writes nothing; unknown runs and bad cursors are answered.
        before = await counts(conn, schema)
        refused = await anyio.to_thread.run_sync(post, "nul\x00")
        assert refused.status_code == 400 and "content" in refused.json["error"]
        assert await counts(conn, schema) == before
        missing = await anyio.to_thread.run_sync(get, "/runs/00000000-0000-0000-0000-000000000000/events")
        assert missing[0] == 404
        bad = await anyio.to_thread.run_sync(lambda: get(f"/runs/{run_id}/events?cursor=-1"))
        assert bad[0] == 400
        past = await anyio.to_thread.run_sync(lambda: get(f"/runs/{run_id}/events?cursor=999"))
        assert past[0] == 200 and parse_sse(past[1])[0]["event"] == "error"
    finally:
        app.extensions["runrow_pool"].close()
