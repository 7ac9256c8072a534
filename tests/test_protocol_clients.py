"""The real clients read what runrow.protocols sends: the AI SDK's readUIMessageStream and
AG-UI's HttpAgent (tests/node), over whole streams and over streams cut at random frames
and resumed from the last SSE id. What they rebuild must be what the journal holds.

Needs node and ``npm ci --prefix tests/node``; skipped without them, failed under CI.
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import pytest

from runrow import Event
from runrow.protocols import FORMATS, Cursor, Frame, ProtocolStream

from .protocol_support import require_node_clients, run_node_reader, sse_text

RUN_ID = uuid.UUID("0b9f4c1e-5a7d-4e2b-8c3f-1d6e2a9b7c05")
THREAD = "conv-42"
pytestmark = pytest.mark.node


def journal(*body: tuple[str, dict[str, Any]]) -> list[Event]:
    head = [("user_message_created", {"message_id": "m1"}), ("run_queued", {"run_id": str(RUN_ID)})]
    return [Event(seq, etype, dict(payload)) for seq, (etype, payload) in enumerate([*head, *body], 1)]


def text(delta: str, stream: str | None = None) -> tuple[str, dict[str, Any]]:
    return ("content_delta", {"delta": delta} if stream is None else {"delta": delta, "stream": stream})


def started(call_id: Any, name: str, arguments: Any) -> tuple[str, dict[str, Any]]:
    return ("tool_call_started", {"tool_call_id": call_id, "name": name, "arguments": arguments})


def finished(call_id: Any, **payload: Any) -> tuple[str, dict[str, Any]]:
    return ("tool_call_finished", {"tool_call_id": call_id, **payload})


JOURNALS = {
    "plain text": journal(
        text("Hello, "), text("wörld 🎉\n"), text("data: x\n\nid: 9"), ("complete", {"status": "completed"})
    ),
    "reasoning, tools and text": journal(
        text("Let me ", "reasoning"),
        text("look.", "reasoning"),
        text("Searching"),
        started("c1", "search", {"q": "runrow", "n": [1, 2]}),
        text("hidden", "scratch"),
        finished("c1", name="search", ok=True, result={"hits": ["a", "b"]}),
        started(2, "fetch", {}),
        finished(2, ok=False, error="timeout after 5 s"),
        text("Found "),
        text("two."),
        ("message_done", {}),
        ("complete", {"status": "completed"}),
    ),
    "waiting for input": journal(
        text("May I?"),
        (
            "input_requested",
            {"key": "approve", "request": {"question": "send?"}, "expires_at": "2026-01-01T00:00:00Z"},
        ),
        ("input_provided", {"key": "approve", "value": {"ok": True}}),
        text("Sent."),
        ("complete", {"status": "completed"}),
    ),
    "failed": journal(
        text("Partial"), started("x", "t", [1]), ("complete", {"status": "failed", "error": "agent raised"})
    ),
    # As runrow records a failure: the exception's type and message (the row's error).
    "failed with its recorded error": journal(
        text("Partial"),
        ("complete", {"status": "failed", "error": {"type": "RateLimitError", "message": "slow down: 3/s"}}),
    ),
    "cancelled": journal(text("Stop"), ("complete", {"status": "cancelled", "reason": "stopped"})),
    "expired": journal(
        ("input_requested", {"key": "k", "request": "why?", "expires_at": None}),
        ("complete", {"status": "expired", "reason": "input_expired", "uncertain_tool_calls": []}),
    ),
}


def encode(fmt: str, events: list[Event], after: Cursor | None = None) -> list[tuple[str, Frame]]:
    stream = ProtocolStream(fmt, run_id=RUN_ID, conversation_id=THREAD, after=after or Cursor(0))
    return [pair for event in events for pair in stream.feed(event)]


def cut_and_resumed(fmt: str, events: list[Event], cuts: list[int]) -> str:
    """The bodies a client reads when each connection drops after ``cuts[i]`` frames of what
    it was sent and it reconnects with the last SSE id it saw (Last-Event-ID)."""
    bodies, after = [], Cursor(0)
    for n in cuts:
        pairs = encode(fmt, events, after)[:n]
        bodies.append(sse_text(pairs))
        if pairs:
            after = Cursor.parse(pairs[-1][0])
    bodies.append(sse_text(encode(fmt, events, after)))
    return "".join(bodies)


def expected(events: list[Event]) -> dict[str, Any]:
    """What the journal holds, read directly: text and reasoning runs in order, tool calls,
    inputs, and the ending."""
    order: list[tuple[str, Any]] = []  # ("text" | "reasoning", text), ("tool", id), ("input", key)
    tools: dict[str, dict[str, Any]] = {}
    inputs: dict[str, dict[str, Any]] = {}
    kind = None
    for event in events:
        p = event.payload
        if event.type == "content_delta":
            k = {None: "text", "reasoning": "reasoning"}.get(p.get("stream"))
            if k is None:
                continue
            if k == kind:
                order[-1] = (k, order[-1][1] + p["delta"])
            else:
                order.append((k, p["delta"]))
            kind = k
            continue
        kind = None
        if event.type == "tool_call_started":
            order.append(("tool", str(p["tool_call_id"])))
            tools[str(p["tool_call_id"])] = {"name": p["name"], "input": p.get("arguments", {})}
        elif event.type == "tool_call_finished":
            tool = tools[str(p["tool_call_id"])]
            tool.update({"error": p["error"]} if p.get("ok") is False else {"output": p.get("result")})
        elif event.type == "input_requested":
            order.append(("input", p["key"]))
            inputs[p["key"]] = {"request": p["request"]}
        elif event.type == "input_provided":
            inputs[p["key"]]["value"] = p["value"]
    return {"order": order, "tools": tools, "inputs": inputs, "ending": events[-1].payload}


def check_ai_sdk(result: dict[str, Any], want: dict[str, Any], *, run_id: uuid.UUID = RUN_ID) -> None:
    message = result["message"]
    assert message["id"] == f"run-{run_id}" and message["role"] == "assistant"
    order: list[tuple[str, Any]] = []
    tools, inputs = {}, {}
    for part in message["parts"]:
        if part["type"] in ("text", "reasoning"):
            assert part["state"] == "done"
            order.append((part["type"], part["text"]))
        elif part["type"] == "dynamic-tool":
            order.append(("tool", part["toolCallId"]))
            tool = {"name": part["toolName"], "input": part["input"]}
            if part["state"] == "output-available":
                tool["output"] = part["output"]
            elif part["state"] == "output-error":
                tool["error"] = part["errorText"]
            tools[part["toolCallId"]] = tool
        elif part["type"] == "data-runrow-input":
            data = part["data"]
            order.append(("input", data["key"]))
            inputs[data["key"]] = {"request": data["request"]} | (
                {"value": data["value"]} if "value" in data else {}
            )
            # A request the run ended without an answer to is marked so.
            unanswered = "expired" if want["ending"]["status"] == "expired" else "closed"
            assert data["status"] == ("provided" if "value" in data else unanswered)
        else:
            assert part["type"] == "step-start"
    assert (order, tools, inputs) == (want["order"], want["tools"], want["inputs"])
    status = want["ending"]["status"]
    assert result["errors"] == ([ending_text(want["ending"])] if status in ("failed", "expired") else [])
    assert ("abort" in result["chunkTypes"]) == (status == "cancelled")
    assert result["chunkTypes"][-1] == "finish"


def check_ag_ui(
    result: dict[str, Any], want: dict[str, Any], *, run_id: uuid.UUID = RUN_ID, thread: str = THREAD
) -> None:
    types = [e["type"] for e in result["events"]]
    assert types[0] == "RUN_STARTED" and result["events"][0]["threadId"] == thread
    assert result["events"][0]["runId"] == str(run_id)
    texts, calls, outputs = [], {}, {}
    for message in result["messages"]:
        if message["role"] == "reasoning" or (message["role"] == "assistant" and message.get("content")):
            texts.append(("text" if message["role"] == "assistant" else "reasoning", message["content"]))
        for call in message.get("toolCalls", []):
            calls[call["id"]] = {
                "name": call["function"]["name"],
                "input": json.loads(call["function"]["arguments"]),
            }
        if message["role"] == "tool":
            outputs[message["toolCallId"]] = message["content"]
    assert texts == [item for item in want["order"] if item[0] in ("text", "reasoning")]
    assert calls == {i: {"name": t["name"], "input": t["input"]} for i, t in want["tools"].items()}
    assert outputs == {
        i: t["error"] if "error" in t else json.dumps(t["output"], separators=(",", ":"), ensure_ascii=False)
        for i, t in want["tools"].items()
        if "error" in t or "output" in t
    }
    customs = [(e["name"], e["value"]) for e in result["events"] if e["type"] == "CUSTOM"]
    assert [v["key"] for n, v in customs if n == "runrow.input_requested"] == list(want["inputs"])
    assert {v["key"]: v["value"] for n, v in customs if n == "runrow.input_provided"} == {
        k: i["value"] for k, i in want["inputs"].items() if "value" in i
    }
    status = want["ending"]["status"]
    if status == "completed":
        assert types[-1] == "RUN_FINISHED" and result["runError"] is None
    else:
        assert types[-1] == "RUN_ERROR" and result["runError"]["code"] == status
        assert result["runError"]["message"] == ending_text(want["ending"])


def ending_text(ending: dict[str, Any]) -> str:
    """What a client shows for a run that did not complete: its recorded error ("type:
    message", as the run's row holds it), else its status and reason."""
    error = ending.get("error")
    if isinstance(error, dict) and error:
        return ": ".join(error[k] for k in ("type", "message") if error.get(k))
    if isinstance(error, str) and error:
        return error
    reason = ending.get("reason")
    return f"run {ending['status']}" + (f" ({reason})" if reason else "")


CHECKS = {"ai-sdk": check_ai_sdk, "ag-ui": check_ag_ui}


@pytest.fixture(autouse=True)
def _node_clients() -> None:
    require_node_clients()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(JOURNALS))
