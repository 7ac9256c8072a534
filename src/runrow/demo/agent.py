"""The demo's agent: a deterministic fake model with two tools. No network, no API key.

Each turn it calls the ``save_note`` tool (a visible side effect: one row in the demo's
``note`` table, journaled as ``tool_call_started`` / ``tool_call_finished``), streams a
canned answer word by word at a human pace, and writes the answer to the transcript.
So reloading the page, resuming a stream, pressing Stop and killing a worker can all be
watched happening.

**Human in the loop.** A message with the word "send" in it ("send hello to bob") asks
for the ``send_message`` tool instead, which needs the user's approval: the agent
announces the call (``tool_call_started``), then ``run.wait_for_input("approve:<call
id>", {"kind": "approval", ...})`` parks the run (status ``waiting``, no worker held)
until the host calls ``runrow.provide_input`` with ``{"approved": true}`` or ``false``
(the page's Approve and Deny buttons, through ``POST /v1/runs/{id}/input``). The run
then starts again from the top and replays to the wait: everything before it is
deterministic (the call id comes from the run id), and the approved send runs once, as
a durable ``run.step``. Nobody answering within ``RUNROW_DEMO_APPROVAL_TIMEOUT`` seconds
(default 600; 0: no limit) ends the run ``expired``.

**Steering.** A message sent with ``on_busy="steer"`` (the page's "steer" box) while a
turn streams is read by that turn: the fake model calls ``run.steering()`` every
:data:`STEER_EVERY` words and once before it writes its answer, and for each message it
read says so in its answer (:func:`steered_note_for`), where it read it. The message's
own turn ends ``absorbed``; a message the turn did not read runs as the next turn.

**Research.** "research tides" fans out to three sub-agents: :mod:`runrow.demo.research`.

**A real model.** With ``RUNROW_DEMO_OPENAI_BASE_URL`` set (any OpenAI-compatible server:
OpenAI, vLLM, Ollama, LiteLLM, ...), the agent answers through
:mod:`runrow.adapters.openai` instead: the conversation's transcript goes to
``RUNROW_DEMO_OPENAI_MODEL`` (default ``gpt-4.1-mini``) with ``OPENAI_API_KEY`` (if set),
the model's text streams into the journal as it comes, and it may call ``save_note``
(journaled the same way). It needs the ``openai`` package (``pip install runrow[openai]``).
Without the variable, the fake model answers, as described above.

Pace: ``RUNROW_DEMO_TOKEN_DELAY`` seconds per word (default 0.08; tests use less).
Run it in a worker of your own with ``runrow worker runrow.demo.agent:agent`` (it finds
the database through ``DATABASE_URL`` and the schema through ``RUNROW_DEMO_SCHEMA``).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import TYPE_CHECKING, Any, cast

import anyio
from psycopg import AsyncConnection

from . import research, store

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionFunctionToolParam

    from runrow import RunContext

__all__ = [
    "SEND_TOOL",
    "DemoAgent",
    "agent",
    "answer_for",
    "approval_answer_for",
    "needs_approval",
    "researcher",
    "send_arguments",
    "steered_note_for",
    "tokens_for",
]

DEFAULT_TOKEN_DELAY = 0.08
STEER_EVERY = 6
"""The fake model reads steering messages every this many words (and before it answers)."""
DEFAULT_APPROVAL_TIMEOUT = 600.0
SEND_TOOL = "send_message"
"""The tool that needs the user's approval."""

OPENAI_BASE_URL_ENV = "RUNROW_DEMO_OPENAI_BASE_URL"
"""Set to an OpenAI-compatible server's base URL to answer with a real model."""
OPENAI_MODEL_ENV = "RUNROW_DEMO_OPENAI_MODEL"
DEFAULT_OPENAI_MODEL = "gpt-4.1-mini"
_OPENAI_MAX_TURNS = 6
_OPENAI_INSTRUCTIONS = (
    "You are the assistant in runrow's demo. Answer briefly. When the user tells you something "
    "worth remembering, save it with the save_note tool."
)
_SAVE_NOTE_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "save_note",
        "description": "Saves a short note in this conversation's list of notes.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "description": "the note, at most 200 characters"}},
            "required": ["text"],
        },
    },
}


def _unknown_tool(name: str) -> Any:
    def fail(**_: Any) -> None:
        raise LookupError(f"no tool named {name!r}")

    return fail


