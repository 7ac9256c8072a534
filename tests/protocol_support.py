"""Helpers for tests of runrow.protocols: SSE text as a server sends it, and the real
AI SDK / AG-UI client packages (tests/node) reading it back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from runrow.protocols import Frame

NODE_DIR = Path(__file__).parent / "node"
READERS = {"ai-sdk": "read_ai_sdk.mjs", "ag-ui": "read_ag_ui.mjs"}
INSTALL = "npm ci --prefix tests/node"


def sse_text(pairs: Iterable[tuple[str, Frame]]) -> str:
    """The SSE body for ``(id, frame)`` pairs, one message each, as the HTTP layer writes it."""
    out = []
    for sse_id, frame in pairs:
        event = f"event: {frame.event}\n" if frame.event is not None else ""
        out.append(f"id: {sse_id}\n{event}data: {frame.data}\n\n")
    return "".join(out)


def node_clients_missing() -> str | None:
    """Why the Node clients cannot run here, or None when they can."""
    if shutil.which("node") is None:
        return "node is not installed"
    for package in ("ai", "@ag-ui/client"):
        if not (NODE_DIR / "node_modules" / package / "package.json").exists():
            return f"tests/node/node_modules lacks {package}: run `{INSTALL}`"
    return None


def require_node_clients() -> None:
    """Skips the calling test when the Node clients are missing, or fails it under CI."""
    reason = node_clients_missing()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the protocol client tests: {reason}")
    pytest.skip(reason)


def run_node_reader(kind: str, path: Path | str, *, thread_id: str = "thread") -> dict[str, Any]:
    """Runs the ``kind`` ("ai-sdk" or "ag-ui") client over the SSE text in ``path`` and
    returns what it printed. Fails the test when the client rejected the stream."""
    require_node_clients()
    node = shutil.which("node")
    assert node is not None
    args = [node, str(NODE_DIR / READERS[kind]), str(path)]
    if kind == "ag-ui":
        args.append(thread_id)
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        pytest.fail(
            f"the {kind} client rejected the stream (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    result: dict[str, Any] = json.loads(proc.stdout)
    return result
