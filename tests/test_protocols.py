"""runrow.protocols without a client: AG-UI frames against the protocol's own pydantic
models, resume from any SSE id, and the inputs the package rejects."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from ag_ui.core import Event as AgUiEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from runrow import Event, InvalidInput
from runrow.protocols import FORMATS, Cursor, Frame, ProtocolStream

from . import protocol_support

RUN_ID = uuid.UUID("6f1c2a52-8d0e-4d5c-9a43-2f0b1e7c9d11")
START = Cursor(0)
AG_UI_EVENT: TypeAdapter[object] = TypeAdapter(AgUiEvent)


def journal(*body: tuple[str, dict[str, object]]) -> list[Event]:
    """A run's events: the two enqueue writes, then ``body``, seq from 1."""
    head = [("user_message_created", {"message_id": "m1"}), ("run_queued", {"run_id": str(RUN_ID)})]
    return [Event(seq, etype, dict(payload)) for seq, (etype, payload) in enumerate([*head, *body], 1)]


def encode(fmt: str, events: list[Event], after: Cursor = START) -> list[tuple[str, Frame]]:
    stream = ProtocolStream(fmt, run_id=RUN_ID, conversation_id="conv-1", after=after)
    return [pair for event in events for pair in stream.feed(event)]


def delta(text: str, stream: str | None = None) -> tuple[str, dict[str, object]]:
    return ("content_delta", {"delta": text} if stream is None else {"delta": text, "stream": stream})


def tool(call_id: object, name: str = "search", **payload: object) -> list[tuple[str, dict[str, object]]]:
    finished = {"tool_call_id": call_id, "name": name, **payload}
    return [
        ("tool_call_started", {"tool_call_id": call_id, "name": name, "arguments": {"q": "x"}}),
        ("tool_call_finished", finished),
    ]


def complete(status: str, **payload: object) -> tuple[str, dict[str, object]]:
    return ("complete", {"status": status, **payload})


WAIT = [
    ("input_requested", {"key": "approve", "request": {"question": "ok?"}, "expires_at": None}),
    ("input_provided", {"key": "approve", "value": {"ok": True}}),
]
JOURNALS = {
    "text": journal(delta("Hel"), delta("lo"), ("message_done", {}), complete("completed")),
    "reasoning": journal(
        delta("think", "reasoning"), delta("answer"), delta("?", "other"), complete("completed")
    ),
    "tools": journal(
        delta("a"),
        *tool(1, result={"n": 1}, ok=True),
        *tool("t2", ok=False, error="boom"),
        complete("completed"),
    ),
    "waiting": journal(delta("asking"), *WAIT, delta("done"), complete("completed")),
    "failed": journal(delta("a"), complete("failed", error="agent raised")),
    "cancelled": journal(
        ("tool_call_started", {"tool_call_id": 7, "name": "t"}), complete("cancelled", reason="stopped")
    ),
    "expired": journal(WAIT[0], complete("expired", reason="input_expired", uncertain_tool_calls=[])),
    "orphan result": journal(
        ("tool_call_finished", {"tool_call_id": 9, "ok": True, "result": None}), complete("completed")
    ),
}


@pytest.mark.parametrize("name", list(JOURNALS))
def test_every_ag_ui_frame_is_a_valid_ag_ui_event(name: str) -> None:
    frames = encode("ag-ui", JOURNALS[name])
    for _, frame in frames:
        assert frame.event is None
        model = AG_UI_EVENT.validate_json(frame.data)
        # The models allow extra keys: a misspelt field would pass as one, so forbid them.
        assert not getattr(model, "__pydantic_extra__", None), frame.data
    types = [json.loads(f.data)["type"] for _, f in frames]
    assert types[0] == "RUN_STARTED"
    status = JOURNALS[name][-1].payload["status"]
    assert types[-1] == ("RUN_FINISHED" if status == "completed" else "RUN_ERROR")
    assert types.count("RUN_STARTED") == 1


