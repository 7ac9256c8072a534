"""examples/frontends/: the AI SDK's chat transport and AG-UI's HttpAgent, the packages
from the npm registry, talk to the FastAPI example (examples/fastapi/) over real HTTP,
with its in-process worker answering. Needs node and ``npm ci --prefix
examples/frontends``; skipped without them, failed under CI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from .demo_support import serve_asgi
from .test_http_api import _load_example

pytestmark = [pytest.mark.anyio, pytest.mark.node]

FRONTENDS = Path(__file__).resolve().parents[1] / "examples" / "frontends"


def _require_clients() -> str:
    node = shutil.which("node")
    missing = None if node else "node is not installed"
    if missing is None and not (FRONTENDS / "node_modules" / "ai").is_dir():
        missing = "examples/frontends/node_modules is missing: run `npm ci --prefix examples/frontends`"
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    assert node is not None
    return node


async def _run(node: str, script: str, base: str, text: str) -> dict[str, Any]:
    env = {**os.environ, "CHAT_URL": f"{base}/chat", "CHAT_TOKEN": "user-erin"}
    proc = await anyio.run_process([node, str(FRONTENDS / script), text], env=env, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


async def test_the_frontend_examples_talk_to_the_fastapi_example(dsn: str, schema: str) -> None:
    node = _require_clients()
    app = _load_example().build_app(dsn, schema=schema)
    async with serve_asgi(app) as base:
        sdk = await _run(node, "ai_sdk_chat.mjs", base, "hi from the AI SDK")
        texts = [p["text"] for p in sdk["message"]["parts"] if p["type"] == "text"]
        assert texts == ["You said: hi from the AI SDK "]
        assert sdk["reattached"] is False  # the run had ended: the resume GET answered 204
        agui = await _run(node, "ag_ui_run.mjs", base, "hi from AG-UI")
        answers = [m["content"] for m in agui["messages"] if m["role"] == "assistant"]
        assert answers == ["You said: hi from AG-UI "]
    assert subprocess.run([node, "--version"], capture_output=True, check=True).stdout.startswith(b"v")
