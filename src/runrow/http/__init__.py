"""A mountable HTTP API for runrow: post messages, follow runs, stop them, in runrow's
own event format or the frontends' (the AI SDK's UI message stream, AG-UI).

:func:`create_api` returns a Starlette app that a host mounts into its own Starlette or
FastAPI app, next to its own routes. It runs on the host's connection pool and the
host's ``authenticate(request) -> user id``; it never starts workers (run them with
``runrow worker`` or a :class:`runrow.Dispatcher`). Install it with
``pip install "runrow[http]"``.

Routes (JSON; errors are ``{"error": {"code", "message"}}`` with a 4xx status):

* ``POST /v1/conversations/{conversation_id}/messages`` ``{"content"}`` -> 202, the run
  (``Idempotency-Key`` header honoured); ``GET /v1/conversations/{conversation_id}``;
  ``POST /v1/conversations/{conversation_id}/stop``.
* ``GET /v1/runs/{run_id}``, ``.../position``, ``.../events`` (SSE, ``?format=runrow|ai-sdk|ag-ui``,
  resumable with ``Last-Event-ID`` or ``?from=``), ``POST .../cancel``, ``.../retry``, ``.../input``.
* ``POST /v1/ai-sdk/chat`` and ``GET /v1/ai-sdk/chat/{chat_id}/stream``: ``useChat``'s
  default transport and its resume. ``POST /v1/ag-ui``: an AG-UI ``HttpAgent``'s endpoint.
* ``GET /openapi.json``, generated from these routes.

Other sites' pages: a body is read only when sent as ``application/json`` (415), and a
POST the browser says another site sent (``Sec-Fetch-Site``, ``Origin``) answers 403
``cross_site``, unless its origin is in ``allowed_origins``.

Ownership: a run is its enqueuer's; someone else's answers 404, exactly like an unknown
id (a run id is a secret). A conversation is its first poster's; someone else's answers
403 (its id is a name anyone may pick, and a post to it must be refused anyway).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .._names import check_schema
from ._base import Endpoints
from ._chat import ChatEndpoints
from ._conversations import ConversationRoutes
from ._errors import EXCEPTION_HANDLERS, ApiError
from ._openapi import openapi_document
from ._origin import CrossSiteGuard, checked_origins
from ._runs import RunRoutes

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Collection, Mapping

    from psycopg_pool import AsyncConnectionPool
    from starlette.requests import Request

    import runrow

__all__ = ["ApiError", "Authenticate", "ConversationExtras", "create_api"]

Authenticate: TypeAlias = "Callable[[Request], str | Awaitable[str | None] | None]"
"""The host's authentication: the request's user id, or None (the API answers 401)."""
ConversationExtras: TypeAlias = "Callable[[str], Awaitable[Mapping[str, Any]]]"
"""Adds the host's own fields to a conversation's JSON (given its id)."""

DESCRIPTION = (
    "runrow's HTTP API: post a message to start (or queue) a run, follow the run's events, "
    "stop it. Streams come in runrow's own format, the AI SDK's UI message stream or AG-UI's "
    "events, each resumable from the last event id the client saw."
)


def create_api(
    pool: AsyncConnectionPool[Any],
    *,
    authenticate: Authenticate,
    hub: runrow.NotifyHub | None = None,
    schema: str = "runrow",
    max_content_bytes: int = 16 * 1024,
    max_queued_per_conversation: int | None = 5,
    keepalive: float = 15.0,
    worker_slots: int = 1,
    conversation_extras: ConversationExtras | None = None,
    max_chat_body_bytes: int = 4 * 1024 * 1024,
    title: str = "runrow API",
    allowed_origins: Collection[str] = (),
    tree_streams: bool = False,
    read_pool: AsyncConnectionPool[Any] | None = None,
) -> Starlette:
    """The API as a Starlette app, to mount (``app.mount("/chat", create_api(...))``).

    ``pool`` is the host's (open it in the host's lifespan: a mounted app's own lifespan
    never runs). ``hub``: the process's :class:`~runrow.NotifyHub`, entered by the host,
    so streams wake on each flush (None: they poll). ``max_content_bytes`` bounds a
    message; ``max_queued_per_conversation`` sheds load with 429 and ``Retry-After``
    (None: no limit); a request body may be four times ``max_content_bytes`` plus 64 KiB,
    except the AI SDK's and AG-UI's chat POSTs (``max_chat_body_bytes``: their clients
    send the whole history; only the last message is enqueued and held to
    ``max_content_bytes``). ``keepalive``: seconds between an idle stream's comments.
    ``worker_slots``: the runs your workers take at once, for the wait estimate.
    ``tree_streams``: the AI SDK's and AG-UI's chat endpoints stream the turn's whole tree
    (its sub-agents as parts, see :mod:`runrow.protocols`) rather than its run alone; a
    tree's reads write its order down (``tail(..., tree=True)``), so this is opt-in for
    hosts whose agents spawn. ``GET /v1/runs/{id}/events?tree=true`` is always there.
    ``read_pool``: a pool on a hot standby of ``pool``'s server; the event streams read
    their events there (``tail(..., read_from=read_pool)``; a tree's stream stays on the
    primary), everything else stays on ``pool``. Give it a short ``timeout``: a standby
    that is down is noticed when a connection cannot be had.

    Against other sites' pages (cookie sign-in sends the cookie whatever page asks): a
    body is read only when sent as ``application/json`` (else 415), and a request that
    changes something (any method but GET, HEAD, OPTIONS) is refused with 403
    ``cross_site`` when the browser says another site sent it (``Sec-Fetch-Site``, else
    ``Origin``), unless its ``Origin`` is in ``allowed_origins`` (exact
    ``scheme://host[:port]`` origins, e.g. your frontend on another domain).
    """
    check_schema(schema)
    origins = checked_origins(allowed_origins)
    if max_content_bytes < 1 or keepalive <= 0 or worker_slots < 1:
        raise ValueError("max_content_bytes and worker_slots must be at least 1, keepalive positive")
    api = Endpoints(
        pool,
        authenticate=authenticate,
        hub=hub,
        schema=schema,
        max_content_bytes=max_content_bytes,
        max_queued_per_conversation=max_queued_per_conversation,
        keepalive=keepalive,
        worker_slots=worker_slots,
        conversation_extras=conversation_extras,
        max_chat_body_bytes=max_chat_body_bytes,
        tree_streams=tree_streams,
        read_pool=read_pool,
    )
    conversations, runs, chat = ConversationRoutes(api), RunRoutes(api), ChatEndpoints(api)
    routes = [
        Route("/v1/conversations/{conversation_id}/messages", conversations.post_message, methods=["POST"]),
        Route("/v1/conversations/{conversation_id}/stop", conversations.stop, methods=["POST"]),
        Route("/v1/conversations/{conversation_id}", conversations.get_conversation, methods=["GET"]),
        Route("/v1/runs/{run_id}/events", runs.events, methods=["GET"]),
        Route("/v1/runs/{run_id}/cancel", runs.cancel, methods=["POST"]),
        Route("/v1/runs/{run_id}/retry", runs.retry, methods=["POST"]),
        Route("/v1/runs/{run_id}/input", runs.provide_input, methods=["POST"]),
        Route("/v1/runs/{run_id}/position", runs.get_position, methods=["GET"]),
        Route("/v1/runs/{run_id}", runs.get_run, methods=["GET"]),
        Route("/v1/ai-sdk/chat", chat.ai_sdk_chat, methods=["POST"]),
        Route("/v1/ai-sdk/chat/{chat_id}/stream", chat.ai_sdk_resume, methods=["GET"]),
        Route("/v1/ag-ui", chat.ag_ui_run, methods=["POST"]),
    ]
    document = openapi_document(routes, title=title, description=DESCRIPTION)

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    app = Starlette(
        routes=[*routes, Route("/openapi.json", openapi, methods=["GET"], include_in_schema=False)],
        exception_handlers=EXCEPTION_HANDLERS,
        # Outermost: another site's request is refused before any route reads it.
        middleware=[Middleware(CrossSiteGuard, allowed_origins=origins)],
    )
    app.state.runrow_api = api
    return app
