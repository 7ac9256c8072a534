"""The API's shared state and helpers: the host's pool, hub and ``authenticate``, the
limits, ownership checks, the body reader and the enqueue every posting route uses."""

from __future__ import annotations

import inspect
import json
import re
from typing import TYPE_CHECKING, Any

import runrow

from .._enqueue import _conversation_lock
from .._gateway import _exec, reads, submit
from ._errors import ApiError, not_found, not_yours
from ._openapi import error, json_response

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool
    from starlette.requests import Request

    from .._enqueue_options import OnBusy

__all__ = [
    "MAX_IDEMPOTENCY_KEY",
    "MAX_INPUT_KEY",
    "NOT_YOURS",
    "RUN_404",
    "STOP",
    "UNAUTHORIZED",
    "Endpoints",
    "checked_conversation_id",
]

_CONVERSATION = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_INPUT_KEY = 200
MAX_IDEMPOTENCY_KEY = 200

RUN_404 = error("Unknown, or another user's (the two are indistinguishable)")
NOT_YOURS = error("`forbidden`: the conversation belongs to another user")
UNAUTHORIZED = error("`unauthorized`: authenticate() found no user")
STOP = json_response("StopResult", "What the stop did")


class Endpoints:
    """The endpoints' shared state: the host's pool, hub and ``authenticate``, and the limits."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        authenticate: Callable[[Request], str | Awaitable[str | None] | None],
        hub: runrow.NotifyHub | None,
        schema: str,
        max_content_bytes: int,
        max_queued_per_conversation: int | None,
        keepalive: float,
        worker_slots: int,
        conversation_extras: Callable[[str], Awaitable[Mapping[str, Any]]] | None,
        max_chat_body_bytes: int,
        tree_streams: bool = False,
        read_pool: AsyncConnectionPool[Any] | None = None,
    ) -> None:
        self.pool = pool
        self.read_pool = read_pool
        self.authenticate = authenticate
        self.hub = hub
        self.schema = schema
        self.max_content_bytes = max_content_bytes
        self.max_queued_per_conversation = max_queued_per_conversation
        self.max_body_bytes = 4 * max_content_bytes + 64 * 1024
        self.keepalive = keepalive
        self.worker_slots = worker_slots
        self.conversation_extras = conversation_extras
        self.tree_streams = tree_streams
        # The frontends' transports send the whole history with each message.
        self.max_chat_body_bytes = max(max_chat_body_bytes, self.max_body_bytes)

    # -- helpers ------------------------------------------------------------------------

    async def user(self, request: Request) -> str:
        """The caller's user id, or 401."""
        user = self.authenticate(request)
        if inspect.isawaitable(user):
            user = await user
        if user is None:
            raise ApiError(401, "unauthorized", "authentication required", {"WWW-Authenticate": "Bearer"})
        if not isinstance(user, str) or not user:
            raise TypeError(f"authenticate() must return a non-empty str or None, got {user!r}")
        return user

    @staticmethod
    def conversation_id(request: Request, name: str = "conversation_id") -> str:
        return checked_conversation_id(request.path_params[name])

    @staticmethod
    def base(request: Request) -> str:
        """Where the API is mounted (its URLs in answers are absolute paths)."""
        return str(request.scope.get("root_path", "")).rstrip("/")

    async def own_run(self, request: Request, user: str) -> runrow.RunInfo:
        try:
            info = await runrow.get_run(self.pool, request.path_params["run_id"], schema=self.schema)
        except runrow.RunNotFound:
            raise not_found() from None
        if info.user_id != user:
            raise not_found()  # someone else's run looks exactly like no run
        return info

    async def own_conversation(self, cid: str, user: str) -> str | None:
        """The owner: ``user``, or None if nobody has posted yet; 403 if someone else."""
        async with self.pool.connection() as conn:
            owner = await _exec.run(conn, reads.conversation_owner(self.schema, conversation_id=cid))
        if owner not in (None, user):
            raise not_yours(cid)
        return owner

    async def json_body(self, request: Request, limit: int | None = None) -> dict[str, Any]:
        """The request's JSON object, refused (413) while it is read once past ``limit``
        bytes (default: the API's body limit); 415 unless it is sent as JSON."""
        if not _is_json(request.headers.get("content-type")):
            # A form (text/plain, urlencoded, multipart) is what another site's page can
            # post without the browser asking first: a body must say it is JSON.
            raise ApiError(
                415, "unsupported_media_type", "the body must be sent as Content-Type: application/json"
            )
        limit = limit or self.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (
            not (declared.isascii() and declared.isdigit()) or int(declared) > limit
        ):
            raise ApiError(413, "too_large", f"the body must be at most {limit} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ApiError(413, "too_large", f"the body must be at most {limit} bytes")
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "bad_json", "the body must be a JSON object") from None
        except RecursionError:  # deep nesting, within the size limit
            raise ApiError(400, "bad_json", "the body is nested too deeply") from None
        if not isinstance(data, dict):
            raise ApiError(400, "bad_json", "the body must be a JSON object")
        return data

    async def submit(
        self,
        conn: AsyncConnection,
        user: str,
        cid: str,
        content: Any,
        key: str | None,
        on_busy: OnBusy = "enqueue",
    ) -> runrow.Run:
        """Enqueues a turn for ``user`` in ``cid``, in ``conn``'s open transaction
        (``on_busy``: ``enqueue`` or ``steer``, see :func:`on_busy_of`).

        The conversation's advisory lock (the one enqueue takes again) comes first, so
        two first posts by different users cannot both find the conversation unowned.
        """
        await _exec.run(
            conn,
            submit.admission_lock(
                self.schema, tenant_lock=None, conversation_lock=_conversation_lock(self.schema, cid)
            ),
        )
        owner = await _exec.run(conn, reads.conversation_owner(self.schema, conversation_id=cid))
        if owner not in (None, user):
            raise not_yours(cid)
        try:
            return await runrow.enqueue(
                conn,
                conversation_id=cid,
                user_id=user,
                content=content,
                idempotency_key=key,
                on_busy=on_busy,
                schema=self.schema,
                max_content_bytes=self.max_content_bytes,
                # Load shedding: a conversation may have this many turns waiting.
                max_queued_per_conversation=self.max_queued_per_conversation,
            )
        except runrow.Overloaded as exc:
            raise ApiError(429, "overloaded", str(exc), {"Retry-After": str(exc.retry_after)}) from None

    # -- routes -------------------------------------------------------------------------


STEER_POLICIES = ("enqueue", "steer")
"""The double-texting policies a client may ask for (``on_busy`` in a post's body): queue
the message as the next turn, or steer the running turn with it (docs/howto/steering.md).
``reject`` and ``interrupt`` stay the host's to choose."""


def on_busy_of(data: dict[str, Any]) -> OnBusy:
    """The body's ``on_busy`` (default ``enqueue``); 422 for any other value."""
    value = data.get("on_busy", "enqueue")
    if value == "steer":
        return "steer"
    if value != "enqueue":
        raise ApiError(422, "invalid_input", "on_busy must be 'enqueue' or 'steer'")
    return "enqueue"


def _is_json(content_type: str | None) -> bool:
    """``application/json`` or an ``application/...+json`` type, any parameters."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def checked_conversation_id(cid: object) -> str:
    """``cid`` if it is a valid conversation id, else 400."""
    if not isinstance(cid, str) or not _CONVERSATION.fullmatch(cid):
        raise ApiError(400, "bad_conversation_id", "conversation ids are 1-128 of A-Z a-z 0-9 _ . : -")
    return cid
