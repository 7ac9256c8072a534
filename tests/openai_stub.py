"""A local OpenAI-compatible HTTP server that plays recorded turns, for the adapter tests.

``OpenAIStub(turns)`` serves ``POST /v1/chat/completions`` and ``POST /v1/responses``
(streamed as SSE, as the real API does; the chat endpoint also answers without
``stream``) on 127.0.0.1, on a free port, from a uvicorn thread. Each request plays the
next scripted turn, whichever endpoint it came to, rendered in that API's wire shape:

* ``Turn(text=..., reasoning=...)``: an answer, split into many small deltas;
* ``Turn(tool_calls=[Call(id, name, arguments_json), ...])``: one or more (parallel) tool
  calls whose JSON arguments arrive in several fragments.

Every chunk and event is validated against the ``openai`` package's own types
(``ChatCompletionChunk``, ``ResponseStreamEvent``) before it is sent, so the recorded
shapes are the SDK's. ``requests`` keeps each request's JSON body, in order.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from pydantic import TypeAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "stub-model"


@dataclass(frozen=True)
class Call:
    """A scripted tool call: its id, the function's name and its arguments as JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Turn:
    """One scripted model answer: text (and reasoning) or tool calls."""

    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[Call, ...] = ()
    usage: tuple[int, int] = (12, 7)  # prompt tokens, completion tokens
    every_call_at_index_0: bool = False  # as some compatible servers stream parallel calls

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