@pytest.mark.parametrize("name", list(JOURNALS))
def test_ai_sdk_stream_starts_once_and_ends_with_done(name: str) -> None:
    frames = encode("ai-sdk", JOURNALS[name])
    assert all(f.event is None for _, f in frames)
    assert frames[-1][1] == Frame("[DONE]")
    chunks = [json.loads(f.data) for _, f in frames[:-1]]
    assert chunks[0] == {"type": "start", "messageId": f"run-{RUN_ID}"}
    assert chunks[-1] == {"type": "finish"}
    status = JOURNALS[name][-1].payload["status"]
    ending = {"completed": "finish-step", "cancelled": "abort", "failed": "error", "expired": "error"}[status]
    assert chunks[-2]["type"] == ending


def test_an_unanswered_ai_sdk_input_request_ends_with_the_run() -> None:
    chunks = [json.loads(f.data) for _, f in encode("ai-sdk", JOURNALS["expired"])[:-1]]
    inputs = [c["data"] for c in chunks if c["type"] == "data-runrow-input"]
    request = {"key": "approve", "request": {"question": "ok?"}, "expires_at": None}
    assert inputs == [{"status": "waiting", **request}, {"status": "expired", **request}]
    chunks = [json.loads(f.data) for _, f in encode("ai-sdk", JOURNALS["waiting"])[:-1]]
    inputs = [c["data"] for c in chunks if c["type"] == "data-runrow-input"]
    assert inputs == [
        {"status": "waiting", **request},
        {"status": "provided", **request, "value": {"ok": True}},
    ]


def test_ids_name_each_frame_and_the_last_frame_of_an_event_is_its_seq() -> None:
    pairs = encode("ai-sdk", JOURNALS["tools"])
    ids = [sse_id for sse_id, _ in pairs]
    assert ids[:2] == ["1.0", "1"]  # start, start-step: both from seq 1
    assert len(set(ids)) == len(ids)
    # Seqs never go back; within an event, parts count up and the bare seq comes last.
    order = [(c.seq, c.part is None, c.part or 0) for c in map(Cursor.parse, ids)]
    assert order == sorted(order)


def test_keepalives_send_nothing_and_change_nothing() -> None:
    events = JOURNALS["text"]
    stream = ProtocolStream("ag-ui", run_id=RUN_ID, conversation_id="conv-1")
    assert stream.feed(Event(0, "keepalive")) == []
    with_keepalives = [
        pair for e in events for pair in [*stream.feed(e), *stream.feed(Event(e.seq, "keepalive"))]
    ]
    assert [f for _, f in with_keepalives] == [f for _, f in encode("ag-ui", events)]


def test_headers() -> None:
    assert ProtocolStream("ai-sdk", run_id=RUN_ID, conversation_id="c").headers == {
        "x-vercel-ai-ui-message-stream": "v1"
    }
    assert ProtocolStream("ag-ui", run_id=RUN_ID, conversation_id="c").headers == {}


def test_unknown_format_is_invalid_input() -> None:
    assert FORMATS == ("ai-sdk", "ag-ui")
    with pytest.raises(InvalidInput) as info:
        ProtocolStream("sse", run_id=RUN_ID, conversation_id="c")
    assert info.value.field == "format"


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "a",
        "1.",
        ".1",
        "-1",
        "+1",
        "1.2.3",
        " 1",
        "1 ",
        "1e3",
        "\uff11",
        "1_0",
        "2147483648",
        "1.10001",
        "9" * 11,
    ],
)
def test_cursor_parse_rejects(raw: str) -> None:
    with pytest.raises(InvalidInput) as info:
        Cursor.parse(raw)
    assert info.value.field == "cursor"


@pytest.mark.parametrize("raw", ["0", "12", "12.3", "2147483647", "5.10000"])
def test_cursor_round_trips(raw: str) -> None:
    assert str(Cursor.parse(raw)) == raw


def test_a_cut_inside_one_event_resumes_after_that_frame() -> None:
    events = JOURNALS["tools"]
    full = encode("ag-ui", events)
    cut = next(i for i, (sse_id, _) in enumerate(full) if "." in sse_id and sse_id.endswith(".1"))
    assert encode("ag-ui", events, Cursor.parse(full[cut][0])) == full[cut + 1 :]


