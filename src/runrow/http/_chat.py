"""The frontends' own chat endpoints: the AI SDK's (``useChat``'s default transport and its
resume) and AG-UI's (``HttpAgent``).

Each takes the protocol's request, enqueues its last user message as a turn of the
conversation the protocol names (the AI SDK's chat ``id``, AG-UI's ``threadId``), and
answers with that run's stream in the protocol's format. The message's id (AI SDK) or
the run's id (AG-UI) is the idempotency key, so a client's retry of the same request
streams the same run instead of queueing a second turn.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from starlette.responses import Response

import runrow

from .. import _json
from .._status import QUEUED, RUNNING, WAITING
from ..protocols import Cursor
from . import _streams
from ._base import STEER_POLICIES, Endpoints, checked_conversation_id, on_busy_of
from ._errors import ApiError
from ._openapi import Doc, documented, error

if TYPE_CHECKING:
    from starlette.requests import Request

    from .._enqueue_options import OnBusy

__all__ = ["ChatEndpoints", "client_key"]

MAX_CLIENT_ID = 200
MAX_KEY = 256  # runrow's idempotency keys (enqueue refuses longer ones)
MAX_QUEUED_SCAN = 1000  # past this many queued turns, the oldest of the newest 1000
_STREAM = {
    "description": "The run's stream in the protocol's format (header `x-runrow-run-id` names the run)",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}
_COMMON = {
    "400": error("Malformed body or ids"),
    "401": error("`unauthorized`: authenticate() found no user"),
    "403": error("`forbidden`: the conversation belongs to another user"),
    "413": error("`too_large`: the body (the whole history) or the last message is over its limit"),
    "422": error("The last message is not the user's, or has no text"),
    "429": error("Too many turns already waiting in this conversation (see Retry-After)"),
}


def _text_of(content: Any) -> str:
    """The text of a message's content: a string, or a list of parts of type ``text``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
    return ""


def _last_user_message(messages: Any) -> tuple[str | None, str]:
    """The id and text of the last message, which must be the user's; 422 otherwise.

    Each user message is answered once. A request whose last message is the assistant's
    or a tool's (a client re-running after a tool result) would otherwise enqueue the
    previous question again as a new turn.
    """
    if not isinstance(messages, list):
        raise ApiError(422, "invalid_input", "messages must be a list")
    last = messages[-1] if messages else None
    if not isinstance(last, dict) or last.get("role") != "user":
        raise ApiError(422, "invalid_input", "the last message must be the user's: each one is answered once")
    text = _text_of(last.get("parts", last.get("content")))
    if not text.strip():
        raise ApiError(422, "invalid_input", "the last user message must have some text")
    mid = last.get("id")
    return (mid if isinstance(mid, str) and 0 < len(mid) <= MAX_CLIENT_ID else None), text


def client_key(protocol: str, cid: str, kind: str | None, client_id: str) -> str:
    """The idempotency key of a client's message or run id in conversation ``cid``.

    ``protocol:cid:[kind:]client_id`` as long as that names one (cid, kind, id) alone and
    fits runrow's limit: the key a request had before keeps finding its run. A cid with a
    colon could split two ways ("a:b" + "c", "a" + "b:c"), and a long or odd id (NUL, a
    lone surrogate) would not fit: those get ``protocol#`` and the SHA-256 of the three,
    which the readable form never starts with.
    """
    parts = [cid] if kind is None else [cid, kind]
    plain = ":".join([protocol, *parts, client_id])
    if ":" not in cid:
        try:
            _json.check_id(plain, "idempotency_key", max_len=MAX_KEY)  # what enqueue checks
            return plain
        except runrow.InvalidInput:
            pass
    exact = json.dumps([*parts, client_id]).encode()  # ASCII: surrogates are escaped
    return f"{protocol}#{hashlib.sha256(exact).hexdigest()}"


