"""The demo's agent: a deterministic fake model with one tool. No network, no API key.

Each turn it calls the ``save_note`` tool (a visible side effect: one row in the demo's
``note`` table, journaled as ``tool_call_started`` / ``tool_call_finished``), streams a
canned answer word by word at a human pace, and writes the answer to the transcript.
So reloading the page, resuming a stream, pressing Stop and killing a worker can all be
watched happening.

Pace: ``RUNROW_DEMO_TOKEN_DELAY`` seconds per word (default 0.08; tests use less).
Run it in a worker of your own with ``runrow worker runrow.demo.agent:agent`` (it finds
the database through ``DATABASE_URL`` and the schema through ``RUNROW_DEMO_SCHEMA``).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import TYPE_CHECKING

import anyio
from psycopg import AsyncConnection

from . import store

if TYPE_CHECKING:
    from runrow import RunContext

__all__ = ["DemoAgent", "agent", "answer_for", "tokens_for"]

DEFAULT_TOKEN_DELAY = 0.08

_BODY = (
    "This answer is streamed by a fake model, one word at a time, and every word lands in the "
    "run's journal in PostgreSQL before your browser sees it. Reload the page now and the stream "
    "picks up from the last event it showed you, with nothing missing and nothing repeated. Press "
    "Stop and the running turn is cancelled while queued messages return to your composer. Kill "
    "the worker and the reaper marks the turn failed once its lease runs out. A run is not a "
    "request; it is a row."
)


def _text_of(content: object) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def answer_for(content: object) -> str:
    """The answer the fake model gives to ``content`` (deterministic)."""
    said = " ".join(_text_of(content).split())
    if len(said) > 60:
        said = said[:57] + "..."
    return f'You said "{said}". I saved it as a note. {_BODY}'


def tokens_for(content: object) -> list[str]:
    """The answer split into the deltas the model streams (they join back to the answer)."""
    words = answer_for(content).split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]]


class DemoAgent:
    """The agent callable. ``conninfo`` is where the tool writes its note (default
    ``DATABASE_URL``); ``token_delay`` is seconds per streamed word (default
    ``RUNROW_DEMO_TOKEN_DELAY`` or 0.08)."""

    def __init__(
        self,
        conninfo: str | None = None,
        *,
        schema: str | None = None,
        demo_schema: str | None = None,
        token_delay: float | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._schema = schema
        self._demo_schema = demo_schema
        self._token_delay = token_delay

    @property
    def conninfo(self) -> str:
        url = self._conninfo or os.environ.get("DATABASE_URL")
        if not url:
            raise RuntimeError("the demo agent needs DATABASE_URL (or DemoAgent(conninfo=...))")
        return url

    @property
    def demo_schema(self) -> str:
        if self._demo_schema:
            return self._demo_schema
        schema = self._schema or os.environ.get("RUNROW_DEMO_SCHEMA") or "runrow"
        return f"{schema}_demo"

    @property
    def token_delay(self) -> float:
        if self._token_delay is not None:
            return self._token_delay
        return float(os.environ.get("RUNROW_DEMO_TOKEN_DELAY", DEFAULT_TOKEN_DELAY))

    async def __call__(self, run: RunContext) -> None:
        text = _text_of(run.content)
        # runrow's tool vocabulary (tool_call_id, name): a reaped run's terminal event then
        # lists this call as uncertain if the worker dies between start and finish.
        tool_call_id = f"call_{uuid.uuid4().hex[:12]}"
        note = text[:200]
        await run.emit(
            {
                "type": "tool_call_started",
                "tool_call_id": tool_call_id,
                "name": "save_note",
                "arguments": {"text": note},
            }
        )
        async with await AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            note_id, count = await store.record_note(
                conn, self.demo_schema, run.run_id, run.conversation_id, run.user_id, note
            )
        await run.emit(
            {
                "type": "tool_call_finished",
                "tool_call_id": tool_call_id,
                "name": "save_note",
                "result": {"note_id": note_id, "notes_in_conversation": count},
            }
        )
        delay = self.token_delay
        for token in tokens_for(run.content):
            await run.text(token)
            await anyio.sleep(delay)  # the "model" thinking; a stop cancels it here
        await run.write_message(answer_for(run.content))


agent = DemoAgent()
"""The agent as ``runrow worker runrow.demo.agent:agent`` loads it (configured by env)."""
