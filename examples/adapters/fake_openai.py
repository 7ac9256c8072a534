"""A fake OpenAI-compatible server, to try the adapters offline: no key, no network.

Standard library only. It serves ``POST /v1/chat/completions`` (streamed or not) on
127.0.0.1: asked with tools, the model first calls the first tool (every string
argument "Paris"); given the tool's result, it answers with it; with no tools, it echoes
the last message. Run it, then point the examples at it:

    python fake_openai.py 8765 &
    export OPENAI_BASE_URL=http://127.0.0.1:8765/v1 OPENAI_API_KEY=fake OPENAI_MODEL=fake
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def reply(body: dict) -> tuple[list[dict] | None, str]:
    """The model's turn: (tool calls, None) or (None, text)."""
    messages, tools = body.get("messages", []), body.get("tools") or []
    last = messages[-1] if messages else {"role": "user", "content": ""}
    if tools and last["role"] == "user":
        fn = tools[0]["function"]
        props = fn.get("parameters", {}).get("properties", {})
        args = {name: "Paris" for name, p in props.items() if p.get("type") == "string"}
        return [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": fn["name"], "arguments": json.dumps(args)},
            }
        ], ""
    if last["role"] == "tool":
        return None, f"The tool says: {last['content']}"
    content = last.get("content") or ""
    text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
    return None, f"You said: {text}"


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self.send_error(404)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        calls, text = reply(body)
        base = {"id": "chatcmpl-fake", "created": int(time.time()), "model": body.get("model", "fake")}
        finish = "tool_calls" if calls else "stop"
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        if not body.get("stream"):
            message = {"role": "assistant", "content": None if calls else text, "tool_calls": calls}
            choice = {"index": 0, "message": message, "finish_reason": finish}
            return self.send(
                200,
                "application/json",
                json.dumps({**base, "object": "chat.completion", "choices": [choice], "usage": usage}),
            )
        if calls:  # each call, then its arguments in two fragments, as the real API streams them
            deltas = [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "index": 0,
                            **calls[0],
                            "function": {"name": calls[0]["function"]["name"], "arguments": ""},
                        }
                    ],
                }
            ]
            args = calls[0]["function"]["arguments"]
            deltas += [
                {"tool_calls": [{"index": 0, "function": {"arguments": part}}]}
                for part in (args[:5], args[5:])
            ]
        else:  # the answer a word at a time
            deltas = [{"role": "assistant", "content": ""}] + [
                {"content": w} for w in text.split(" ") for w in (w + " ",)
            ]
            deltas[-1]["content"] = deltas[-1]["content"].rstrip()
        chunks = [
            {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": d, "finish_reason": None}],
            }
            for d in deltas
        ]
        chunks.append(
            {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
            }
        )
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        self.send(
            200,
            "text/event-stream",
            "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n",
        )

    def send(self, code: int, kind: str, payload: str) -> None:
        data = payload.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8765
    print(f"fake OpenAI-compatible server on http://127.0.0.1:{port}/v1", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