# A random journal: the enqueue writes, any mix of text, reasoning, ignored streams, tool
# calls (finished or not, ok or not), waits for input and agent events, then one complete.
_text = st.text(max_size=6)
_step = st.one_of(
    st.builds(lambda t: [delta(t)], _text),
    st.builds(lambda t: [delta(t, "reasoning")], _text),
    st.builds(lambda t: [delta(t, "scratch")], _text),
    st.just([("message_done", {})]),
    st.just(WAIT),
    st.builds(
        lambda ok, finish: tool("CALL", ok=ok, result=[1], error="e")[: 2 if finish else 1],
        st.booleans(),
        st.booleans(),
    ),
)
_ending = st.sampled_from(
    [
        complete("completed"),
        complete("failed", error="x"),
        complete("cancelled", reason="stopped"),
        complete("expired"),
    ]
)


@st.composite
def journals(draw: st.DrawFn) -> list[Event]:
    steps = draw(st.lists(_step, max_size=12))
    body: list[tuple[str, dict[str, object]]] = []
    for n, step in enumerate(steps):
        # Give each drawn tool call and wait its own id/key.
        for etype, payload in step:
            renamed = dict(payload)
            if renamed.get("tool_call_id") == "CALL":
                renamed["tool_call_id"] = n
            if "key" in renamed:
                renamed["key"] = f"k{n}"
            body.append((etype, renamed))
    return journal(*body, draw(_ending))


@settings(max_examples=300, deadline=None)
@given(events=journals(), fmt=st.sampled_from(FORMATS), data=st.data())
def test_resuming_from_any_sse_id_continues_exactly(
    events: list[Event], fmt: str, data: st.DataObject
) -> None:
    full = encode(fmt, events)
    assert full == encode(fmt, events)  # ids and frames come from the journal alone
    if fmt == "ag-ui":
        for _, frame in full:
            assert not getattr(AG_UI_EVENT.validate_json(frame.data), "__pydantic_extra__", None)
    cut = data.draw(st.integers(0, len(full)), label="cut")
    after = Cursor(0) if cut == 0 else Cursor.parse(full[cut - 1][0])
    assert full[:cut] + encode(fmt, events, after) == full


def test_missing_node_clients_fail_under_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without tests/node/node_modules the client tests skip, except under CI, where they fail."""
    monkeypatch.setattr(protocol_support, "NODE_DIR", tmp_path)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="npm ci --prefix tests/node"):
        protocol_support.require_node_clients()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run"):
        protocol_support.require_node_clients()


# A failed run's error as runrow records it (on the row and in its ending): the agent's
# exception's type and message, or one of runrow's own (worker_lost, deadline_exceeded).
RECORDED_ERRORS = [
    ({"type": "RateLimitError", "message": "slow down"}, "RateLimitError: slow down"),
    (
        {"type": "worker_lost", "message": "the worker stopped heartbeating; its lease expired"},
        "worker_lost: the worker stopped heartbeating; its lease expired",
    ),
    ({"type": "ValueError", "message": ""}, "ValueError"),
    ({"message": "no type"}, "no type"),
    ({}, "run failed"),
    (None, "run failed"),
]


@pytest.mark.parametrize(("error", "text"), RECORDED_ERRORS)
@pytest.mark.parametrize("synthesized", [False, True])
def test_a_failed_runs_recorded_error_reaches_both_protocols(
    error: dict[str, str] | None, text: str, synthesized: bool
) -> None:
    ending = {"error": error, **({"synthesized": True} if synthesized else {})}
    events = journal(delta("a"), complete("failed", **ending))
    chunks = [json.loads(f.data) for _, f in encode("ai-sdk", events)[:-1]]
    assert [c["errorText"] for c in chunks if c["type"] == "error"] == [text]
    frames = [json.loads(f.data) for _, f in encode("ag-ui", events)]
    assert frames[-1] == {"type": "RUN_ERROR", "message": text, "code": "failed"}