_SEND = re.compile(r"\bsend\b", re.IGNORECASE)
_TO = re.compile(r"\bto\s+((?:the\s+)?[A-Za-z0-9_.@+-]{1,64})", re.IGNORECASE)

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


def tokens_for(content: object, approved: bool | None = None) -> list[str]:
    """The answer split into the deltas the model streams (they join back to the answer);
    ``approved`` for a message that needs approval (see :func:`approval_answer_for`)."""
    answer = answer_for(content) if approved is None else approval_answer_for(content, approved)
    words = answer.split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]]


def steered_note_for(content: object) -> str:
    """What the fake model streams when it reads a steering message ``content``."""
    said = " ".join(_text_of(content).split())
    if len(said) > 60:
        said = said[:57] + "..."
    return f'[You added "{said}" while I was answering: noted.] '


def needs_approval(content: object) -> bool:
    """Whether the fake model answers ``content`` with a call that needs approval: the
    message has the word "send" in it."""
    return _SEND.search(_text_of(content)) is not None


def send_arguments(content: object) -> dict[str, str]:
    """The ``send_message`` call's arguments for ``content``: ``to`` (the word after the
    first "to" that follows "send", else "the team") and ``text`` (the message, at most
    200 characters)."""
    text = " ".join(_text_of(content).split())
    send = _SEND.search(text)
    to = _TO.search(text, send.end() if send else 0)
    return {"to": to.group(1) if to else "the team", "text": text[:200]}


def approval_answer_for(content: object, approved: bool) -> str:
    """The answer to a message that needed approval, once it was given or refused."""
    to = send_arguments(content)["to"]
    if approved:
        return (
            f"Done: I sent your message to {to}. You approved the {SEND_TOOL} call, and it ran "
            "once, as a durable step, after the run had waited for you without holding a worker."
        )
    return (
        f"I did not send anything: you denied the {SEND_TOOL} call to {to}. The run waited "
        "for your answer without holding a worker, and nothing was sent."
    )