def pieces(text: str, size: int = 3) -> list[str]:
    """``text`` cut into deltas of ``size`` characters (they join back to it)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# -- chat completions ---------------------------------------------------------------------


def chat_chunks(turn: Turn, *, n: int, include_usage: bool) -> list[dict[str, Any]]:
    """The ``ChatCompletionChunk`` payloads the Chat Completions API streams for ``turn``."""
    base = {
        "id": f"chatcmpl-stub{n}",
        "object": "chat.completion.chunk",
        "created": 1764669600,
        "model": MODEL,
    }
    base["system_fingerprint"] = "fp_stub"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": "", "refusal": None})]
    # OpenAI-compatible servers (vLLM, DeepSeek, ...) stream reasoning as reasoning_content.
    out += [chunk({"reasoning_content": p}) for p in pieces(turn.reasoning, 5)] if turn.reasoning else []
    out += [chunk({"content": p}) for p in pieces(turn.text)] if turn.text else []
    for n_call, call in enumerate(turn.tool_calls):
        index = 0 if turn.every_call_at_index_0 else n_call
        head = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        out.append(chunk({"tool_calls": [head]}))
        for frag in pieces(call.arguments, 4):
            out.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": frag}}]}))
    out.append(chunk({}, turn.finish_reason))
    if include_usage:
        prompt, completion = turn.usage
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        out.append({**base, "choices": [], "usage": usage})
    return out


def chat_completion(turn: Turn, *, n: int) -> dict[str, Any]:
    """The non-streamed ``ChatCompletion`` for ``turn``."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.text or None, "refusal": None}
    if turn.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in turn.tool_calls
        ]
    prompt, completion = turn.usage
    return {
        "id": f"chatcmpl-stub{n}",
        "object": "chat.completion",
        "created": 1764669600,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": turn.finish_reason}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


# -- responses ----------------------------------------------------------------------------


def response_events(turn: Turn, *, n: int) -> list[dict[str, Any]]:
    """The ``ResponseStreamEvent`` payloads the Responses API streams for ``turn``."""
    events: list[dict[str, Any]] = []
    output: list[dict[str, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    def response(status: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": f"resp_stub{n}",
            "object": "response",
            "created_at": 1764669600,
            "status": status,
            "model": MODEL,
            "output": list(output),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
        if status == "completed":
            prompt, completion = turn.usage
            body["usage"] = {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            }
        return body

    add("response.created", response=response("in_progress"))
    add("response.in_progress", response=response("in_progress"))
    if turn.reasoning:
        index, item_id = len(output), f"rs_stub{n}"
        add(
            "response.output_item.added",
            output_index=index,
            item={"id": item_id, "type": "reasoning", "summary": []},
        )
        for p in pieces(turn.reasoning, 5):
            add(
                "response.reasoning_summary_text.delta",
                item_id=item_id,
                output_index=index,
                summary_index=0,
                delta=p,
            )
        item = {
            "id": item_id,
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": turn.reasoning}],
        }
        output.append(item)
        add("response.output_item.done", output_index=index, item=item)
    if turn.text:
        index, item_id = len(output), f"msg_stub{n}"
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        add(
            "response.output_item.added",
            output_index=index,
            item={
                "id": item_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            },
        )
        add(
            "response.content_part.added",
            **where,
            part={"type": "output_text", "text": "", "annotations": []},
        )
        for p in pieces(turn.text):
            add("response.output_text.delta", **where, delta=p, logprobs=[])
        add("response.output_text.done", **where, text=turn.text, logprobs=[])
        part = {"type": "output_text", "text": turn.text, "annotations": []}
        add("response.content_part.done", **where, part=part)
        item = {
            "id": item_id,
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [part],
        }
        output.append(item)
        add("response.output_item.done", output_index=index, item=item)
    for call in turn.tool_calls:
        index, item_id = len(output), f"fc_{call.id}"
        item = {"id": item_id, "type": "function_call", "call_id": call.id, "name": call.name}
        add(
            "response.output_item.added",
            output_index=index,
            item={**item, "arguments": "", "status": "in_progress"},
        )
        for frag in pieces(call.arguments, 4):
            add("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=frag)
        add(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=index,
            arguments=call.arguments,
        )
        done = {**item, "arguments": call.arguments, "status": "completed"}
        output.append(done)
        add("response.output_item.done", output_index=index, item=done)
    add("response.completed", response=response("completed"))
    return events


# -- the server ---------------------------------------------------------------------------


def _validated(adapter: TypeAdapter[Any], payload: dict[str, Any]) -> str:
    """``payload`` checked against the SDK's type (raises on a wrong shape), as JSON."""
    adapter.validate_python(payload)
    # The SDK's models allow extra keys, so check each known field is there as sent too.
    return json.dumps(payload, separators=(",", ":"))


@dataclass
class OpenAIStub:
    """The server: ``with OpenAIStub(turns) as stub: AsyncOpenAI(base_url=stub.url, ...)``."""

    turns: list[Turn]
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    delay: float = 0.0  # seconds between streamed chunks

    def __post_init__(self) -> None:
        from openai.types.chat import ChatCompletion, ChatCompletionChunk
        from openai.types.responses import ResponseStreamEvent

        self._chunk = TypeAdapter(ChatCompletionChunk)
        self._completion = TypeAdapter(ChatCompletion)
        self._event: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
        self._lock = threading.Lock()
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL to give the client (ends in ``/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def _next(self, request: Request, body: dict[str, Any]) -> tuple[int, Turn]:
        with self._lock:
            n = len(self.requests)
            self.requests.append(body)
            self.paths.append(request.url.path)
            if n >= len(self.turns):
                raise LookupError(f"request {n + 1}, but only {len(self.turns)} turns were scripted")
            return n, self.turns[n]

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        try:
            n, turn = self._next(request, body)
        except LookupError as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "stub_exhausted"}}, status_code=500)
        if not body.get("stream"):
            return Response(
                _validated(self._completion, chat_completion(turn, n=n)), media_type="application/json"
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        lines = [
            f"data: {_validated(self._chunk, c)}\n\n"
            for c in chat_chunks(turn, n=n, include_usage=include_usage)
        ]
        return StreamingResponse(self._play([*lines, "data: [DONE]\n\n"]), media_type="text/event-stream")

    async def _responses(self, request: Request) -> Response:
        body = await request.json()
        try:
            n, turn = self._next(request, body)
        except LookupError as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "stub_exhausted"}}, status_code=500)
        if not body.get("stream"):
            return JSONResponse(
                {"error": {"message": "the stub streams only", "type": "stub"}}, status_code=400
            )
        lines = [
            f"event: {e['type']}\ndata: {_validated(self._event, e)}\n\n" for e in response_events(turn, n=n)
        ]
        return StreamingResponse(self._play(lines), media_type="text/event-stream")

    async def _play(self, lines: list[str]) -> AsyncIterator[bytes]:
        import anyio

        for line in lines:
            yield line.encode()
            if self.delay:
                await anyio.sleep(self.delay)

    def __enter__(self) -> OpenAIStub:
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
            ]
        )
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the OpenAI stub did not start")
            time.sleep(0.01)
        self._sock = sock
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()


def scripted(*turns: Turn) -> Iterator[OpenAIStub]:
    """A generator for a pytest fixture: the stub running ``turns``."""
    with OpenAIStub(list(turns)) as stub:
        yield stub