class ChatEndpoints:
    """The AI SDK's and AG-UI's endpoints, on the same state as the rest of the API."""

    def __init__(self, api: Endpoints) -> None:
        self.api = api

    async def _active_run(self, cid: str) -> runrow.RunInfo | None:
        """The run streaming for ``cid``: the running or waiting one (at most one: the
        schema lets a conversation have one turn at a time), else the next queued."""
        api = self.api
        for status in (RUNNING, WAITING):
            runs = await runrow.list_runs(
                api.pool, conversation_id=cid, status=status, limit=1, schema=api.schema
            )
            if runs:
                return runs[0]
        queued = await runrow.list_runs(
            api.pool, conversation_id=cid, status=QUEUED, limit=MAX_QUEUED_SCAN, schema=api.schema
        )
        return queued[-1] if queued else None  # newest first: the last is the next to run

    async def _start(
        self, request: Request, fmt: str, cid: str, text: str, key: str | None, on_busy: OnBusy = "enqueue"
    ) -> Response:
        api = self.api
        user = await api.user(request)
        async with api.pool.connection() as conn, conn.transaction():
            run = await api.submit(conn, user, cid, text, key, on_busy)
        info = await runrow.get_run(api.pool, run.id, schema=api.schema)
        response = await _streams.stream_run(
            api.pool,
            info,
            fmt=fmt,
            cursor=Cursor(0),
            hub=api.hub,
            keepalive=api.keepalive,
            schema=api.schema,
            read_from=api.read_pool,
            tree=api.tree_streams,
        )
        response.headers["x-runrow-run-id"] = str(run.id)
        return response

    @documented(
        Doc(
            summary="AI SDK: send the chat's last user message and stream the answer",
            description=(
                "The endpoint `useChat`'s DefaultChatTransport posts to: `{id, messages, trigger}`. "
                "`id` is the conversation; the last user message's text is enqueued (its `id` is "
                "the idempotency key) and the run streams as the UI message stream v1."
            ),
            tags=("ai-sdk",),
            body={
                "type": "object",
                "required": ["id", "messages"],
                "properties": {
                    "id": {"type": "string"},
                    "messages": {"type": "array", "items": {"type": "object"}},
                    "trigger": {"enum": ["submit-message"]},
                    "on_busy": {
                        "enum": list(STEER_POLICIES),
                        "description": "`steer`: deliver the message into the running turn (see "
                        "POST /v1/conversations/{conversation_id}/messages); its stream then ends with "
                        "a `data-runrow-absorbed` part naming the run that read it",
                    },
                },
            },
            responses={"200": _STREAM, **_COMMON},
        )
    )
    async def ai_sdk_chat(self, request: Request) -> Response:
        await self.api.user(request)  # 401 before the body is read
        data = await self.api.json_body(request, self.api.max_chat_body_bytes)
        cid = checked_conversation_id(data.get("id"))
        trigger = data.get("trigger", "submit-message")
        if trigger != "submit-message":
            raise ApiError(
                422,
                "unsupported_trigger",
                "only submit-message: retry a run with POST /v1/runs/{run_id}/retry",
            )
        mid, text = _last_user_message(data.get("messages"))
        # The message's id, per conversation: a transport's retry finds the same run.
        key = None if mid is None else client_key("ai-sdk", cid, None, mid)
        return await self._start(request, "ai-sdk", cid, text, key, on_busy_of(data))

    @documented(
        Doc(
            summary="AI SDK: reattach to the chat's active stream",
            description=(
                "What DefaultChatTransport's `reconnectToStream` asks for: the stream of the "
                "conversation's active run (the one running or waiting, else the first queued), "
                "from its start. 204 when no run is active."
            ),
            tags=("ai-sdk",),
            responses={
                "200": _STREAM,
                "204": {"description": "Nothing is active in this conversation"},
                "401": _COMMON["401"],
                "403": _COMMON["403"],
            },
        )
    )
    async def ai_sdk_resume(self, request: Request) -> Response:
        api = self.api
        user = await api.user(request)
        cid = api.conversation_id(request, "chat_id")
        if await api.own_conversation(cid, user) is None:
            return _no_content()
        info = await self._active_run(cid)
        if info is None:
            return _no_content()
        response = await _streams.stream_run(
            api.pool,
            info,
            fmt="ai-sdk",
            cursor=Cursor(0),
            hub=api.hub,
            keepalive=api.keepalive,
            schema=api.schema,
            read_from=api.read_pool,
            tree=api.tree_streams and info.root_run_id is None,
        )
        response.headers["x-runrow-run-id"] = str(info.id)
        return response

    @documented(
        Doc(
            summary="AG-UI: run the agent on the thread's last user message and stream its events",
            description=(
                "The endpoint an AG-UI `HttpAgent` posts its `RunAgentInput` to. `threadId` is the "
                "conversation; the last user message is enqueued (`runId` is the idempotency key) "
                "and the run streams as AG-UI events."
            ),
            tags=("ag-ui",),
            body={
                "type": "object",
                "required": ["threadId", "runId", "messages"],
                "properties": {
                    "threadId": {"type": "string"},
                    "runId": {"type": "string"},
                    "messages": {"type": "array", "items": {"type": "object"}},
                },
            },
            responses={"200": _STREAM, **_COMMON},
        )
    )
    async def ag_ui_run(self, request: Request) -> Response:
        await self.api.user(request)  # 401 before the body is read
        data = await self.api.json_body(request, self.api.max_chat_body_bytes)
        cid = checked_conversation_id(data.get("threadId"))
        client_run = data.get("runId")
        if not isinstance(client_run, str) or not 0 < len(client_run) <= MAX_CLIENT_ID:
            raise ApiError(400, "bad_run_id", f"runId must be a string of 1-{MAX_CLIENT_ID} characters")
        mid, text = _last_user_message(data.get("messages"))
        # The user message's id when it has one (a new run of the same question is the
        # same turn), else the client's run id.
        key = (
            client_key("ag-ui", cid, "message", mid)
            if mid is not None
            else client_key("ag-ui", cid, "run", client_run)
        )
        return await self._start(request, "ag-ui", cid, text, key)


def _no_content() -> Response:
    return Response(status_code=204, headers={"Cache-Control": "no-store"})