class DemoAgent:
    """The agent callable. ``conninfo`` is where the tool writes its note (default
    ``DATABASE_URL``); ``token_delay`` is seconds per streamed word (default
    ``RUNROW_DEMO_TOKEN_DELAY`` or 0.08); ``approval_timeout`` is how long a run waits
    for the user's approval, in seconds (default ``RUNROW_DEMO_APPROVAL_TIMEOUT`` or 600;
    0 or less: no limit)."""

    def __init__(
        self,
        conninfo: str | None = None,
        *,
        schema: str | None = None,
        demo_schema: str | None = None,
        token_delay: float | None = None,
        approval_timeout: float | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._schema = schema
        self._demo_schema = demo_schema
        self._token_delay = token_delay
        self._approval_timeout = approval_timeout

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

    @property
    def approval_timeout(self) -> float | None:
        timeout = self._approval_timeout
        if timeout is None:
            timeout = float(os.environ.get("RUNROW_DEMO_APPROVAL_TIMEOUT", DEFAULT_APPROVAL_TIMEOUT))
        return timeout if timeout > 0 else None

    async def __call__(self, run: RunContext) -> None:
        base_url = os.environ.get(OPENAI_BASE_URL_ENV)
        if base_url:
            await self._answer_with_openai(run, base_url)
            return
        topic = research.research_topic(run.content)
        if topic is not None:  # "research <topic>": three sub-agents (see runrow.demo.research)
            await research.research(run, topic, self.token_delay)
            return
        approved: bool | None = None
        if needs_approval(run.content):
            approved = await self._send_with_approval(run)
        else:
            await self._save_note(run)
        delay = self.token_delay
        answer: list[str] = []
        for i, token in enumerate(tokens_for(run.content, approved)):
            if i and i % STEER_EVERY == 0:
                answer += await self._steered(run)  # a step boundary: the model reads what came in
            await run.text(token)
            answer.append(token)
            await anyio.sleep(delay)  # the "model" thinking; a stop cancels it here
        answer += await self._steered(run, " ")  # (read before answering: after the last word)
        await run.write_message("".join(answer).rstrip())

    async def _steered(self, run: RunContext, lead: str = "") -> list[str]:
        """Reads the steering messages that came in (a recorded delivery) and streams a note
        for each (after ``lead``, if any); what it streamed, for the answer."""
        notes = [steered_note_for(m.content) for m in await run.steering()]
        said = [lead, *notes] if notes and lead else notes
        for part in said:
            await run.text(part)
        return said

    async def _answer_with_openai(self, run: RunContext, base_url: str) -> None:
        """Answers through an OpenAI-compatible server, offering the ``save_note`` tool."""
        from openai import AsyncOpenAI

        from runrow.adapters.openai import call_tool, stream_chat_completion

        async def save_note(text: str) -> dict[str, Any]:
            async with await AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
                note_id, count = await store.record_note(
                    conn, self.demo_schema, run.run_id, run.conversation_id, run.user_id, text[:200]
                )
            return {"note_id": note_id, "notes_in_conversation": count}

        model = os.environ.get(OPENAI_MODEL_ENV) or DEFAULT_OPENAI_MODEL
        tools = [cast("ChatCompletionFunctionToolParam", _SAVE_NOTE_SPEC)]
        messages: list[Any] = [{"role": "system", "content": _OPENAI_INSTRUCTIONS}]
        messages += [
            {"role": m.role, "content": _text_of(m.content)}
            for m in await run.transcript()
            if m.role in ("user", "assistant")
        ]
        api_key = os.environ.get("OPENAI_API_KEY") or "not-needed"
        async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
            for _ in range(_OPENAI_MAX_TURNS):
                # Steering messages sent since the last model call join the conversation here.
                messages += [{"role": "user", "content": _text_of(m.content)} for m in await run.steering()]
                stream = await client.chat.completions.create(
                    model=model, messages=messages, tools=tools, stream=True
                )
                turn = await stream_chat_completion(run, stream)
                messages.append(turn.message)
                if not turn.tool_calls:
                    await run.write_message(turn.text)
                    return
                for call in turn.tool_calls:
                    if call.name == "save_note":
                        messages.append(await call_tool(run, call, save_note))
                    else:
                        messages.append(await call_tool(run, call, _unknown_tool(call.name)))
        raise RuntimeError(f"the model was still calling tools after {_OPENAI_MAX_TURNS} turns")

    async def _save_note(self, run: RunContext) -> None:
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

    async def _send_with_approval(self, run: RunContext) -> bool:
        """Announces the send, waits for the user's decision, sends if approved.

        Runs again from the top once the decision arrives: everything up to the wait is
        deterministic (the call id is made from the run id; the repeated emit is dropped,
        it is in the journal already), and the send itself is a step, so it runs once.
        """
        args = send_arguments(run.content)
        tool_call_id = f"call_{uuid.uuid5(run.run_id, SEND_TOOL).hex[:12]}"
        await run.emit(
            {
                "type": "tool_call_started",
                "tool_call_id": tool_call_id,
                "name": SEND_TOOL,
                "arguments": args,
                "needs_approval": True,
            }
        )
        decision = await run.wait_for_input(
            f"approve:{tool_call_id}",
            {
                "kind": "approval",
                "tool": SEND_TOOL,
                "tool_call_id": tool_call_id,
                "args": args,
                "prompt": f"Send this message to {args['to']}?",
            },
            timeout=self.approval_timeout,
        )
        approved = isinstance(decision, dict) and decision.get("approved") is True
        if approved:
            result = await run.step(SEND_TOOL, self._send, run.run_id, run.conversation_id, run.user_id, args)
        else:
            result = {"sent": False, "reason": "denied"}
        await run.emit(
            {
                "type": "tool_call_finished",
                "tool_call_id": tool_call_id,
                "name": SEND_TOOL,
                "ok": approved,
                "result": result,
            }
        )
        return approved

    async def _send(
        self, run_id: uuid.UUID, conversation_id: str, user_id: str, args: dict[str, str]
    ) -> dict[str, Any]:
        """The "send": a note in the demo's table, shown in the page's list of notes."""
        async with await AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            note_id, count = await store.record_note(
                conn,
                self.demo_schema,
                run_id,
                conversation_id,
                user_id,
                f"sent to {args['to']}: {args['text']}",
            )
        return {"sent": True, "to": args["to"], "note_id": note_id, "notes_in_conversation": count}

    async def researcher(self, run: RunContext) -> None:
        """The research turn's sub-agent (agent key ``researcher``; see :mod:`.research`)."""
        await research.researcher(run, self.token_delay)


agent = DemoAgent()
"""The agent as ``runrow worker runrow.demo.agent:agent`` loads it (configured by env)."""
researcher = agent.researcher
"""Its sub-agent, as ``runrow worker ... --agent researcher=runrow.demo.agent:researcher``."""