def test_client_rebuilds_the_whole_stream(fmt: str, name: str, tmp_path: Path) -> None:
    path = tmp_path / "body.sse"
    path.write_text(sse_text(encode(fmt, JOURNALS[name])))
    CHECKS[fmt](run_node_reader(fmt, path, thread_id=THREAD), expected(JOURNALS[name]))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(JOURNALS))
def test_client_rebuilds_a_stream_cut_and_resumed(fmt: str, name: str, tmp_path: Path) -> None:
    events = JOURNALS[name]
    total = len(encode(fmt, events))
    rng = random.Random(f"{fmt}/{name}")
    # One cut, then three: each one at a random frame of what that connection was sent.
    for cuts in ([rng.randrange(1, total)], [rng.randrange(1, total // 3 + 2) for _ in range(3)]):
        body = cut_and_resumed(fmt, events, cuts)
        assert body == sse_text(encode(fmt, events))  # nothing lost, nothing repeated
        path = tmp_path / f"body-{len(cuts)}.sse"
        path.write_text(body)
        CHECKS[fmt](run_node_reader(fmt, path, thread_id=THREAD), expected(events))


def test_the_clients_reject_a_broken_stream(tmp_path: Path) -> None:
    """The readers can fail: a delta for a part that never started is refused by both."""
    path = tmp_path / "broken.sse"
    path.write_text('data: {"type":"start"}\n\ndata: {"type":"text-delta","id":"t","delta":"x"}\n\n')
    with pytest.raises(pytest.fail.Exception, match="missing text part"):
        run_node_reader("ai-sdk", path)
    run = '{"type":"RUN_STARTED","threadId":"t","runId":"r"}'
    path.write_text(f'data: {run}\n\ndata: {{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"x"}}\n\n')
    with pytest.raises(pytest.fail.Exception, match="No active text message"):
        run_node_reader("ag-ui", path)
