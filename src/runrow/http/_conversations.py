"""The routes of a conversation: post a message, read it, stop it."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from starlette.responses import JSONResponse, Response

import runrow

from . import _turns
from ._base import MAX_IDEMPOTENCY_KEY, NOT_YOURS, STEER_POLICIES, STOP, UNAUTHORIZED, Endpoints, on_busy_of
from ._errors import ApiError
from ._openapi import Doc, documented, error, json_response

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["ConversationRoutes"]


class ConversationRoutes:
    """``/v1/conversations/{conversation_id}`` and below."""

    def __init__(self, api: Endpoints) -> None:
        self.api = api

    @documented(
        Doc(
            summary="Post a user message; starts (or queues) a run",
            tags=("conversations",),
            parameters=(
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "description": "a repeat with the same key returns the first run",
                    "schema": {"type": "string", "maxLength": MAX_IDEMPOTENCY_KEY},
                },
            ),
            body={
                "type": "object",
                "required": ["content"],
                "properties": {
                    "content": {"type": "string", "minLength": 1},
                    "on_busy": {
                        "enum": list(STEER_POLICIES),
                        "description": "while a turn runs or is queued: `enqueue` (default) queues "
                        "this one after it; `steer` delivers it into the running turn where its agent "
                        "reads steering messages (the run is then `absorbed`; its terminal event names "
                        "the run that read it), else it runs as the next turn",
                    },
                },
            },
            responses={
                "202": json_response(
                    "Accepted", "The run (the first one again for a repeated Idempotency-Key)"
                ),
                "400": error("Malformed body, conversation id or key"),
                "401": UNAUTHORIZED,
                "403": NOT_YOURS,
                "409": error("The Idempotency-Key was already used for another message"),
                "413": error("`too_large`: the body or its content is over its size limit"),
                "422": error("Content missing or not text"),
                "429": error("Too many turns already waiting in this conversation (see Retry-After)"),
            },
        )
    )
    async def post_message(self, request: Request) -> Response:
        user = await self.api.user(request)
        cid = self.api.conversation_id(request)
        data = await self.api.json_body(request)
        content = data.get("content")
        if not isinstance(content, str) or not content.strip():
            raise ApiError(422, "invalid_input", "content must be a non-empty string")
        on_busy = on_busy_of(data)
        key = request.headers.get("idempotency-key")
        if key is not None and not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY:
            raise ApiError(400, "bad_idempotency_key", "Idempotency-Key must be 1-200 characters")
        async with self.api.pool.connection() as conn, conn.transaction():
            run = await self.api.submit(conn, user, cid, content, key, on_busy)
        return _turns.accepted(run, self.api.base(request))

    @documented(
        Doc(
            summary="Transcript and turns (runs with their messages, tool calls and inputs)",
            tags=("conversations",),
            responses={
                "200": json_response(
                    "Conversation",
                    "The conversation. `owner` is null (and the lists empty) while nobody has posted "
                    "to it: the first message makes it the poster's. A finished turn's `tool_calls` "
                    "lists its calls (`uncertain`: started, never finished, its worker lost); a live "
                    "turn's is null (they stream).",
                ),
                "401": UNAUTHORIZED,
                "403": NOT_YOURS,
            },
        )
    )
    async def get_conversation(self, request: Request) -> Response:
        user = await self.api.user(request)
        cid = self.api.conversation_id(request)
        owner = await self.api.own_conversation(cid, user)
        extras = {} if self.api.conversation_extras is None else dict(await self.api.conversation_extras(cid))
        if owner is None:  # nobody has posted yet: empty, not missing
            return JSONResponse(
                {"conversation_id": cid, "owner": None, "turns": [], "messages": [], **extras}
            )
        messages = await runrow.transcript(self.api.pool, cid, schema=self.api.schema)
        runs = await runrow.list_runs(self.api.pool, conversation_id=cid, limit=500, schema=self.api.schema)
        by_id = {m.id: m for m in messages}
        answers = {m.run_id: m for m in messages if m.role == "assistant" and m.run_id is not None}
        turns = []
        base = self.api.base(request)
        for r in reversed(runs):  # oldest first
            asked = by_id.get(r.user_message_id)
            answer = answers.get(r.id)
            # A live turn's calls and inputs arrive on its stream; a finished one's are read here.
            journal = (
                await _turns.turn_journal(self.api.pool, r.id, schema=self.api.schema) if r.terminal else None
            )
            turns.append(
                {
                    "run": _turns.run_json(r, base),
                    "user_message": None if asked is None else asked.content,
                    "answer": None
                    if answer is None
                    else {"content": answer.content, "status": answer.status},
                    "tool_calls": None if journal is None else journal["tool_calls"],
                    "inputs": None if journal is None else journal["inputs"],
                }
            )
        return JSONResponse(
            {
                "conversation_id": cid,
                "owner": owner,
                "turns": turns,
                "messages": [_turns.jsonable(asdict(m)) for m in messages],
                **extras,
            }
        )

    @documented(
        Doc(
            summary="Stop every active turn; queued messages come back as drafts",
            tags=("conversations",),
            responses={"200": STOP, "401": UNAUTHORIZED, "403": NOT_YOURS},
        )
    )
    async def stop(self, request: Request) -> Response:
        user = await self.api.user(request)
        cid = self.api.conversation_id(request)
        if await self.api.own_conversation(cid, user) is None:
            # Nobody has posted: nothing to stop. Stopping anyway could cancel a first
            # post by someone else committing meanwhile (and hand its drafts to us).
            return JSONResponse({"noop": True, "cancelled": [], "cancel_requested": [], "drafts": []})
        result = await runrow.stop_conversation(self.api.pool, cid, schema=self.api.schema)
        return JSONResponse(_turns.stop_json(result))
